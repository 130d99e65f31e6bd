'use strict'
// Node worker of the cross-language system test (see ../README.md).
const path = require('node:path')
const { Limiter } = require(path.join(__dirname, '..', '..', '..', 'bindings', 'node'))

async function main () {
  const job = JSON.parse(process.argv[2])
  const events = []
  const limiter = new Limiter({
    url: job.url,
    keyPrefix: job.key_prefix,
    limit: job.limit,
    windowMs: job.window_ms,
    leaseSize: job.lease_size,
    onBackendFailure: job.on_backend_failure,
    expectedReplicas: job.expected_replicas,
    backendTimeoutMs: job.backend_timeout_ms,
    onEvent: (e) => events.push(e.kind)
  })
  const schedule = []
  job.keys.forEach((k, i) => { for (let w = 0; w < job.weights[i]; w++) schedule.push(k) })
  const end = job.start_at_ms + job.duration_ms
  while (Date.now() < job.start_at_ms) await new Promise((resolve) => setTimeout(resolve, 1))
  const admitted = {}
  const reasons = {}
  let maxMs = 0
  for (let i = 0; Date.now() < end; i++) {
    const key = schedule[i % schedule.length]
    const t = Date.now()
    const d = await limiter.acquire(key)
    maxMs = Math.max(maxMs, Date.now() - t)
    reasons[d.reason] = (reasons[d.reason] || 0) + 1
    if (d.allowed) admitted[key] = (admitted[key] || 0) + 1
    // Node timers have millisecond resolution: pace with a turn of the event loop.
    if (job.pause_us > 0) await new Promise((resolve) => setImmediate(resolve))
  }
  let closed = true
  try { await limiter.close() } catch { closed = false }
  console.log(JSON.stringify({
    lang: 'node', admitted, reasons, metrics: limiter.metrics(), events, closed, max_acquire_ms: maxMs
  }))
}

main().catch((e) => { console.error(e); process.exit(1) })
