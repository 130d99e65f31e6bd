#!/usr/bin/env node
'use strict'
// `acquireSync` on a warm key through two builds of this package, side by
// side in one process: interleaved rounds, min and median ns per call each.
//
//   node bench/compare.js DIR_A DIR_B [--rounds 9] [--apart]
//
// With --apart each round of each build runs in a process of its own
// (alternating A, B, A, B ...): the JIT then sees one build's call only.
// scripts/bench-node-baseline.sh REV builds DIR_A from a revision.

const { options } = require('./harness')

const args = process.argv.slice(2)
const opt = options(args)
const ROUNDS = Number(opt('--rounds', 9))
// (the options with a value: --rounds N, --one DIR)
const dirs = args.filter((a, i) => !a.startsWith('--') && !(i > 0 && ['--rounds', '--one'].includes(args[i - 1])))
if (dirs.length < 2 && !args.includes('--one')) {
  console.error('usage: node bench/compare.js DIR_A DIR_B [--rounds 9] [--apart]')
  process.exit(2)
}

const KEY = 'user:42'
const N = 2e6

/** A limiter of the build in `dir`, its key `KEY` warm (a local lease). */
function warmLimiter(dir) {
  const { Limiter } = require(require('node:path').resolve(dir))
  const l = new Limiter({ limit: 1e9, windowMs: 1000, leaseSize: 1e6 })
  if (!l.acquireSync(KEY).allowed) throw new Error(`${dir}: the warm-up request was denied`)
  return l
}

// One round of one build, in this process: `--one DIR` prints ns per call.
const one = opt('--one', null)
if (one !== null) {
  const l = warmLimiter(one)
  // A first pass lets the JIT compile the loop; the second is timed.
  let ns = 0
  for (let pass = 0; pass < 2; pass++) {
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < N; i++) l.acquireSync(KEY)
    ns = Number(process.hrtime.bigint() - t0) / N
  }
  console.log(ns)
  process.exit(0)
}

if (args.includes('--apart')) {
  const { execFileSync } = require('node:child_process')
  const ns = dirs.map(() => [])
  for (let r = 0; r < ROUNDS; r++) {
    dirs.forEach((dir, i) => ns[i].push(Number(execFileSync(process.execPath, [__filename, '--one', dir], { encoding: 'utf8' }))))
  }
  report(dirs.map((dir, i) => ({ dir, ns: ns[i] })), 'a process a round')
  process.exit(0)
}

function report(contestants, how) {
  for (const c of contestants) {
    c.ns.sort((a, b) => a - b)
    console.log(`${c.dir}: acquireSync min ${c.ns[0].toFixed(1)} ns, median ${c.ns[c.ns.length >> 1].toFixed(1)} ns (${ROUNDS} rounds of ${N}, ${how})`)
  }
  const [a, b] = contestants
  console.log(`ratio (median): ${(b.ns[b.ns.length >> 1] / a.ns[a.ns.length >> 1]).toFixed(2)}`)
}

const contestants = dirs.map((dir) => {
  const l = warmLimiter(dir)
  return { dir, call: () => l.acquireSync(KEY), ns: [] }
})
for (let r = 0; r < ROUNDS; r++) {
  for (const c of contestants) {
    const f = c.call
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < N; i++) f()
    c.ns.push(Number(process.hrtime.bigint() - t0) / N)
  }
}
report(contestants, 'one process, interleaved')
process.exit(0)
