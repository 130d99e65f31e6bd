'use strict'
// quotalease/express in a real Express app (and a plain node:http server,
// as Connect would run it) over HTTP on loopback.

const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')
const express = require('express')

const { Limiter, httpKey } = require('..')
const { rateLimit } = require('../express')
const { RedisServer, listen, unique } = require('./helpers')

test('express: headers on every response, 429 with Retry-After when denied', async (t) => {
  const limiter = new Limiter({ limit: 3, windowMs: 60000, leaseSize: 1 })
  const app = express()
  app.use(rateLimit({ limiter, key: (req) => req.get('x-api-key') || req.ip }))
  app.get('/', (req, res) => res.json({ remaining: req.rateLimit.remaining }))
  const srv = await listen(app)
  t.after(async () => {
    await srv.close()
    await limiter.close()
  })

  for (let i = 0; i < 3; i++) {
    const r = await fetch(`${srv.base}/`, { headers: { 'x-api-key': 'alice' } })
    assert.equal(r.status, 200)
    assert.equal(r.headers.get('ratelimit-policy'), '"default";q=3;w=60')
    assert.match(r.headers.get('ratelimit'), new RegExp(`^"default";r=${2 - i};t=\\d+$`))
    assert.equal(r.headers.get('retry-after'), null)
    assert.deepEqual(await r.json(), { remaining: 2 - i })
  }
  const denied = await fetch(`${srv.base}/`, { headers: { 'x-api-key': 'alice' } })
  assert.equal(denied.status, 429)
  assert.match(denied.headers.get('retry-after'), /^[1-9]\d*$/)
  assert.match(denied.headers.get('ratelimit'), /^"default";r=0;t=\d+$/)
  // The body of every quotalease middleware (Python's and Go's bytes too).
  assert.equal(denied.headers.get('content-type'), 'application/problem+json')
  const body = await denied.text()
  const { retry_after_ms: retryAfterMs } = JSON.parse(body)
  assert.ok(Number.isInteger(retryAfterMs) && retryAfterMs > 0, body)
  assert.equal(
    body,
    `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded","retry_after_ms":${retryAfterMs}}`,
  )

  // Another key has its own budget; the default key is the client address.
  assert.equal((await fetch(`${srv.base}/`, { headers: { 'x-api-key': 'bob' } })).status, 200)
  assert.equal((await fetch(`${srv.base}/`)).status, 200)
})

test('express: cost, skip, custom onDenied, and errors go to next(err)', async (t) => {
  const limiter = new Limiter({ limit: 10, windowMs: 60000, leaseSize: 1 })
  const app = express()
  app.use(
    rateLimit({
      limiter,
      key: (req) => (req.path === '/nokey' ? '' : 'shared'),
      cost: (req) => (req.path === '/expensive' ? 6 : 1),
      skip: (req) => req.path === '/health',
      onDenied: (req, res, next, decision) => res.status(429).json({ error: 'slow down', retryAfterMs: decision.retryAfterMs }),
    }),
  )
  app.get('/{*path}', (req, res) => res.send('ok'))
  app.use((err, req, res, next) => res.status(500).json({ code: err.code }))
  const srv = await listen(app)
  t.after(async () => {
    await srv.close()
    await limiter.close()
  })

  const health = await fetch(`${srv.base}/health`)
  assert.equal(health.status, 200)
  assert.equal(health.headers.get('ratelimit'), null)
  assert.equal((await fetch(`${srv.base}/expensive`)).status, 200)
  const second = await fetch(`${srv.base}/expensive`)
  assert.equal(second.status, 429)
  const body = await second.json()
  assert.equal(body.error, 'slow down')
  assert.ok(body.retryAfterMs > 0)
  assert.ok(second.headers.get('retry-after'))
  const bad = await fetch(`${srv.base}/nokey`)
  assert.equal(bad.status, 500)
  assert.deepEqual(await bad.json(), { code: 'ERR_QUOTALEASE_INVALID_KEY' })
})

test('express: a 600-byte key is limited under its sha256 key, not an error', async (t) => {
  const limiter = new Limiter({ limit: 2, windowMs: 60000, leaseSize: 1 })
  const long = 'k'.repeat(600)
  const app = express()
  app.use(rateLimit({ limiter, key: () => long }))
  app.get('/', (req, res) => res.send('ok'))
  app.use((err, req, res, next) => res.status(500).json({ code: err.code }))
  const srv = await listen(app)
  t.after(async () => {
    await srv.close()
    await limiter.close()
  })
  const statuses = []
  for (let i = 0; i < 3; i++) statuses.push((await fetch(`${srv.base}/`)).status)
  assert.deepEqual(statuses, [200, 200, 429])
  const hashed = 'sha256:' + crypto.createHash('sha256').update(long).digest('hex')
  assert.equal(httpKey(long), hashed)
  assert.equal(limiter.inspect(hashed).admitted, 2)
})

test('connect-style: plain node:http with the middleware, through Redis', async (t) => {
  const redis = new RedisServer()
  const limiter = new Limiter({ url: redis.url, keyPrefix: unique('mw'), limit: 2, windowMs: 60000, leaseSize: 1 })
  const mw = rateLimit({ limiter, key: async (req) => req.headers['x-user'] || 'anon' })
  const srv = await listen((req, res) => mw(req, res, (err) => {
    res.statusCode = err ? 500 : 200
    res.end(err ? err.code : 'ok')
  }))
  t.after(async () => {
    await srv.close()
    await limiter.close()
    redis.stop()
  })
  const statuses = []
  for (let i = 0; i < 3; i++) statuses.push((await fetch(`${srv.base}/`, { headers: { 'x-user': 'u1' } })).status)
  assert.deepEqual(statuses, [200, 200, 429])
  assert.equal(limiter.metrics().backend_calls > 0, true)
})

test('express: tier as a string or a function of the request; two rules give two policies; an unknown tier goes to next(err)', async (t) => {
  const limiter = new Limiter({ limit: 100, windowMs: 60000, leaseSize: 1, tiers: 'free=2/min; pro=5/s, 20/min' })
  const app = express()
  const byPlan = { alice: 'pro', mallory: 'gold' }
  app.use('/fixed', rateLimit({ limiter, key: () => 'fixed', tier: 'free' }))
  app.use(rateLimit({ limiter, key: (req) => req.get('x-user') || 'anon', tier: (req) => byPlan[req.get('x-user')], skip: (req) => req.originalUrl === '/fixed' }))
  app.get('/{*path}', (req, res) => res.json({ limit: req.rateLimit.limit, rules: req.rateLimit.rules }))
  app.use((err, req, res, next) => res.status(500).json({ code: err.code, message: err.message }))
  const srv = await listen(app)
  t.after(async () => {
    await srv.close()
    await limiter.close()
  })

  const fixed = await fetch(`${srv.base}/fixed`)
  assert.equal(fixed.status, 200)
  assert.equal(fixed.headers.get('ratelimit-policy'), '"default";q=2;w=60')
  assert.equal(limiter.inspect('fixed').tier, 'free')

  const pro = await fetch(`${srv.base}/`, { headers: { 'x-user': 'alice' } })
  assert.equal(pro.status, 200)
  assert.equal(pro.headers.get('ratelimit-policy'), '"1s";q=5;w=1, "1min";q=20;w=60')
  assert.match(pro.headers.get('ratelimit'), /^"1s";r=4;t=\d+$/)
  assert.deepEqual(await pro.json(), { limit: 5, rules: [{ limit: 5, windowMs: 1000 }, { limit: 20, windowMs: 60000 }] })
  assert.equal(limiter.inspect('alice').policySource, 'tier pro (assigned by caller, defined in config)')

  // The function returned undefined: no tier named, the limiter's limit.
  const anon = await fetch(`${srv.base}/`)
  assert.equal(anon.headers.get('ratelimit-policy'), '"default";q=100;w=60')
  assert.equal(limiter.inspect('anon').tier, null)

  const unknown = await fetch(`${srv.base}/`, { headers: { 'x-user': 'mallory' } })
  assert.equal(unknown.status, 500)
  const body = await unknown.json()
  assert.equal(body.code, 'ERR_QUOTALEASE_CONFIG')
  assert.match(body.message, /unknown tier "gold" \(known tiers: free, pro\)/)
})

test('express: waitMs waits for the refill instead of a 429; shadow admissions carry no headers', async (t) => {
  const limiter = new Limiter({ limit: 2, windowMs: 1000, leaseSize: 1 })
  const shadow = new Limiter({ limit: 1, windowMs: 60000, shadow: true })
  const app = express()
  app.get('/wait', rateLimit({ limiter, key: () => 'k', waitMs: 30000 }), (req, res) => res.send('ok'))
  app.get('/shadow', rateLimit({ limiter: shadow, key: () => 'k' }), (req, res) => res.send(req.rateLimit.reason))
  const srv = await listen(app)
  t.after(async () => {
    await srv.close()
    await limiter.close()
    await shadow.close()
  })
  const codes = []
  for (let i = 0; i < 3; i++) codes.push((await fetch(`${srv.base}/wait`)).status)
  assert.deepEqual(codes, [200, 200, 200], 'the third waited for the refill')
  assert.equal(await (await fetch(`${srv.base}/shadow`)).text(), 'lease')
  const r = await fetch(`${srv.base}/shadow`)
  assert.equal(r.status, 200)
  assert.equal(await r.text(), 'shadow')
  assert.equal(r.headers.get('ratelimit'), null)
  assert.throws(() => rateLimit({ limiter, waitMs: -1 }), { name: 'TypeError', message: /`waitMs` must be a whole number/ })
})

// --- concurrency: true: a permit per request in flight ------------------------

function deferred() {
  let resolve
  const promise = new Promise((r) => {
    resolve = r
  })
  return { promise, resolve }
}

/**
 * An Express app under `rateLimit({ concurrency: true })` whose requests wait
 * at their path's gate after announcing themselves (`entered`), and whose
 * responses' 'close' (after the middleware's listeners, registered first)
 * resolves `closed`. '/boom/N' throws.
 */
async function gatedApp(t, limiter, options = {}) {
  const gates = new Map()
  const entered = new Map()
  const closed = new Map()
  const slot = (map, path) => {
    if (!map.has(path)) map.set(path, deferred())
    return map.get(path)
  }
  const app = express()
  app.use(rateLimit({ limiter, key: (req) => req.get('x-user') || 'anon', concurrency: true, ...options }))
  app.use((req, res, next) => {
    res.once('close', () => slot(closed, req.path).resolve())
    next()
  })
  app.get('/boom/:n', () => {
    throw new Error('boom')
  })
  app.get('/{*path}', async (req, res) => {
    slot(entered, req.path).resolve()
    await slot(gates, req.path).promise
    res.send(`done ${req.path} ${req.rateLimit.remaining}`)
  })
  app.use((err, req, res, next) => res.status(500).json({ code: err.code, message: err.message }))
  const srv = await listen(app)
  t.after(async () => {
    for (const gate of gates.values()) gate.resolve() // a failed test leaves none waiting
    await srv.close()
    await limiter.close()
  })
  return {
    srv,
    open: (path) => slot(gates, path).resolve(),
    entered: (path) => slot(entered, path).promise,
    closed: (path) => slot(closed, path).promise,
    get: (path, user = 'ann', init = {}) => fetch(`${srv.base}${path}`, { headers: { 'x-user': user }, ...init }),
  }
}

async function assertConcurrencyDenied(r) {
  assert.equal(r.status, 429)
  assert.equal(r.headers.get('retry-after'), '1')
  assert.equal(r.headers.get('ratelimit'), null, 'no RateLimit fields for a permit')
  assert.equal(r.headers.get('ratelimit-policy'), null)
  assert.equal(r.headers.get('content-type'), 'application/problem+json')
  const body = await r.text()
  const retryAfterMs = JSON.parse(body).retry_after_ms
  assert.ok(Number.isInteger(retryAfterMs) && retryAfterMs > 0 && retryAfterMs <= 1000, body)
  assert.equal(
    body,
    `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded","retry_after_ms":${retryAfterMs}}`,
  )
}

test('express concurrency: N in flight, the next gets 429 with Retry-After, a finished request frees its permit', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000, concurrency: 2 }))
  const first = app.get('/a')
  const second = app.get('/b')
  await app.entered('/a')
  await app.entered('/b')
  await assertConcurrencyDenied(await app.get('/c'))
  // another key has its own permits
  app.open('/bob')
  const bob = await app.get('/bob', 'bob')
  assert.equal(bob.status, 200)
  assert.equal(await bob.text(), 'done /bob 1')
  // one finishes: its permit is free again
  app.open('/a')
  const a = await first
  assert.equal(a.status, 200)
  assert.equal(a.headers.get('ratelimit'), null)
  assert.match(await a.text(), /^done \/a [01]$/)
  await app.closed('/a')
  const third = app.get('/c')
  await app.entered('/c')
  await assertConcurrencyDenied(await app.get('/d'))
  app.open('/b')
  app.open('/c')
  assert.deepEqual([(await second).status, (await third).status], [200, 200])
  await app.closed('/b')
  await app.closed('/c')
  app.open('/d')
  app.open('/e')
  const both = await Promise.all([app.get('/d'), app.get('/e')])
  assert.deepEqual(both.map((r) => r.status), [200, 200])
})

test('express concurrency: a handler that throws and an aborted request give their permits back', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000, concurrency: 1 }))
  for (let i = 0; i < 3; i++) {
    // the error reaches the error handler; the permit is released on 'finish'
    const r = await app.get(`/boom/${i}`)
    assert.equal(r.status, 500, 'the previous request released its permit')
    assert.equal((await r.json()).message, 'boom')
    await app.closed(`/boom/${i}`)
  }
  // the client aborts while its request holds the permit: released on 'close'
  const abort = new AbortController()
  const aborted = app.get('/slow', 'ann', { signal: abort.signal })
  await app.entered('/slow')
  await assertConcurrencyDenied(await app.get('/other'))
  abort.abort()
  await assert.rejects(aborted, { name: 'AbortError' })
  await app.closed('/slow')
  app.open('/other')
  const other = await app.get('/other')
  assert.equal(other.status, 200)
  assert.equal(await other.text(), 'done /other 0')
})

test("express concurrency: the request's tier sets its limit; an unknown tier goes to next(err)", async (t) => {
  const limiter = new Limiter({ limit: 1000, concurrency: 3, tiers: 'free=1000/min, 1 concurrent' })
  const app = await gatedApp(t, limiter, { tier: (req) => req.get('x-tier') })
  const free = { headers: { 'x-user': 'ann', 'x-tier': 'free' } }
  const first = app.get('/a', 'ann', free)
  await app.entered('/a')
  await assertConcurrencyDenied(await app.get('/b', 'ann', free))
  app.open('/a')
  assert.equal((await first).status, 200)
  const gold = await app.get('/c', 'ann', { headers: { 'x-user': 'ann', 'x-tier': 'gold' } })
  assert.equal(gold.status, 500)
  const body = await gold.json()
  assert.equal(body.code, 'ERR_QUOTALEASE_CONFIG')
  assert.match(body.message, /gold/)
})

test('express concurrency: a limiter without concurrency goes to next(err); cost and waitMs are refused', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000 }))
  const r = await app.get('/')
  assert.equal(r.status, 500)
  const body = await r.json()
  assert.equal(body.code, 'ERR_QUOTALEASE_CONFIG')
  assert.match(body.message, /`concurrency` is 0/)
  const limiter = new Limiter({ limit: 10, concurrency: 1 })
  t.after(() => limiter.close())
  for (const option of [{ cost: 2 }, { cost: () => 1 }, { waitMs: 100 }]) {
    const name = Object.keys(option)[0]
    assert.throws(() => rateLimit({ limiter, concurrency: true, ...option }), {
      code: 'ERR_QUOTALEASE_CONFIG',
      message: new RegExp(`\`${name}\` cannot be combined with \`concurrency: true\``),
    })
  }
  assert.throws(() => rateLimit({ limiter, concurrency: 'yes' }), { name: 'TypeError', code: 'ERR_QUOTALEASE_CONFIG' })
})
