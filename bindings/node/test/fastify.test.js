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

// --- concurrency: true: a permit per request in flight ------------------------

function deferred() {
  let resolve
  let reject
  const promise = new Promise((res, rej) => {
    resolve = res
    reject = rej
  })
  promise.catch(() => {}) // a rejection fails only the test awaiting it
  return { promise, resolve, reject }
}

/**
 * A Fastify app over HTTP on port 0 under `rateLimit({ concurrency: true })`
 * (plugin options `options`; `setup(fastify)` runs before it is registered)
 * whose requests to `/*` wait at their path's gate after announcing
 * themselves (`entered`, which fails if the path's response comes first:
 * give each request a path of its own), and whose raw responses' 'close'
 * resolves `closed` (the plugin releases on 'finish' or in that same
 * 'close'). '/boom/N' throws.
 */
async function gatedApp(t, limiter, options = {}, setup = async () => {}) {
  const gates = new Map()
  const entered = new Map()
  const closed = new Map()
  const slot = (map, path) => {
    if (!map.has(path)) map.set(path, deferred())
    return map.get(path)
  }
  // forceCloseConnections: after an aborted fetch, undici opens a connection
  // that never sends a request, which Fastify's default close waits out.
  const fastify = Fastify({ forceCloseConnections: true })
  await setup(fastify)
  await fastify.register(rateLimit, { limiter, key: (req) => req.headers['x-user'] || 'anon', concurrency: true, ...options })
  fastify.addHook('onRequest', async (request, reply) => {
    const path = request.url
    reply.raw.once('close', () => slot(closed, path).resolve())
  })
  fastify.get('/boom/:n', async () => {
    throw new Error('boom')
  })
  fastify.get('/*', async (request) => {
    const path = request.url
    slot(entered, path).resolve()
    await slot(gates, path).promise
    return `done ${path} ${request.rateLimit.remaining}`
  })
  const address = await fastify.listen({ port: 0, host: '127.0.0.1' })
  t.after(async () => {
    for (const gate of gates.values()) gate.resolve() // a failed test leaves none waiting
    await fastify.close()
    await limiter.close()
  })
  return {
    fastify,
    open: (path) => slot(gates, path).resolve(),
    entered: (path) => slot(entered, path).promise,
    closed: (path) => slot(closed, path).promise,
    get: (path, user = 'ann', init = {}) => {
      const response = fetch(`${address}${path}`, { headers: { 'x-user': user }, ...init })
      const answered = () => slot(entered, path).reject(new Error(`${path} was answered without reaching its handler`))
      response.then(answered, answered)
      return response
    },
  }
}

async function assertConcurrencyDenied(r) {
  assert.equal(r.status, 429)
  assert.equal(r.headers.get('retry-after'), '1')
  assert.equal(r.headers.get('ratelimit'), null, 'no RateLimit fields for a permit')
  assert.equal(r.headers.get('ratelimit-policy'), null)
  assert.deepEqual(await r.json(), { statusCode: 429, error: 'Too Many Requests', message: 'Rate limit exceeded, retry in 1 second' })
}

test('fastify concurrency: N in flight, the next gets 429 with Retry-After, a finished request frees its permit', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000, concurrency: 2 }))
  const first = app.get('/a')
  const second = app.get('/b')
  await app.entered('/a')
  await app.entered('/b')
  await assertConcurrencyDenied(await app.get('/no1'))
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
  await assertConcurrencyDenied(await app.get('/no2'))
  app.open('/b')
  app.open('/c')
  assert.deepEqual([(await second).status, (await third).status], [200, 200])
  await app.closed('/b')
  await app.closed('/c')
  app.open('/d')
  app.open('/e')
  const both = await Promise.all([app.get('/d'), app.get('/e')])
  assert.deepEqual(
    both.map((r) => r.status),
    [200, 200],
  )
})

test('fastify concurrency: a handler that throws and an aborted request give their permits back', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000, concurrency: 1 }))
  for (let i = 0; i < 3; i++) {
    // Fastify's error handler answers; the permit is released on 'finish'
    const r = await app.get(`/boom/${i}`)
    assert.equal(r.status, 500, 'the previous request released its permit')
    assert.equal((await r.json()).message, 'boom')
    await app.closed(`/boom/${i}`)
  }
  // the client aborts while its request holds the permit: released on 'close'
  const abort = new AbortController()
  const aborted = app.get('/slow', 'ann', { signal: abort.signal })
  await app.entered('/slow')
  await assertConcurrencyDenied(await app.get('/no'))
  abort.abort()
  await assert.rejects(aborted, { name: 'AbortError' })
  await app.closed('/slow')
  app.open('/other')
  const other = await app.get('/other')
  assert.equal(other.status, 200)
  assert.equal(await other.text(), 'done /other 0')
})

test("fastify concurrency: the request's tier sets its limit; an unknown tier goes to the error handler", async (t) => {
  const limiter = new Limiter({ limit: 1000, concurrency: 3, tiers: 'free=1000/min, 1 concurrent' })
  const app = await gatedApp(t, limiter, { tier: (req) => req.headers['x-tier'] })
  const free = { headers: { 'x-user': 'ann', 'x-tier': 'free' } }
  const first = app.get('/a', 'ann', free)
  await app.entered('/a')
  await assertConcurrencyDenied(await app.get('/b', 'ann', free))
  // no tier: the limiter's concurrency (3)
  const held = [app.get('/c', 'bob'), app.get('/d', 'bob'), app.get('/e', 'bob')]
  for (const path of ['/c', '/d', '/e']) await app.entered(path)
  await assertConcurrencyDenied(await app.get('/f', 'bob'))
  for (const path of ['/a', '/c', '/d', '/e']) app.open(path)
  assert.deepEqual(
    (await Promise.all([first, ...held])).map((r) => r.status),
    [200, 200, 200, 200],
  )
  const gold = await app.get('/g', 'ann', { headers: { 'x-user': 'ann', 'x-tier': 'gold' } })
  assert.equal(gold.status, 500)
  const body = await gold.json()
  assert.equal(body.code, codes.CONFIG)
  assert.match(body.message, /unknown tier "gold"/)
})

test('fastify concurrency: per route, skip, onDenied, and a rate limit in front from a second registration', async (t) => {
  const rates = new Limiter({ limit: 100, windowMs: 60000 })
  const app = await gatedApp(
    t,
    new Limiter({ limit: 1000, concurrency: 1 }),
    {
      skip: (req) => req.url === '/skipped',
      onDenied: (req, reply, decision) => {
        reply.code(503)
        return { busy: true, retryAfterMs: decision.retryAfterMs }
      },
    },
    // the rate limit first: its hook runs before the concurrency plugin's
    (f) => f.register(rateLimit, { limiter: rates, key: (req) => req.headers['x-user'] || 'anon' }),
  )
  t.after(() => rates.close())
  const first = app.get('/a')
  await app.entered('/a')
  const denied = await app.get('/b')
  assert.equal(denied.status, 503)
  assert.equal(denied.headers.get('retry-after'), '1')
  assert.equal(denied.headers.get('ratelimit-policy'), '"default";q=100;w=60', 'the headers of the rate limit')
  const body = await denied.json()
  assert.equal(body.busy, true)
  assert.ok(body.retryAfterMs > 0 && body.retryAfterMs <= 1000, JSON.stringify(body))
  app.open('/skipped')
  assert.equal((await app.get('/skipped')).status, 200, 'skip takes no permit')
  app.open('/a')
  assert.equal((await first).status, 200)
  assert.equal(rates.inspect('ann').admitted, 3)

  // concurrency on one route of a rate-limiting plugin: the plugin's cost does not apply
  const limiter = new Limiter({ limit: 1000, concurrency: 1 })
  const fastify = Fastify()
  t.after(async () => {
    await fastify.close()
    await limiter.close()
  })
  await fastify.register(rateLimit, { limiter, key: () => 'k', cost: 5 })
  const gate = deferred()
  const inside = deferred()
  fastify.get('/export', { config: { rateLimit: { concurrency: true } } }, async (req) => {
    inside.resolve()
    await gate.promise
    return { limit: req.rateLimit.limit }
  })
  fastify.get('/', async (req) => ({ remaining: req.rateLimit.remaining }))
  await fastify.ready()
  const exporting = fastify.inject('/export')
  await inside.promise
  const busy = await fastify.inject('/export')
  assert.equal(busy.statusCode, 429)
  assert.equal(busy.headers['retry-after'], '1')
  assert.equal(busy.headers.ratelimit, undefined)
  gate.resolve()
  const done = await exporting
  assert.equal(done.statusCode, 200)
  assert.deepEqual(done.json(), { limit: 1 })
  assert.equal((await fastify.inject('/export')).statusCode, 200, 'released when the injected response ended')
  assert.deepEqual((await fastify.inject('/')).json(), { remaining: 995 })
})

test('fastify concurrency: a limiter without concurrency goes to the error handler; cost and waitMs are refused', async (t) => {
  const app = await gatedApp(t, new Limiter({ limit: 1000 }))
  const r = await app.get('/')
  assert.equal(r.status, 500)
  const body = await r.json()
  assert.equal(body.code, codes.CONFIG)
  assert.match(body.message, /`concurrency` is 0/)

  const limiter = new Limiter({ limit: 10, concurrency: 1 })
  t.after(() => limiter.close())
  for (const option of [{ cost: 2 }, { cost: () => 1 }, { waitMs: 100 }]) {
    const name = Object.keys(option)[0]
    const message = new RegExp(`\`${name}\` cannot be combined with \`concurrency: true\``)
    await assert.rejects(Fastify().register(rateLimit, { limiter, concurrency: true, ...option }).ready(), { code: codes.CONFIG, message })
    const f = Fastify()
    await f.register(rateLimit, { limiter })
    assert.throws(() => f.get('/x', { config: { rateLimit: { concurrency: true, ...option } } }, async () => 'ok'), {
      code: codes.CONFIG,
      message: new RegExp(`route GET /x.*${message.source}`),
    })
    await f.close()
  }
  await assert.rejects(Fastify().register(rateLimit, { limiter, concurrency: 'yes' }).ready(), {
    name: 'TypeError',
    code: codes.CONFIG,
    message: /`concurrency` must be true or false/,
  })
  const f = Fastify()
  await f.register(rateLimit, { limiter })
  assert.throws(() => f.get('/y', { config: { rateLimit: { concurrency: 1 } } }, async () => 'ok'), { name: 'TypeError', code: codes.CONFIG })
  await f.close()
})
