'use strict'
// quotalease/fastify in a real Fastify app: through fastify.inject and over
// HTTP on a loopback port.

const test = require('node:test')
const assert = require('node:assert/strict')
const Fastify = require('fastify')

const { Limiter, httpKey, codes } = require('..')
const rateLimit = require('../fastify')

async function app(t, pluginOptions, routes) {
  const fastify = Fastify()
  await fastify.register(rateLimit, pluginOptions)
  routes(fastify)
  await fastify.ready()
  t.after(() => fastify.close())
  return fastify
}

test('fastify: headers on every response, 429 with Retry-After when denied (inject)', async (t) => {
  const limiter = new Limiter({ limit: 3, windowMs: 60000, leaseSize: 1 })
  t.after(() => limiter.close())
  let reached = 0
  const fastify = await app(t, { limiter, key: (req) => req.headers['x-api-key'] || req.ip }, (f) => {
    f.get('/', async (req) => {
      reached++
      return { remaining: req.rateLimit.remaining }
    })
  })

  for (let i = 0; i < 3; i++) {
    const r = await fastify.inject({ url: '/', headers: { 'x-api-key': 'alice' } })
    assert.equal(r.statusCode, 200)
    assert.equal(r.headers['ratelimit-policy'], '"default";q=3;w=60')
    assert.match(r.headers.ratelimit, new RegExp(`^"default";r=${2 - i};t=\\d+$`))
    assert.equal(r.headers['retry-after'], undefined)
    assert.deepEqual(r.json(), { remaining: 2 - i })
  }
  const denied = await fastify.inject({ url: '/', headers: { 'x-api-key': 'alice' } })
  assert.equal(denied.statusCode, 429)
  assert.match(denied.headers['retry-after'], /^[1-9]\d*$/)
  assert.match(denied.headers.ratelimit, /^"default";r=0;t=\d+$/)
  const s = Number(denied.headers['retry-after'])
  assert.deepEqual(denied.json(), {
    statusCode: 429,
    error: 'Too Many Requests',
    message: `Rate limit exceeded, retry in ${s} second${s === 1 ? '' : 's'}`,
  })
  assert.equal(reached, 3, 'a denied request reached the handler')

  // Another key has its own budget; the default is the client address.
  assert.equal((await fastify.inject({ url: '/', headers: { 'x-api-key': 'bob' } })).statusCode, 200)
})

test('fastify: over real HTTP on port 0', async (t) => {
  const limiter = new Limiter({ limit: 2, windowMs: 60000, leaseSize: 1 })
  t.after(() => limiter.close())
  const fastify = await app(t, { limiter }, (f) => {
    f.get('/hello', async (req) => ({ hello: 'world', reason: req.rateLimit.reason }))
  })
  const address = await fastify.listen({ port: 0, host: '127.0.0.1' })
  // The default key is the client address: every fetch below shares it.
  for (let i = 0; i < 2; i++) {
    const r = await fetch(`${address}/hello`)
    assert.equal(r.status, 200)
    assert.equal(r.headers.get('ratelimit-policy'), '"default";q=2;w=60')
    assert.deepEqual(await r.json(), { hello: 'world', reason: 'lease' })
  }
  const denied = await fetch(`${address}/hello`)
  assert.equal(denied.status, 429)
  assert.match(denied.headers.get('retry-after'), /^[1-9]\d*$/)
  assert.equal((await denied.json()).error, 'Too Many Requests')
  assert.equal(limiter.inspect('127.0.0.1').denied, 1)
})

test('fastify: per-route config, cost, skip, onDenied, and errors', async (t) => {
  const limiter = new Limiter({ limit: 10, windowMs: 60000, leaseSize: 1 })
  const strict = new Limiter({ limit: 1, windowMs: 1000, leaseSize: 1 })
  t.after(() => Promise.all([limiter.close(), strict.close()]))
  const fastify = await app(
    t,
    {
      limiter,
      key: (req) => 'shared',
      cost: (req) => (req.url === '/expensive' ? 6 : 1),
      skip: (req) => req.url === '/health',
    },
    (f) => {
      f.get('/expensive', async () => 'ok')
      f.get('/health', async () => 'ok')
      f.get('/free', { config: { rateLimit: false } }, async () => 'ok')
      f.get('/strict', { config: { rateLimit: { limiter: strict, key: async () => 'strict', cost: 1 } } }, async () => 'ok')
      f.get('/custom', {
        config: {
          rateLimit: {
            limiter: strict,
            key: () => 'custom',
            onDenied: (req, reply, decision) => {
              reply.code(503)
              return { error: 'slow down', retryAfterMs: decision.retryAfterMs }
            },
          },
        },
      }, async () => 'ok')
      f.get('/sends', {
        config: { rateLimit: { limiter: strict, key: () => 'sends', onDenied: (req, reply) => reply.code(429).type('text/plain').send('nope') } },
      }, async () => 'ok')
      f.get('/nokey', { config: { rateLimit: { key: () => '' } } }, async () => 'ok')
      f.get('/long', { config: { rateLimit: { limiter: strict, key: () => 'k'.repeat(2000) } } }, async () => 'ok')
    },
  )

  const health = await fastify.inject('/health')
  assert.equal(health.statusCode, 200)
  assert.equal(health.headers.ratelimit, undefined)
  const free = await fastify.inject('/free')
  assert.equal(free.statusCode, 200)
  assert.equal(free.headers.ratelimit, undefined)

  assert.equal((await fastify.inject('/expensive')).statusCode, 200)
  assert.equal((await fastify.inject('/expensive')).statusCode, 429, '6 + 6 > 10')
  assert.equal(limiter.inspect('shared').admitted, 1)

  assert.equal((await fastify.inject('/strict')).statusCode, 200)
  const strictDenied = await fastify.inject('/strict')
  assert.equal(strictDenied.statusCode, 429)
  assert.equal(strictDenied.headers['ratelimit-policy'], '"default";q=1;w=1')

  assert.equal((await fastify.inject('/custom')).statusCode, 200)
  const custom = await fastify.inject('/custom')
  assert.equal(custom.statusCode, 503)
  assert.equal(custom.json().error, 'slow down')
  assert.equal(typeof custom.json().retryAfterMs, 'number')
  assert.match(custom.headers['retry-after'], /^[1-9]\d*$/)

  assert.equal((await fastify.inject('/sends')).statusCode, 200)
  const sends = await fastify.inject('/sends')
  assert.equal(sends.statusCode, 429)
  assert.equal(sends.body, 'nope')
  assert.ok(sends.headers.ratelimit)

  // A limiter error goes to Fastify's error handler.
  const nokey = await fastify.inject('/nokey')
  assert.equal(nokey.statusCode, 500)
  assert.equal(nokey.json().code, codes.INVALID_KEY)

  // An over-long key is limited under its sha256 key.
  assert.equal((await fastify.inject('/long')).statusCode, 200)
  assert.equal((await fastify.inject('/long')).statusCode, 429)
  assert.equal(strict.inspect(httpKey('k'.repeat(2000))).admitted, 1)
})

test('fastify: global: false limits only the routes that ask', async (t) => {
  const limiter = new Limiter({ limit: 1, windowMs: 60000, leaseSize: 1 })
  t.after(() => limiter.close())
  const fastify = await app(t, { limiter, global: false, key: () => 'k' }, (f) => {
    f.get('/open', async () => 'ok')
    f.get('/limited', { config: { rateLimit: true } }, async () => 'ok')
  })
  for (let i = 0; i < 3; i++) assert.equal((await fastify.inject('/open')).statusCode, 200)
  assert.equal((await fastify.inject('/limited')).statusCode, 200)
  assert.equal((await fastify.inject('/limited')).statusCode, 429)
})

test('fastify: bad options are ERR_QUOTALEASE_CONFIG errors', async () => {
  const limiter = new Limiter({ limit: 1 })
  try {
    await assert.rejects(Fastify().register(rateLimit, {}).ready(), { name: 'TypeError', code: codes.CONFIG, message: /`limiter` must be a quotalease Limiter/ })
    await assert.rejects(Fastify().register(rateLimit, { limiter, keyGenerator: () => 'x' }).ready(), { code: codes.CONFIG, message: /unknown option `keyGenerator`/ })
    await assert.rejects(Fastify().register(rateLimit, { limiter, global: 'yes' }).ready(), { name: 'TypeError', code: codes.CONFIG })
    const f = Fastify()
    await f.register(rateLimit, { limiter })
    assert.throws(() => f.get('/x', { config: { rateLimit: 5 } }, async () => 'ok'), { name: 'TypeError', code: codes.CONFIG, message: /route GET \/x.*config.rateLimit must be an object/ })
    assert.throws(() => f.get('/y', { config: { rateLimit: { max: 5 } } }, async () => 'ok'), { code: codes.CONFIG, message: /unknown option `max`/ })
    assert.throws(() => f.get('/z', { config: { rateLimit: { cost: '1' } } }, async () => 'ok'), { name: 'TypeError', code: codes.CONFIG })
    await f.close()
  } finally {
    await limiter.close()
  }
})

test('fastify: tier plugin-wide or per route, a string or a function; two rules give two policies', async (t) => {
  const limiter = new Limiter({ limit: 100, windowMs: 60000, leaseSize: 1, tiers: 'free=2/min; pro=5/s, 20/min' })
  t.after(() => limiter.close())
  const plans = { alice: 'pro', mallory: 'gold' }
  const fastify = await app(t, { limiter, key: (req) => req.headers['x-user'] || 'anon', tier: (req) => plans[req.headers['x-user']] }, (f) => {
    f.get('/', async (req) => ({ limit: req.rateLimit.limit, rule: req.rateLimit.rule }))
    f.get('/free', { config: { rateLimit: { key: () => 'free-route', tier: 'free' } } }, async (req) => ({ limit: req.rateLimit.limit }))
  })

  const pro = await fastify.inject({ url: '/', headers: { 'x-user': 'alice' } })
  assert.equal(pro.statusCode, 200)
  assert.equal(pro.headers['ratelimit-policy'], '"1s";q=5;w=1, "1min";q=20;w=60')
  assert.match(pro.headers.ratelimit, /^"1s";r=4;t=\d+$/)
  assert.deepEqual(pro.json(), { limit: 5, rule: 0 })

  const anon = await fastify.inject({ url: '/' })
  assert.equal(anon.headers['ratelimit-policy'], '"default";q=100;w=60')

  for (let i = 0; i < 2; i++) {
    const r = await fastify.inject({ url: '/free' })
    assert.equal(r.statusCode, 200)
    assert.equal(r.headers['ratelimit-policy'], '"default";q=2;w=60')
  }
  assert.equal((await fastify.inject({ url: '/free' })).statusCode, 429)
  assert.equal(limiter.inspect('free-route').tier, 'free')

  const unknown = await fastify.inject({ url: '/', headers: { 'x-user': 'mallory' } })
  assert.equal(unknown.statusCode, 500)
  assert.equal(unknown.json().code, codes.CONFIG)
  assert.match(unknown.json().message, /unknown tier "gold"/)

  // The same over real HTTP.
  const address = await fastify.listen({ port: 0, host: '127.0.0.1' })
  const r = await fetch(`${address}/`, { headers: { 'x-user': 'alice' } })
  assert.equal(r.status, 200)
  assert.equal(r.headers.get('ratelimit-policy'), '"1s";q=5;w=1, "1min";q=20;w=60')
  assert.match(r.headers.get('ratelimit'), /^"1s";r=\d+;t=\d+$/)
})

test('fastify and express: a tier that is neither a string nor a function is a TypeError at setup', async () => {
  const limiter = new Limiter({ limit: 1, tiers: 'free=1/s' })
  try {
    await assert.rejects(Fastify().register(rateLimit, { limiter, tier: 5 }).ready(), { name: 'TypeError', code: codes.CONFIG, message: /`tier` must be a string or a function/ })
    const f = Fastify()
    await f.register(rateLimit, { limiter })
    assert.throws(() => f.get('/t', { config: { rateLimit: { tier: ['free'] } } }, async () => 'ok'), { name: 'TypeError', code: codes.CONFIG, message: /`tier` must be a string or a function/ })
    await f.close()
    const { rateLimit: expressRateLimit } = require('../express')
    assert.throws(() => expressRateLimit({ limiter, tier: { name: 'free' } }), { name: 'TypeError', code: codes.CONFIG, message: /`tier` must be a string or a function/ })
  } finally {
    await limiter.close()
  }
})

test('fastify: waitMs per plugin or route waits for the refill instead of a 429', async (t) => {
  const limiter = new Limiter({ limit: 2, windowMs: 1000, leaseSize: 1 })
  const fastify = Fastify()
  t.after(async () => {
    await fastify.close()
    await limiter.close()
  })
  await fastify.register(rateLimit, { limiter, key: () => 'k', waitMs: 30000 })
  fastify.get('/', async () => 'ok')
  fastify.get('/nowait', { config: { rateLimit: { waitMs: 0, key: () => 'other' } } }, async () => 'ok')
  const codes = []
  for (let i = 0; i < 3; i++) codes.push((await fastify.inject({ url: '/' })).statusCode)
  assert.deepEqual(codes, [200, 200, 200])
  const nowait = []
  for (let i = 0; i < 3; i++) nowait.push((await fastify.inject({ url: '/nowait' })).statusCode)
  assert.deepEqual(nowait, [200, 200, 429])
})
