#!/usr/bin/env node
'use strict'
// `acquireSync` on a warm key through two builds of this package, side by
// side in one process: interleaved rounds, min and median ns per call each.
//
//   node bench/compare.js DIR_A DIR_B [--rounds 9]
//
// scripts/bench-node-baseline.sh REV builds DIR_A from a revision.

const { options } = require('./harness')

const args = process.argv.slice(2)
const opt = options(args)
const ROUNDS = Number(opt('--rounds', 9))
const dirs = args.filter((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--')))
if (dirs.length < 2) {
  console.error('usage: node bench/compare.js DIR_A DIR_B [--rounds 9]')
  process.exit(2)
}

const KEY = 'user:42'
const N = 2e6
const contestants = dirs.map((dir) => {
  const { Limiter } = require(require('node:path').resolve(dir))
  const l = new Limiter({ limit: 1e9, windowMs: 1000, leaseSize: 1e6 })
  if (!l.acquireSync(KEY).allowed) throw new Error(`${dir}: the warm-up request was denied`)
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
for (const c of contestants) {
  c.ns.sort((a, b) => a - b)
  console.log(`${c.dir}: acquireSync min ${c.ns[0].toFixed(1)} ns, median ${c.ns[c.ns.length >> 1].toFixed(1)} ns (${ROUNDS} rounds of ${N})`)
}
const [a, b] = contestants
console.log(`ratio (median): ${(b.ns[b.ns.length >> 1] / a.ns[a.ns.length >> 1]).toFixed(2)}`)
process.exit(0)
