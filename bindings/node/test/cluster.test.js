'use strict'
// node:cluster: several worker processes limiting one key through one Redis
// admit no more than the limit plus what their leases can hold
// (workers x leaseSize), and not much less.

const test = require('node:test')
const assert = require('node:assert/strict')
const cluster = require('node:cluster')
const path = require('node:path')

const { RedisServer, unique } = require('./helpers')

test('cluster workers share one limit through Redis', async (t) => {
  const redis = new RedisServer()
  t.after(() => redis.stop())
  const WORKERS = 3
  const config = {
    url: redis.url,
    keyPrefix: unique('cluster'),
    limit: 200,
    // A window of a day: what refills during the test is below one token.
    windowMs: 86400000,
    leaseSize: 10,
    attempts: 150,
  }
  cluster.setupPrimary({ exec: path.join(__dirname, 'fixtures', 'cluster-worker.js'), silent: false })
  const started = Date.now()
  const workers = []
  let ready = 0
  const results = await Promise.all(
    Array.from({ length: WORKERS }, () =>
      new Promise((resolve, reject) => {
        const w = cluster.fork({ QL_CLUSTER_CONFIG: JSON.stringify(config) })
        workers.push(w)
        let result = null
        const guard = setTimeout(() => {
          w.kill('SIGKILL')
          reject(new Error('a worker did not finish'))
        }, 60000)
        w.on('message', (m) => {
          if (m.ready) {
            ready += 1
            if (ready === WORKERS) for (const x of workers) x.send('go')
          } else {
            result = m
          }
        })
        w.on('exit', (code) => {
          clearTimeout(guard)
          if (code === 0 && result) resolve(result)
          else reject(new Error(`worker exited with ${code}`))
        })
      }),
    ),
  )
  const elapsed = Date.now() - started
  const admitted = results.reduce((s, r) => s + r.admitted, 0)
  const leaseSize = results[0].leaseSize
  const refill = Math.ceil((config.limit * elapsed) / config.windowMs)
  const bound = config.limit + refill + WORKERS * leaseSize
  assert.equal(WORKERS * config.attempts > config.limit + WORKERS * leaseSize, true, 'the workers ask for more than the bound')
  assert.ok(admitted <= bound, `admitted ${admitted} > limit + workers x leaseSize = ${bound}`)
  // Each worker may end holding at most one lease it never spent.
  assert.ok(admitted >= config.limit - WORKERS * leaseSize, `admitted only ${admitted}`)
  assert.ok(results.every((r) => r.backendCalls > 0), JSON.stringify(results))
})
