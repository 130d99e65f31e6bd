'use strict'
// Case (b) of make bench-fleet: an Express app behind quotalease's Express
// middleware, FLEET_WORKERS workers under node:cluster, each with its own
// Limiter on one Redis key ("fleet"). Same environment and files as app.py
// (ready-node-PID, node-PID.json); FLEET_PORT is the port. SIGTERM to the
// primary stops the workers, which close their limiters and write their files.
const cluster = require('node:cluster')
const fs = require('node:fs')
const path = require('node:path')

const env = process.env
const out = env.FLEET_OUT

if (cluster.isPrimary) {
  const n = Number(env.FLEET_WORKERS || 4)
  for (let i = 0; i < n; i++) cluster.fork()
  process.on('SIGTERM', () => {
    for (const w of Object.values(cluster.workers)) w.process.kill('SIGTERM')
  })
  let exited = 0
  cluster.on('exit', () => {
    if (++exited === n) process.exit(0)
  })
} else {
  const express = require(path.join(__dirname, '..', '..', 'bindings', 'node', 'node_modules', 'express'))
  const { Limiter } = require(path.join(__dirname, '..', '..', 'bindings', 'node'))
  const { rateLimit } = require(path.join(__dirname, '..', '..', 'bindings', 'node', 'express.js'))
  const limiter = new Limiter({
    url: env.FLEET_URL,
    keyPrefix: env.FLEET_PREFIX,
    limit: Number(env.FLEET_LIMIT),
    windowMs: Number(env.FLEET_WINDOW_MS),
    leaseSize: env.FLEET_LEASE_SIZE ? Number(env.FLEET_LEASE_SIZE) : undefined
  })
  const app = express()
  app.use(rateLimit({ limiter, key: () => 'fleet', skip: (req) => req.path === '/health' }))
  app.get('/', (req, res) => res.type('text/plain').send('ok\n'))
  app.get('/health', (req, res) => res.type('text/plain').send('ok\n'))
  const perSecond = [] // [unix second, backend_calls, admitted] at each whole second
  let sampler
  const sample = () => {
    sampler = setTimeout(() => {
      const m = limiter.metrics()
      perSecond.push([Math.round(Date.now() / 1000), m.backend_calls, m.admitted])
      sample()
    }, 1000 - (Date.now() % 1000))
  }
  sample()
  const server = app.listen(Number(env.FLEET_PORT), '127.0.0.1', () => {
    fs.writeFileSync(path.join(out, `ready-node-${process.pid}`), '')
  })
  process.on('SIGTERM', () => {
    clearTimeout(sampler)
    server.close()
    server.closeAllConnections()
    const run = limiter.metrics()
    limiter.close().then(() => {
      const record = { lang: 'node', pid: process.pid, metrics: run, metrics_closed: limiter.metrics(), per_second: perSecond }
      fs.writeFileSync(path.join(out, `node-${process.pid}.json`), JSON.stringify(record))
      process.exit(0)
    })
  })
}
