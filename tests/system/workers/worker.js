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
  const settleEnd = end + job.settle_ms
  // Optional: a progress line every progress_ms (for the soak's driver).
  const progressMs = job.progress_ms || 0
  let nextProgress = job.start_at_ms
  while (Date.now() < job.start_at_ms) await new Promise((resolve) => setTimeout(resolve, 1))
  const admitted = {}
  const reasons = {}
  const timeline = new Map() // "slot|key|reason" -> [slot, key, reason, admitted, denied]
  let maxMs = 0
  for (let i = 0; ; i++) {
    const t = Date.now()
    // Past the deadline, go on while degraded: recovery is awaited, not timed.
    if (t >= settleEnd || (t >= end && limiter.metrics().fallback_active === 0)) break
    if (progressMs > 0 && t >= nextProgress) {
      const m = limiter.metrics()
      console.log(JSON.stringify({
        progress_at_ms: t,
        fallback_active: m.fallback_active,
        fallback_transitions: m.fallback_transitions,
        reasons
      }))
      nextProgress = t + progressMs
    }
    const key = schedule[i % schedule.length]
    const d = await limiter.acquire(key)
    maxMs = Math.max(maxMs, Date.now() - t)
    reasons[d.reason] = (reasons[d.reason] || 0) + 1
    const slot = Math.floor((t - job.start_at_ms) / job.slot_ms)
    const id = `${slot}|${key}|${d.reason}`
    if (!timeline.has(id)) timeline.set(id, [slot, key, d.reason, 0, 0])
    timeline.get(id)[d.allowed ? 3 : 4]++
    if (d.allowed) admitted[key] = (admitted[key] || 0) + 1
    // Node timers have millisecond resolution: pace with a turn of the event
    // loop, or with a timer for pauses of a millisecond or more.
    if (job.pause_us >= 1000) await new Promise((resolve) => setTimeout(resolve, Math.round(job.pause_us / 1000)))
    else if (job.pause_us > 0) await new Promise((resolve) => setImmediate(resolve))
  }
  const endedAtMs = Date.now()
  let closed = true
  try { await limiter.close() } catch { closed = false }
  console.log(JSON.stringify({
    lang: 'node',
    admitted,
    reasons,
    metrics: limiter.metrics(),
    events,
    closed,
    max_acquire_ms: maxMs,
    ended_at_ms: endedAtMs,
    timeline: [...timeline.values()]
  }))
}

main().catch((e) => { console.error(e); process.exit(1) })
