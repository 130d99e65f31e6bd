'use strict'
// Every bad input gets a clear error with a stable `code`: never a crash, a
// hang or a silent default.

const test = require('node:test')
const assert = require('node:assert/strict')

const { Limiter, headers, parseRate, codes } = require('..')
const { rateLimit } = require('../express')

const CONFIG = { code: codes.CONFIG }
const KEY = { code: codes.INVALID_KEY }
const COST = { code: codes.INVALID_COST }
const CLOSED = { code: codes.CLOSED }

test('options that are not an object', () => {
  for (const o of [undefined, null, 5, 'limit=5', [], true]) {
    assert.throws(() => new Limiter(o), { name: 'TypeError', code: codes.CONFIG, message: /options must be an object/ })
  }
})

test('unknown options are errors, with the engine\'s suggestion in the caller\'s spelling', () => {
  assert.throws(() => new Limiter({ limt: 5 }), { code: codes.CONFIG, message: /unknown option `limt`; did you mean `limit`\?/ })
  assert.throws(() => new Limiter({ limit: 5, leaseSise: 3 }), {
    name: 'Error',
    code: codes.CONFIG,
    message: /^invalid configuration: unknown option `leaseSise`; did you mean `leaseSize`\?$/,
  })
  assert.throws(() => new Limiter({ limit: 5, lease_sise: 3 }), { code: codes.CONFIG, message: /did you mean `lease_size`\?/ })
  assert.throws(() => new Limiter({ limit: 5, windowMS: 1000 }), { code: codes.CONFIG, message: /did you mean `windowMs`\?/ })
  assert.throws(() => new Limiter({ limit: 5, zzzzzz: 1 }), { code: codes.CONFIG, message: /the options are url, limit/ })
  // The name is checked before the value's type.
  assert.throws(() => new Limiter({ limit: 5, leaseSise: true }), { code: codes.CONFIG, message: /did you mean `leaseSize`/ })
  // The engine's own (snake_case) names are options too.
  const l = new Limiter({ limit: 5, window_ms: 1000, lease_size: 2 })
  assert.equal(l.acquireSync('k').windowMs, 1000)
  assert.equal(l.leaseSize, 2)
  l.closeSync()
})

const NUMERIC = ['limit', 'windowMs', 'leaseSize', 'refillThreshold', 'leaseTtlMs', 'expectedReplicas', 'backendTimeoutMs', 'maxKeys', 'clockStartMs']
const STRINGS = ['url', 'rate', 'onBackendFailure', 'keyPrefix', 'mode', 'clock']
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)

test('options of a JS type the engine does not read are TypeErrors with a code', () => {
  for (const name of NUMERIC) {
    for (const bad of [true, {}, 5n, [], () => 5]) {
      assert.throws(() => new Limiter({ limit: 5, [name]: bad }), { name: 'TypeError', code: codes.CONFIG, message: new RegExp(`\`${name}\` must be a number`) }, `${name}=${String(bad)}`)
    }
  }
  for (const name of STRINGS) {
    for (const bad of [true, 5n, []]) {
      assert.throws(() => new Limiter({ limit: 5, [name]: bad }), { name: 'TypeError', code: codes.CONFIG, message: new RegExp(`\`${name}\` must be a string`) }, `${name}=${String(bad)}`)
    }
  }
  assert.throws(() => new Limiter({ limit: 5, onEvent: 'log' }), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => new Limiter({ limit: 5, clock: {} }), { name: 'TypeError', code: codes.CONFIG, message: /manualStartMs/ })
})

test('numbers and strings the engine cannot use are config errors naming the option', () => {
  for (const name of NUMERIC) {
    for (const bad of ['5', 1.5, -1, NaN, Infinity]) {
      assert.throws(() => new Limiter({ limit: 5, [name]: bad }), { code: codes.CONFIG, message: new RegExp(`\`${snake(name)}\` must be a (whole number|non-negative integer)`) }, `${name}=${String(bad)}`)
    }
  }
  for (const name of STRINGS) {
    assert.throws(() => new Limiter({ limit: 5, [name]: 5 }), { code: codes.CONFIG, message: new RegExp(`\`${snake(name)}\` must be a string \\(got 5\\)`) })
  }
  for (const clock of ['fast', { manualStartMs: -1 }, { manualStartMs: '0' }]) {
    assert.throws(() => new Limiter({ limit: 5, clock }), CONFIG, JSON.stringify(clock))
  }
  // undefined and null leave the default.
  const l = new Limiter({ limit: 5, leaseSize: null, mode: undefined, clock: null, onEvent: null })
  assert.equal(l.acquireSync('k').reason, 'lease')
  assert.throws(() => l.advanceClock(1), { code: codes.CONFIG, message: /needs clock = manual/ })
  l.closeSync()
})

test('invalid option values are config errors that name the option', () => {
  const cases = [
    [{}, /`limit` must be at least 1/],
    [{ limit: 0 }, /`limit` must be at least 1/],
    [{ limit: 5, windowMs: 0 }, /`window_ms` must be at least 1/],
    [{ limit: 2 ** 40, windowMs: 2 ** 20 }, /`limit` times window_ms/],
    [{ limit: 5, leaseSize: 6 }, /`lease_size` must be between 1 and limit/],
    [{ limit: 5, leaseSize: 0 }, /`lease_size`/],
    [{ limit: 5, leaseSize: 2, refillThreshold: 3 }, /`refill_threshold`/],
    [{ limit: 5, leaseTtlMs: 0 }, /`lease_ttl_ms`/],
    [{ limit: 5, expectedReplicas: 0 }, /`expected_replicas`/],
    [{ limit: 5, backendTimeoutMs: 0 }, /`backend_timeout_ms`/],
    [{ limit: 5, backendTimeoutMs: 60001 }, /`backend_timeout_ms`/],
    [{ limit: 5, keyPrefix: 'a{b' }, /`key_prefix`/],
    [{ limit: 5, keyPrefix: 'p'.repeat(65) }, /`key_prefix`/],
    [{ limit: 5, maxKeys: 0 }, /`max_keys`/],
    [{ limit: 5, mode: 'sideways' }, /`mode` must be one of "lease" "exact" "local"/],
    [{ limit: 5, onBackendFailure: 'panic' }, /`on_backend_failure` must be one of/],
    [{ limit: 5, url: 'http://localhost' }, /`url` "http:\/\/localhost" has an unknown scheme/],
    [{ limit: 5, url: '' }, /`url`/],
    [{ limit: 5, url: 'redis://:99999999' }, /`url`.*not a valid Redis URL/],
    [{ limit: 5, url: 'redis+cluster://' }, /`url`/],
    [{ rate: '10' }, /`rate` must look like/],
    [{ rate: 'x/min' }, /`rate`/],
    [{ rate: '10/fortnight' }, /`rate`/],
    [{ rate: '0/min' }, /`limit` must be at least 1/],
    [{ rate: '10/s', limit: 5 }, /`rate` cannot be combined with `limit` or `window_ms`/],
    [{ windowMs: 1000, rate: '10/s' }, /`rate` cannot be combined/],
    // One option under both spellings: an error naming both, not the last one silently.
    [{ limit: 10, windowMs: 2000, window_ms: 1000 }, /`window_ms` was given twice, as `windowMs` and as `window_ms`/],
    [{ rate: '10/MIN' }, /`rate` must look like .*one of ms, s \(sec, secs, second, seconds\), m \(min/],
    [{ limit: 5, clockStartMs: 5 }, /`clock_start_ms` needs `clock` = "manual"/],
  ]
  for (const [o, message] of cases) {
    assert.throws(() => new Limiter(o), { code: codes.CONFIG, message }, JSON.stringify(o))
  }
})

const limiter = () => new Limiter({ limit: 10, windowMs: 1000 })
const calls = {
  acquireSync: (l, ...a) => l.acquireSync(...a),
  tryAcquire: (l, ...a) => l.tryAcquire(...a),
  acquire: (l, ...a) => l.acquire(...a),
}

async function check(call, l, args, expected) {
  if (call === calls.acquire) {
    // The Promise API never throws synchronously: it rejects.
    let p
    assert.doesNotThrow(() => {
      p = call(l, ...args)
    })
    await assert.rejects(p, expected)
  } else {
    assert.throws(() => call(l, ...args), expected)
  }
}

test('keys: wrong type, empty, too long', async () => {
  const l = limiter()
  for (const [name, call] of Object.entries(calls)) {
    for (const key of [undefined, null, 5, {}, ['k'], Symbol('k'), () => 'k']) {
      await check(call, l, [key], { name: 'TypeError', code: codes.INVALID_KEY, message: /the key must be a string/ })
    }
    await check(call, l, [''], { code: codes.INVALID_KEY, message: /the key is empty/ })
    await check(call, l, ['x'.repeat(513)], { code: codes.INVALID_KEY, message: /513 bytes long; at most 512/ })
    // Bytes, not characters: 200 euro signs are 600 bytes of UTF-8.
    await check(call, l, ['€'.repeat(200)], { code: codes.INVALID_KEY, message: /600 bytes long/ })
    await check(call, l, ['x'.repeat(100000)], { code: codes.INVALID_KEY, message: /100000 bytes long/ })
    assert.equal((await call(l, 'x'.repeat(512))).allowed, true, name)
    assert.equal((await call(l, 'ключ-€-🔑')).allowed, true, name)
  }
  l.closeSync()
})

test('costs: wrong type, not whole, 0, above the limit', async () => {
  const l = limiter()
  for (const call of Object.values(calls)) {
    // (A plain object in the cost's place is the options object: `acquire(key, { tier })`.)
    for (const cost of ['1', null, true, ['1'], 1n]) {
      await check(call, l, ['k', cost], { name: 'TypeError', code: codes.INVALID_COST, message: /the cost must be a number/ })
    }
    await check(call, l, ['k', { cost: 2 }], { code: codes.CONFIG, message: /unknown option `cost` \(known: tier, waitMs\)/ })
    for (const cost of [1.5, -1, NaN, Infinity, -Infinity, 2 ** 53]) {
      await check(call, l, ['k', cost], { name: 'RangeError', code: codes.INVALID_COST, message: /whole number/ })
    }
    await check(call, l, ['k', 0], { code: codes.INVALID_COST, message: /invalid cost 0: must be at least 1 and at most the key's limit \(10\)/ })
    await check(call, l, ['k', 11], { code: codes.INVALID_COST, message: /invalid cost 11/ })
  }
  l.closeSync()
})

test('setLimit, advanceClock, inspect, headers and parseRate check their arguments', () => {
  const l = limiter()
  assert.throws(() => l.setLimit(5, 10, 1000), KEY)
  assert.throws(() => l.setLimit('', 10, 1000), KEY)
  assert.throws(() => l.setLimit('k', 0, 1000), { code: codes.CONFIG, message: /`limit` must be at least 1/ })
  assert.throws(() => l.setLimit('k', 10, 0), { code: codes.CONFIG, message: /`window_ms`/ })
  assert.throws(() => l.setLimit('k', 10), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => l.setLimit('k', '10'), { code: codes.CONFIG, message: /`rate` must look like/ })
  assert.throws(() => l.setLimit('k', null, 1000), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => l.setLimit('k', 1.5, 1000), { name: 'RangeError', code: codes.CONFIG })
  assert.throws(() => l.advanceClock(10), { code: codes.CONFIG, message: /needs clock = manual/ })
  assert.throws(() => l.advanceClock('10'), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => l.advanceClock(-1), { name: 'RangeError', code: codes.CONFIG })
  assert.throws(() => l.inspect(''), KEY)
  assert.throws(() => l.inspect(7), { name: 'TypeError', code: codes.INVALID_KEY })
  assert.throws(() => headers(null), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => headers({ allowed: true }), CONFIG)
  assert.throws(() => parseRate(600), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => parseRate('600 per minute'), { code: codes.CONFIG, message: /`rate` must look like/ })
  l.closeSync()
})

test('use after close fails with ERR_QUOTALEASE_CLOSED; close is idempotent', async () => {
  const l = limiter()
  l.acquireSync('k')
  await l.close()
  await l.close()
  l.closeSync()
  assert.throws(() => l.acquireSync('k'), CLOSED)
  assert.throws(() => l.tryAcquire('k'), CLOSED)
  await assert.rejects(l.acquire('k'), CLOSED)
  assert.throws(() => l.reserveSync('k', 1), CLOSED)
  await assert.rejects(l.reserve('k', 1), CLOSED)
  assert.throws(() => l.setLimit('k', 5, 1000), CLOSED)
  await assert.rejects(l.flush(), CLOSED)
  assert.throws(() => l.flushSync(), CLOSED)
  assert.throws(() => l.settle(), CLOSED)
  assert.throws(() => l.inspect('k'), CLOSED)
  // Input errors still read as input errors on a closed limiter.
  assert.throws(() => l.acquireSync(''), { code: /ERR_QUOTALEASE_(CLOSED|INVALID_KEY)/ })
  // Counters stay readable.
  assert.equal(l.metrics().admitted, 1)
})

test('the Express middleware checks its options', () => {
  const l = limiter()
  assert.throws(() => rateLimit(), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => rateLimit({}), { name: 'TypeError', code: codes.CONFIG, message: /`limiter` must be a quotalease Limiter/ })
  assert.throws(() => rateLimit({ limiter: { acquire() {} } }), { code: codes.CONFIG })
  assert.throws(() => rateLimit({ limiter: l, key: 'ip' }), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => rateLimit({ limiter: l, cost: '1' }), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => rateLimit({ limiter: l, skip: true }), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => rateLimit({ limiter: l, onDenied: 429 }), { name: 'TypeError', code: codes.CONFIG })
  assert.throws(() => rateLimit({ limiter: l, keyGenerator: () => 'k' }), { code: codes.CONFIG, message: /unknown option `keyGenerator`/ })
  l.closeSync()
})
