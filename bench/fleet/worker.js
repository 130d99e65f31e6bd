'use strict'
// Case (a) of make bench-fleet: one Node process offering a fixed rate on one
// key. Same job and output as worker.py beside it (lease_size null: adaptive).
const path = require('node:path')
const { Limiter } = require(path.join(__dirname, '..', '..', 'bindings', 'node'))

async function main () {
  const job = JSON.parse(process.argv[2])
  const events = [] // [ms since the start, kind, message]: the outages this process saw
  const limiter = new Limiter({
    url: job.url,
    keyPrefix: job.key_prefix,
    limit: job.limit,
    windowMs: job.window_ms,
    leaseSize: job.lease_size,
    onEvent: (ev) => events.push([Date.now() - job.start_at_ms, ev.kind, ev.message])
  })
  const { key, rate } = job
  const start = job.start_at_ms
  const end = start + job.duration_ms
  const tick = () => new Promise((resolve) => setTimeout(resolve, 1))
  while (Date.now() < start) await tick()
  let offered = 0
  let admitted = 0
  const deniedBy = {} // reason of each denial: where false denials come from
  let firstMs = 0
  let lastMs = 0
  const perSecond = [] // [backend_calls, admitted] at each whole second
  for (;;) {
    const now = Date.now()
    if (now >= end) break
    while (perSecond.length < Math.floor((now - start) / 1000)) {
      const m = limiter.metrics()
      perSecond.push([m.backend_calls, m.admitted])
    }
    const due = Math.floor(((now - start) / 1000) * rate)
    while (offered < due) {
      if (!firstMs) firstMs = Date.now()
      const d = await limiter.acquire(key)
      if (d.allowed) admitted++
      else deniedBy[d.reason] = (deniedBy[d.reason] || 0) + 1
      offered++
    }
    lastMs = Date.now()
    await tick()
  }
  const run = limiter.metrics()
  perSecond.push([run.backend_calls, run.admitted])
  await limiter.close()
  console.log(JSON.stringify({
    lang: 'node',
    rate,
    offered,
    admitted,
    first_ms: firstMs,
    last_ms: lastMs,
    metrics: run,
    metrics_closed: limiter.metrics(),
    per_second: perSecond,
    denied_by: deniedBy,
    events
  }))
}

main().catch((e) => { console.error(e); process.exit(1) })
