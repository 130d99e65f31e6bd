'use strict'
// Reserve, then settle (`limiter.reserve` / `reserveSync`, `Reservation`):
// what goes back, what is owed, the typed errors, on memory:// and a real
// redis-server, with manual clocks (the numbers of core/tests/reserve.rs);
// and examples/express-reserve.js over HTTP.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')
const v8 = require('node:v8')
const vm = require('node:vm')

const { Limiter, Reservation, Decision, codes } = require('..')
const { createApp, ESTIMATE } = require('../examples/express-reserve.js')
const { RedisServer, listen, unique } = require('./helpers')

const RESERVATION = { code: codes.RESERVATION }
const COST = { code: codes.INVALID_COST }
const CLOSED = { code: codes.CLOSED }

const server = new RedisServer()
test.after(() => server.stop())

/** memory:// (a name of its own) and the redis-server, each with a manual clock. */
const AUTHORITIES = {
  memory: () => `memory://${unique('rsv')}`,
  redis: () => server.url,
}

function make(url, o = {}) {
  return new Limiter({ url, keyPrefix: unique('rsv'), clock: 'manual', limit: 100, windowMs: 60000, ...o })
}

/** Requests of cost 1 (in `tier`) admitted at this instant until the first denial. */
function drain(l, key, tier) {
  let n = 0
  while (l.acquireSync(key, 1, { tier }).allowed) {
    n += 1
    assert.ok(n <= 10000, 'never denied')
  }
  return n
}

/** A full garbage collection (V8's `gc`, exposed at run time). */
function collectGarbage() {
  v8.setFlagsFromString('--expose-gc')
  vm.runInNewContext('gc')()
}

for (const [name, url] of Object.entries(AUTHORITIES)) {
  test(`${name}: settled below its estimate, the rest goes back (exactly)`, async () => {
    const l = make(url())
    const r = await l.reserve('k', 40)
    assert.ok(r instanceof Reservation)
    assert.equal(r.allowed, true)
    assert.ok(r.decision instanceof Decision)
    assert.equal(r.decision.allowed, true)
    assert.equal(r.decision.limit, 100)
    assert.equal(r.decision.reason, 'lease')
    assert.deepEqual(r.decision.rules, [{ limit: 100, windowMs: 60000 }])
    assert.equal(r.estimate, 40)
    assert.equal(r.key, 'k')
    assert.equal(r.settled, false)
    assert.equal(r.settle(10), undefined)
    assert.equal(r.settled, true)
    assert.equal(drain(l, 'k'), 90, 'the key spent what was used, 10')
    assert.equal(l.metrics().tokens_debited, 0)
    await l.close()
  })

  test(`${name}: settled above its estimate, the key owes the rest until the refill pays it`, async () => {
    const l = make(url())
    const r = await l.reserve('k', 10)
    assert.equal(r.allowed, true)
    r.settle(150)
    assert.equal(l.metrics().tokens_debited, 140)
    l.settle() // the debit reached the authority
    assert.equal(l.acquireSync('k').allowed, false, 'in debt')
    l.advanceClock(29000)
    assert.equal(l.acquireSync('k').allowed, false, '48 of 50 paid')
    l.advanceClock(2000)
    assert.equal(l.acquireSync('k').allowed, true, 'paid, and a token refilled')
    await l.close()
  })

  test(`${name}: never settled, held or collected, a reservation keeps its estimate`, async () => {
    const l = make(url())
    const held = l.reserveSync('held', 40)
    assert.equal(drain(l, 'held'), 60)
    assert.equal(held.settled, false)
    ;(() => {
      assert.equal(l.reserveSync('dropped', 40).allowed, true)
    })()
    collectGarbage()
    await new Promise(setImmediate) // a turn of the loop for deferred finalizers
    assert.equal(drain(l, 'dropped'), 60)
    assert.equal(l.inspect('dropped').localTokens, 0)
    assert.equal(l.metrics().tokens_debited, 0)
    await l.close()
  })

  test(`${name}: reserveSync, and a tier whose every rule is settled`, async () => {
    const l = make(url(), { tiers: 'two=100/min, 120/hour' })
    const r = l.reserveSync('m', 40, { tier: 'two' })
    assert.ok(r instanceof Reservation)
    assert.equal(r.allowed, true)
    assert.deepEqual(r.decision.rules, [{ limit: 100, windowMs: 60000 }, { limit: 120, windowMs: 3600000 }])
    r.settle(10)
    assert.equal(drain(l, 'm', 'two'), 90, 'the minute rule got its 30 back')
    const a = l.reserveSync('a', 5, { tier: null })
    assert.equal(a.decision.rules.length, 1, 'no tier: limit per windowMs')
    a.settle(5)
    await l.close()
  })

  test(`${name}: settle twice, a denied reservation, a closed limiter`, async () => {
    const l = make(url(), { limit: 10 })
    const r = await l.reserve('k', 10)
    r.settle(10)
    assert.throws(() => r.settle(5), { name: 'Error', code: codes.RESERVATION, message: /settled already/ })
    const denied = await l.reserve('k', 1)
    assert.equal(denied.allowed, false)
    assert.equal(denied.decision.reason, 'exhausted')
    assert.ok(denied.decision.retryAfterMs > 0)
    assert.throws(() => denied.settle(0), { code: codes.RESERVATION, message: /denied/ })
    assert.equal(l.reserveSync('k', 1).allowed, false)
    const open = l.reserveSync('other', 2)
    await l.close()
    assert.throws(() => open.settle(1), CLOSED)
    assert.throws(() => l.reserveSync('k', 1), CLOSED)
    await assert.rejects(l.reserve('k', 1), CLOSED)
  })
}

test('bad estimates: the checks of a cost, as acquire makes them', async () => {
  const l = make(AUTHORITIES.memory(), { limit: 10 })
  const calls = { reserveSync: (...a) => l.reserveSync(...a), reserve: (...a) => l.reserve(...a) }
  for (const [name, call] of Object.entries(calls)) {
    const check = async (args, expected) => {
      if (name === 'reserve') {
        let p
        assert.doesNotThrow(() => {
          p = call(...args)
        }, 'the Promise API rejects, it never throws')
        await assert.rejects(p, expected, `${name}(${args.map(String)})`)
      } else {
        assert.throws(() => call(...args), expected, `${name}(${args.map(String)})`)
      }
    }
    await check(['k', 0], { code: codes.INVALID_COST, message: /invalid cost 0: must be at least 1 and at most the key's limit \(10\)/ })
    await check(['k', 11], { code: codes.INVALID_COST, message: /invalid cost 11/ })
    for (const bad of [1.5, -1, NaN, Infinity, 2 ** 53]) {
      await check(['k', bad], { name: 'RangeError', ...COST, message: /whole number/ })
    }
    for (const bad of ['3', undefined, null, true, 3n, { tier: 'x' }]) {
      await check(['k', bad], { name: 'TypeError', ...COST, message: /the estimate must be a number/ })
    }
    await check([5, 1], { name: 'TypeError', code: codes.INVALID_KEY })
    await check(['', 1], { code: codes.INVALID_KEY, message: /the key is empty/ })
    await check(['k', 1, 'pro'], { name: 'TypeError', code: codes.CONFIG, message: /options must be an object/ })
    await check(['k', 1, { waitMs: 5 }], { code: codes.CONFIG, message: /unknown option `waitMs` \(known: tier\)/ })
    await check(['k', 1, { tier: 5 }], { name: 'TypeError', code: codes.CONFIG, message: /the tier must be a string/ })
    await check(['k', 1, { tier: 'nope' }], { code: codes.CONFIG, message: /unknown tier "nope"/ })
  }
  assert.equal(l.metrics().admitted, 0, 'nothing was reserved')
  await l.close()
})

test('bad actuals: a typed error, the reservation still unsettled', async () => {
  const l = make(AUTHORITIES.memory())
  const r = await l.reserve('k', 40)
  // A negative whole number: the engine's message, as in every language.
  assert.throws(() => r.settle(-3), {
    name: 'RangeError',
    ...RESERVATION,
    message: 'invalid settle: actual must be a whole number of tokens, 0 or more (got -3)',
  })
  assert.throws(() => r.settle(1.5), { name: 'RangeError', ...RESERVATION, message: /whole number of tokens, 0 or more \(got 1\.5\)/ })
  assert.throws(() => r.settle(NaN), { name: 'RangeError', ...RESERVATION, message: /\(got NaN\)/ })
  assert.throws(() => r.settle(Infinity), { name: 'RangeError', ...RESERVATION, message: /\(got Infinity\)/ })
  assert.throws(() => r.settle(-Infinity), { name: 'RangeError', ...RESERVATION, message: /\(got -Infinity\)/ })
  assert.throws(() => r.settle(2 ** 53), { name: 'RangeError', ...RESERVATION })
  for (const bad of ['3', undefined, null, true, 3n, {}, [3]]) {
    assert.throws(() => r.settle(bad), { name: 'TypeError', ...RESERVATION, message: /actual must be a number/ }, String(bad))
  }
  assert.equal(r.settled, false, 'a refused actual settles nothing')
  r.settle(0)
  assert.equal(r.settled, true)
  assert.equal(drain(l, 'k'), 100, 'settled at 0: the key spent nothing')
  assert.throws(() => new Reservation({}), { name: 'TypeError', code: codes.CONFIG, message: /limiter\.reserve\(\)/ })
  await l.close()
})

test('a reservation in console.log shows its key, estimate and state', async () => {
  const l = make(AUTHORITIES.memory())
  const r = l.reserveSync('user:1', 3)
  assert.equal(require('node:util').inspect(r), "Reservation { key: 'user:1', estimate: 3, allowed: true, settled: false }")
  await l.close()
})

test('redis: reserve on a cold key waits for the lease without blocking the event loop', async () => {
  const own = new RedisServer()
  const l = new Limiter({ url: own.url, limit: 100, windowMs: 60000, backendTimeoutMs: 5000 })
  own.pause()
  try {
    let turns = 0
    let settled = false
    const p = l.reserve('cold', 5).then((r) => {
      settled = true
      return r
    })
    // If reserve blocked the loop, no turn could pass before it resolved.
    for (; turns < 5; turns++) await new Promise(setImmediate)
    assert.equal(settled, false, 'reserve should still be waiting on the paused Redis')
    own.resume()
    const r = await p
    assert.ok(r instanceof Reservation)
    assert.ok(['lease', 'fallback'].includes(r.decision.reason), r.decision.reason)
    r.settle(1)
  } finally {
    own.resume()
    await l.close()
    own.stop()
  }
})

// examples/express-reserve.js

/** GET `url`, reading the whole body: `{ status, headers, bytes }`. */
async function get(url, headers) {
  const r = await fetch(url, { headers })
  const body = Buffer.from(await r.arrayBuffer())
  return { status: r.status, headers: r.headers, bytes: body.length, body }
}

test('the Express example charges a key the bytes it streamed, not the estimate', async (t) => {
  const limit = 20000
  const limiter = new Limiter({ url: AUTHORITIES.memory(), limit, windowMs: 3600000, clock: 'manual' })
  const srv = await listen(createApp(limiter))
  t.after(async () => {
    await srv.close()
    await limiter.close()
  })
  const r = await get(`${srv.base}/stream?kb=3`, { 'x-api-key': 'alice' })
  assert.equal(r.status, 200)
  assert.equal(r.bytes, 3 * 1024)
  assert.equal(r.headers.get('ratelimit-policy'), `"default";q=${limit};w=3600`)
  // Settled at 3072 of 16384 reserved: exactly the rest of the key is left.
  assert.equal(limiter.acquireSync('alice', limit - 3 * 1024).allowed, true, 'charged the estimate, not the bytes sent')
  assert.equal(limiter.acquireSync('alice', 1).allowed, false, 'charged less than the bytes sent')
  assert.equal(limiter.metrics().tokens_debited, 0)

  // Above the estimate: 20 KiB streamed on a 16 KiB reservation; the key owes the 4 KiB more.
  const big = await get(`${srv.base}/stream?kb=20`, { 'x-api-key': 'bob' })
  assert.equal(big.status, 200)
  assert.equal(big.bytes, 20 * 1024)
  assert.equal(limiter.metrics().tokens_debited, 20 * 1024 - ESTIMATE)
  // Now bob cannot afford another estimate: 429, nothing reserved.
  const denied = await get(`${srv.base}/stream?kb=1`, { 'x-api-key': 'bob' })
  assert.equal(denied.status, 429)
  assert.ok(Number(denied.headers.get('retry-after')) > 0)
  assert.equal(JSON.parse(denied.body).error, 'byte budget spent')
})

test('the Express example runs as a program and exits on SIGTERM', async () => {
  const child = spawn(process.execPath, [path.join(__dirname, '..', 'examples', 'express-reserve.js')], {
    env: { ...process.env, PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let out = ''
  let err = ''
  child.stderr.on('data', (b) => (err += b))
  // Hang guard, not a timing assertion: a child that never exits is killed (and fails).
  const guard = setTimeout(() => child.kill('SIGKILL'), 30000)
  const exited = new Promise((resolve) => child.on('exit', resolve)).finally(() => clearTimeout(guard))
  const url = await new Promise((resolve, reject) => {
    child.stdout.on('data', (b) => {
      out += b
      const m = out.match(/listening on (\S+)/)
      if (m) resolve(m[1])
    })
    child.on('exit', () => reject(new Error(`the example exited before listening: ${err}`)))
  })
  const r = await get(`${url}/stream?kb=2`, { 'x-api-key': 'k1' })
  assert.equal(r.status, 200)
  assert.equal(r.bytes, 2048)
  assert.equal(r.headers.get('ratelimit-policy'), '"default";q=1000000;w=3600')
  child.kill('SIGTERM')
  assert.equal(await exited, 0, err)
})
