#!/usr/bin/env node
'use strict'
// Peer benchmark from Node: quotalease (lease mode, exact mode) vs
// rate-limiter-flexible `RateLimiterRedis` over ioredis, one after the other
// in one process against one redis-server, on the same offered load. The
// Node counterpart of `quotalease bench` (cli/src/bench.rs, `make bench-peers`):
//
// - closed loop: N async workers, each awaits its decision, then sends the next;
// - a limit that never binds (1e9 per second), so admitted/s is capacity;
// - every worker replays its own fixed key sequence, the same for every
//   contestant: one hot key, and Zipf s=1.1 over 1000 keys (seed 1; the
//   SplitMix64 streams of the Rust bench, so the same sequences);
// - Redis commands per admitted request from INFO commandstats deltas.
//
//   node bench/peers.js [--concurrency 16] [--duration 5] [--keys 1000]
//     [--seed 1] [--dist hot,zipf] [--json PATH] [--write-docs ../../docs/benchmarks.md]
//
// Starts its own redis-server with tests/harness/redisctl and stops it at the
// end. Writes target/bench/peers-node.json (for scripts/peers-chart.py).
// Unknown flags (those of bench/acquire.js, which scripts/bench-node.sh also
// passes) are ignored.

const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const Redis = require('ioredis')
const { RateLimiterRedis, RateLimiterRes } = require('rate-limiter-flexible')
const { Limiter, engineVersion } = require('..')
const { REPO, options, privateRedisctl, writeBlock } = require('./harness')

const args = process.argv.slice(2)
const opt = options(args)
const CONCURRENCY = Number(opt('--concurrency', 16))
const DURATION_S = Number(opt('--duration', 5))
const KEYS = Number(opt('--keys', 1000))
const SEED = BigInt(opt('--seed', 1))
const DISTS = opt('--dist', 'hot,zipf').split(',')
const DOCS = opt('--write-docs', null)
const JSON_OUT = path.resolve(REPO, opt('--json', path.join('target', 'bench', 'peers-node.json')))

const LIMIT = 1e9 // per second: never binds
const WINDOW_MS = 1000
const LEASE_SIZE = 20
const ZIPF_S = 1.1
const GOAL_FEWER_COMMANDS = 20
const GOAL_THROUGHPUT = 10

for (const [name, v] of [
  ['--concurrency', CONCURRENCY],
  ['--duration', DURATION_S],
  ['--keys', KEYS],
]) {
  if (!(v > 0) || !Number.isFinite(v)) throw new Error(`${name} must be a positive number`)
}
for (const d of DISTS) if (d !== 'hot' && d !== 'zipf') throw new Error(`--dist: unknown distribution ${d} (hot, zipf)`)
if (DISTS.includes('zipf') && KEYS < 2) throw new Error('--dist zipf needs --keys of at least 2')

// ---------------------------------------------------------------- redis-server

// A private harness index, so no other suite's stop-all touches this server.
const redisctl = privateRedisctl('node-peers')

// ---------------------------------------------------------------- offered load

const MASK64 = (1n << 64n) - 1n

/** SplitMix64, seeded per stream (one stream per worker). */
class SplitMix64 {
  constructor(seed, stream) {
    this.s = (seed ^ ((stream * 0xd1b54a32d192ed03n) & MASK64)) & MASK64
    this.next()
  }

  next() {
    this.s = (this.s + 0x9e3779b97f4a7c15n) & MASK64
    let z = this.s
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64
    return z ^ (z >> 31n)
  }

  /** Uniform in [0, 1). */
  unit() {
    return Number(this.next() >> 11n) / 2 ** 53
  }
}

/** Cumulative Zipf(s) probabilities over ranks 1..n. */
function zipfCdf(n, s) {
  const cdf = new Float64Array(n)
  let acc = 0
  for (let r = 1; r <= n; r++) {
    acc += r ** -s
    cdf[r - 1] = acc
  }
  for (let i = 0; i < n; i++) cdf[i] /= acc
  return cdf
}

/** Index of the first CDF entry above u (the sampled rank - 1). */
function zipfSample(cdf, u) {
  let lo = 0
  let hi = cdf.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (cdf[mid] <= u) lo = mid + 1
    else hi = mid
  }
  return Math.min(lo, cdf.length - 1)
}

/** Every worker's key indices for `dist`, replayed in a loop. */
function sequences(dist, keys, workers, seed) {
  if (dist === 'hot') return Array.from({ length: workers }, () => Uint32Array.of(0))
  const cdf = zipfCdf(keys, ZIPF_S)
  const len = Math.min(65536, Math.max(4096, Math.floor(2 ** 21 / workers)))
  return Array.from({ length: workers }, (_, w) => {
    const rng = new SplitMix64(seed, BigInt(w))
    const seq = new Uint32Array(len)
    for (let i = 0; i < len; i++) seq[i] = zipfSample(cdf, rng.unit())
    return seq
  })
}

const describe = (dist) => (dist === 'hot' ? 'one hot key' : `Zipf s=${ZIPF_S} over ${KEYS} keys`)

// ---------------------------------------------------------------- latencies

class Samples {
  constructor() {
    this.a = new Float64Array(1 << 16)
    this.n = 0
  }

  push(ns) {
    if (this.n === this.a.length) {
      const b = new Float64Array(this.a.length * 2)
      b.set(this.a)
      this.a = b
    }
    this.a[this.n++] = ns
  }

  /** Nearest-rank quantiles. */
  quantiles(qs) {
    const s = this.a.subarray(0, this.n).sort()
    return qs.map((q) => (this.n ? s[Math.min(this.n - 1, Math.max(0, Math.ceil(q * this.n) - 1))] : 0))
  }
}

// ---------------------------------------------------------------- contestants

const CONTESTANTS = [
  { id: 'lease', name: `quotalease lease (leaseSize ${LEASE_SIZE})`, kind: 'lease', bound: LEASE_SIZE },
  { id: 'exact', name: 'quotalease exact', kind: 'per-request', bound: 0 },
  { id: 'rlf', name: 'rate-limiter-flexible RateLimiterRedis', kind: 'per-request', bound: 0 },
]

/** A closed-loop worker over a quotalease limiter. */
async function qlWorker(limiter, seq, keys, deadline, st) {
  const len = seq.length
  for (let i = 0; !st.stop; i++) {
    const key = keys[seq[i % len]]
    const t0 = process.hrtime.bigint()
    const d = await limiter.acquire(key)
    const t1 = process.hrtime.bigint()
    st.lat.push(Number(t1 - t0))
    if (d.allowed) st.admitted++
    else st.denied++
    if (d.reason !== st.reason) st.other[d.reason] = (st.other[d.reason] || 0) + 1
    if (t1 >= deadline) return
  }
}

/** A closed-loop worker over rate-limiter-flexible: a denial rejects with a RateLimiterRes. */
async function rlfWorker(rlf, seq, keys, deadline, st) {
  const len = seq.length
  for (let i = 0; !st.stop; i++) {
    const key = keys[seq[i % len]]
    const t0 = process.hrtime.bigint()
    let allowed
    try {
      await rlf.consume(key)
      allowed = true
    } catch (err) {
      if (!(err instanceof RateLimiterRes)) throw err
      allowed = false
    }
    const t1 = process.hrtime.bigint()
    st.lat.push(Number(t1 - t0))
    if (allowed) st.admitted++
    else st.denied++
    if (t1 >= deadline) return
  }
}

/** `INFO commandstats` as { command: calls }. */
async function commandstats(admin) {
  const out = {}
  for (const line of (await admin.info('commandstats')).split('\n')) {
    const m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim())
    if (m) out[m[1]] = Number(m[2])
  }
  return out
}

/** Commands that are the bench's own or connection set-up, not the limiters' work. */
const ignored = (cmd) =>
  cmd === 'info' ||
  cmd === 'flushall' ||
  cmd.startsWith('config') ||
  cmd === 'ping' ||
  cmd === 'hello' ||
  cmd === 'select' ||
  cmd === 'auth' ||
  cmd === 'quit' ||
  cmd.startsWith('client') ||
  cmd.startsWith('command')
const isScriptCall = (cmd) => cmd === 'eval' || cmd === 'evalsha' || cmd === 'eval_ro' || cmd === 'evalsha_ro'

async function runOne(c, dist, seqs, port, admin) {
  const url = `redis://127.0.0.1:${port}`
  const n = dist === 'hot' ? 1 : KEYS
  const keys = Array.from({ length: n }, (_, i) => `bench:${i}`)
  const prefix = `qlnode-${dist}-${c.id}`
  await admin.flushall()
  let limiter = null
  let client = null
  let rlf = null
  if (c.id === 'rlf') {
    client = new Redis({ host: '127.0.0.1', port, lazyConnect: true })
    await client.connect()
    rlf = new RateLimiterRedis({ storeClient: client, keyPrefix: prefix, points: LIMIT, duration: WINDOW_MS / 1000 })
  } else {
    const opts = { url, keyPrefix: prefix, limit: LIMIT, windowMs: WINDOW_MS }
    limiter = new Limiter(c.id === 'lease' ? { ...opts, leaseSize: LEASE_SIZE } : { ...opts, mode: 'exact' })
  }
  await admin.config('RESETSTAT')
  const before = await commandstats(admin)
  // `other`: decisions of quotalease with another reason than the mode's own
  // (fallback, pending: the backend failed or was slow), reported on stderr.
  const st = { admitted: 0, denied: 0, lat: new Samples(), reason: c.id, other: {}, stop: false }
  const start = process.hrtime.bigint()
  const deadline = start + BigInt(Math.round(DURATION_S * 1e9))
  const workers = seqs.map((seq) => {
    const p = c.id === 'rlf' ? rlfWorker(rlf, seq, keys, deadline, st) : qlWorker(limiter, seq, keys, deadline, st)
    return p.catch((err) => {
      st.stop = true
      throw err
    })
  })
  // A decision that never settles would hang the run: give up loudly instead.
  let watchdog
  const hung = new Promise((_, reject) => {
    watchdog = setTimeout(() => {
      st.stop = true
      reject(new Error(`${c.name} on ${dist}: workers still awaiting a decision ${DURATION_S + 30} s after the start`))
    }, (DURATION_S + 30) * 1000)
  })
  const settled = await Promise.race([Promise.allSettled(workers), hung])
  clearTimeout(watchdog)
  const seconds = Number(process.hrtime.bigint() - start) / 1e9
  const after = await commandstats(admin)
  if (limiter) await limiter.close()
  if (client) await client.quit()
  const failed = settled.find((s) => s.status === 'rejected')
  if (failed) throw failed.reason

  const commands = {}
  for (const cmd of Object.keys(after).sort()) {
    const d = after[cmd] - (before[cmd] || 0)
    if (d > 0 && !ignored(cmd)) commands[cmd] = d
  }
  const total = Object.values(commands).reduce((a, b) => a + b, 0)
  const scripts = Object.entries(commands)
    .filter(([cmd]) => isScriptCall(cmd))
    .reduce((a, [, v]) => a + v, 0)
  const [p50, p99] = st.lat.quantiles([0.5, 0.99])
  if (Object.keys(st.other).length) {
    console.error(`peers: warning: ${c.name} on ${dist}: decisions with another reason than '${c.id}': ${JSON.stringify(st.other)}`)
  }
  return {
    dist,
    contestant: c.name,
    kind: c.kind,
    admitted: st.admitted,
    denied: st.denied,
    seconds: Number(seconds.toFixed(4)),
    admitted_per_s: Number((st.admitted / seconds).toFixed(1)),
    p50_ns: Math.round(p50),
    p99_ns: Math.round(p99),
    script_calls_per_admitted: Number((scripts / Math.max(1, st.admitted)).toFixed(6)),
    commands_per_admitted: Number((total / Math.max(1, st.admitted)).toFixed(6)),
    commands,
    overshoot_bound: c.bound,
  }
}

// ---------------------------------------------------------------- report

const dur = (ns) => (ns < 1e3 ? `${ns} ns` : ns < 1e6 ? `${(ns / 1e3).toFixed(1)} us` : `${(ns / 1e6).toFixed(2)} ms`)
/** A factor: one decimal from 1 up, two significant digits below. */
const ratio = (x) => {
  if (x >= 100) return `${x.toFixed(0)}x`
  if (x >= 1 || x <= 0) return `${x.toFixed(1)}x`
  return `${x.toFixed(Math.max(0, 1 - Math.floor(Math.log10(x))))}x`
}
/** Two decimals rounded down, so a factor just under a goal never reads as the goal. */
const floorRatio = (x) => `${(Math.floor(x * 100 + 1e-9) / 100).toFixed(2)}x`
const met = (ok) => (ok ? 'met' : 'NOT met')

function table(runs) {
  const per = runs.filter((r) => r.kind === 'per-request')
  const bestThr = Math.max(...per.map((r) => r.admitted_per_s))
  const bestCmds = Math.min(...per.map((r) => r.commands_per_admitted))
  return [
    '| contestant | admitted | admitted/s | denied | p50 | p99 | overshoot bound | script calls / admitted | all commands / admitted | admitted/s vs best per-request | fewer commands than best per-request |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...runs.map((r) =>
      [
        '',
        r.contestant,
        r.admitted,
        Math.round(r.admitted_per_s),
        r.denied,
        dur(r.p50_ns),
        dur(r.p99_ns),
        r.overshoot_bound,
        r.script_calls_per_admitted.toFixed(4),
        r.commands_per_admitted.toFixed(4),
        ratio(r.admitted_per_s / Math.max(1e-9, bestThr)),
        ratio(bestCmds / Math.max(1e-12, r.commands_per_admitted)),
        '',
      ]
        .join(' | ')
        .trim(),
    ),
  ].join('\n')
}

function goals(runs) {
  const lease = runs.find((r) => r.kind === 'lease')
  const per = runs.filter((r) => r.kind === 'per-request')
  const calls = Math.min(...per.map((o) => o.script_calls_per_admitted / Math.max(1e-12, lease.script_calls_per_admitted)))
  const cmds = Math.min(...per.map((o) => o.commands_per_admitted / Math.max(1e-12, lease.commands_per_admitted)))
  const thr = Math.min(...per.map((o) => lease.admitted_per_s / Math.max(1e-9, o.admitted_per_s)))
  return (
    `Goals for lease (leaseSize ${LEASE_SIZE}) against every per-request design (quotalease exact, RateLimiterRedis): ` +
    `>= ${GOAL_FEWER_COMMANDS}x fewer Redis commands per admitted request: ${met(calls >= GOAL_FEWER_COMMANDS)} for script calls (${floorRatio(calls)}), ` +
    `${met(cmds >= GOAL_FEWER_COMMANDS)} for all commands (${floorRatio(cmds)}); ` +
    `>= ${GOAL_THROUGHPUT}x the admitted/s: ${met(thr >= GOAL_THROUGHPUT)} (${floorRatio(thr)}).`
  )
}

function report(runs) {
  const out = []
  for (const dist of DISTS) {
    const rs = runs.filter((r) => r.dist === dist)
    out.push(`**${dist}**: ${describe(dist)}`, '', table(rs), '')
    const by = rs.map(
      (r) =>
        `${r.contestant}: ${Object.entries(r.commands)
          .map(([c, n]) => `${c} ${n}`)
          .join(', ')}`,
    )
    out.push(`Commands (INFO commandstats): ${by.join('; ')}.`, '', goals(rs), '')
  }
  return out.join('\n').trimEnd()
}

// ---------------------------------------------------------------- docs

function writeDocs(docsPath, doc) {
  writeBlock(docsPath, 'node-peers-bench', doc, { after: '<!-- node-bench:end -->' })
  console.error(`peers: wrote the node-peers-bench block of ${docsPath}`)
}

function docBlock(result, tables, redisVersion) {
  const versions =
    `Node ${process.versions.node}, quotalease ${engineVersion}, ` +
    `rate-limiter-flexible ${require('rate-limiter-flexible/package.json').version}, ` +
    `ioredis ${require('ioredis/package.json').version}, Redis ${redisVersion}`
  const load = fs.existsSync('/proc/loadavg') ? fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ') : 'n/a'
  return [
    '## Against rate-limiter-flexible RateLimiterRedis (Node)',
    '',
    'The Node counterpart of the Rust peer bench above, with the common Node design as the peer: ' +
      "rate-limiter-flexible's `RateLimiterRedis` over one ioredis client (its Lua script through `EVALSHA` per " +
      '`consume`: `SET NX EX`, `INCRBY`, `PTTL` in Redis; a fixed window of `duration` 1 s and `points` 1e9, so it ' +
      'never denies here and never overshoots). quotalease runs twice through its Node binding: lease mode ' +
      `(\`leaseSize\` ${LEASE_SIZE}, the default refill threshold ${Math.max(1, Math.floor(LEASE_SIZE / 4))}; \`await limiter.acquire(key)\`), the design under test, and ` +
      "exact mode (`mode: 'exact'`, one script call per request), the other per-request design. " +
      `\`bench/peers.js\` runs the three one after the other in one Node process against one redis-server, on the same offered load: ` +
      `${result.threads} async workers in a closed loop (each awaits its decision, then sends the next), each replaying its ` +
      `own fixed key sequence, the same for every contestant (one hot key; Zipf s=${ZIPF_S} over ${KEYS} keys, ` +
      `seed ${SEED}, the SplitMix64 streams of the Rust bench), for ${DURATION_S} s per contestant and distribution. ` +
      `The limit (1e9 per second) never binds, so admitted/s is each design's capacity from one Node process. ` +
      'p50/p99 are timed with `process.hrtime.bigint()` around each awaited decision. Redis commands come from ' +
      '`INFO commandstats` deltas around each run (after `FLUSHALL` and `CONFIG RESETSTAT`; the bench\'s own ' +
      '`INFO`/`CONFIG`/`FLUSHALL` and connection set-up excluded): "script calls" are `EVAL`/`EVALSHA` round trips, ' +
      '"all commands" also counts what the scripts ran. The overshoot bound is instances × leaseSize for lease ' +
      '(one instance here) and 0 for the per-request designs. "best per-request" is the per-request contestant ' +
      'with the most admitted/s (throughput column) or the fewest commands per admitted request (commands column).',
    '',
    `Command: \`${result.command}\` (= \`scripts/bench-node.sh\`, which runs \`bindings/node/bench/acquire.js\` ` +
      'then `bindings/node/bench/peers.js`; peers.js starts a redis-server with `tests/harness/redisctl start` and ' +
      `stops it at the end). Measured ${result.date} on ${os.cpus().length} cores (load average ${load} at the end, ` +
      `other work running), ${versions}, the redis-server on the same cores.`,
    '',
    ...tables.split('\n'),
    '',
    '![quotalease lease vs exact vs rate-limiter-flexible RateLimiterRedis from Node: admitted/s and Redis commands per admitted request](peers-node.svg)',
    '',
    'The command ratios are fixed by the designs, not by the machine: a lease call brings ' +
      `leaseSize − refill threshold + 1 = ${LEASE_SIZE - Math.max(1, Math.floor(LEASE_SIZE / 4)) + 1} tokens and runs 4 commands ` +
      '(`EVALSHA`, `TIME`, `GET`, `SET`), as many as `RateLimiterRedis` runs per request, so at leaseSize ' +
      `${LEASE_SIZE} the default threshold gives at most 16× fewer script calls and commands, less the tokens ` +
      'still leased when a run ends (see "Reading the goals" in the Rust section); the ≥ 20× goal cannot be met at leaseSize 20. ' +
      `Throughput: on the hot key the ${CONCURRENCY} workers spend a lease's 16 tokens at once and then wait for the next ` +
      '(one lease in flight per key), so lease admitted/s ≈ 16 / lease round trip; on the Zipf spread many keys lease in ' +
      'parallel and the one Node event loop (an awaited `acquire` plus the timing, sharing 2 cores with redis-server and ' +
      "quotalease's broker thread) is the limit. ioredis keeps all of its workers' requests in flight on its one connection; " +
      "quotalease's exact mode sends them through the limiter's broker, which pipelines the requests queued so far into one " +
      'batch and waits for it before sending the next, so it has fewer round trips in flight and runs one more command per ' +
      'request. Figures move with the load on the machine from run to run; the ratios within one run are the result.',
  ]
}

// ---------------------------------------------------------------- main

/** JSON with the schema's float fields always written as floats (5.0, not 5). */
function toJson(result) {
  const floats = new Set(['duration_s', 'seconds', 'admitted_per_s', 'script_calls_per_admitted', 'commands_per_admitted'])
  const text = JSON.stringify(result, (k, v) => (floats.has(k) && Number.isInteger(v) ? `\u0000float:${v}.0` : v), 2)
  return text.replace(/"\\u0000float:([^"]+)"/g, '$1')
}

async function main() {
  const port = Number(redisctl('start'))
  let stopped = false
  const stopRedis = () => {
    if (stopped) return
    stopped = true
    try {
      redisctl('stop', String(port))
    } finally {
      redisctl.cleanup()
    }
  }
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.once(sig, () => {
      stopRedis()
      process.exit(130)
    })
  }
  const admin = new Redis({ host: '127.0.0.1', port, lazyConnect: true })
  try {
    await admin.connect()
    const redisVersion = /redis_version:(\S+)/.exec(await admin.info('server'))[1]
    const runs = []
    for (const dist of DISTS) {
      const seqs = sequences(dist, KEYS, CONCURRENCY, SEED)
      for (const c of CONTESTANTS) {
        console.error(`peers: ${dist}: ${c.name}, ${CONCURRENCY} workers, ${DURATION_S} s`)
        const r = await runOne(c, dist, seqs, port, admin)
        console.error(
          `peers:   admitted/s ${Math.round(r.admitted_per_s)}, p50 ${dur(r.p50_ns)}, p99 ${dur(r.p99_ns)}, ` +
            `commands/admitted ${r.commands_per_admitted.toFixed(4)}`,
        )
        runs.push(r)
      }
    }
    const defaults = CONCURRENCY === 16 && DURATION_S === 5 && KEYS === 1000 && SEED === 1n
    const result = {
      language: 'Node',
      command: defaults
        ? 'make bench-node'
        : `scripts/bench-node.sh --concurrency ${CONCURRENCY} --duration ${DURATION_S} --keys ${KEYS} --seed ${SEED}`,
      date: new Date().toISOString().slice(0, 10),
      threads: CONCURRENCY,
      duration_s: DURATION_S,
      runs,
    }
    fs.mkdirSync(path.dirname(JSON_OUT), { recursive: true })
    fs.writeFileSync(JSON_OUT, toJson(result) + '\n')
    console.error(`peers: wrote ${JSON_OUT}`)

    const tables = report(runs)
    console.log(
      `Run: ${CONCURRENCY} workers x ${DURATION_S.toFixed(1)} s per contestant and distribution, limit ${LIMIT} per ${WINDOW_MS} ms, ` +
        `leaseSize ${LEASE_SIZE}, redis-server ${redisVersion} on port ${port}.\n`,
    )
    console.log(tables)

    if (DOCS) {
      writeDocs(DOCS, docBlock(result, tables, redisVersion))
      const chart = path.join(REPO, 'scripts', 'peers-chart.py')
      if (fs.existsSync(chart)) {
        const r = spawnSync('python3', [chart, JSON_OUT, path.join(REPO, 'docs', 'peers-node.svg')], { stdio: 'inherit' })
        if (r.status !== 0) throw new Error(`scripts/peers-chart.py failed (status ${r.status})`)
      } else {
        console.error('peers: scripts/peers-chart.py not found: docs/peers-node.svg not written')
      }
    }
  } finally {
    admin.disconnect()
    stopRedis()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
