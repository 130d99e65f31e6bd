'use strict'
// The public API on the in-memory authority: decision objects, headers,
// options, metrics, modes, close.

const test = require('node:test')
const assert = require('node:assert/strict')
const crypto = require('node:crypto')

const ql = require('..')
const { Limiter, Decision, headers, parseRate, httpKey, codes, reasons } = ql
const { unique } = require('./helpers')

const FIELDS = ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'windowMs', 'reason', 'rule', 'rules']

test('decisions are plain data with an inherited headers()', async () => {
  const l = new Limiter({ limit: 600, windowMs: 60000 })
  for (const d of [l.acquireSync('a'), await l.acquire('a'), l.tryAcquire('a')]) {
    assert.ok(d instanceof Decision)
    assert.deepEqual(Object.keys(d), FIELDS)
    assert.equal(typeof d.headers, 'function')
    assert.equal(Object.prototype.propertyIsEnumerable.call(d, 'headers'), false)
    assert.deepEqual(JSON.parse(JSON.stringify(d)), { ...d })
    assert.equal(d.allowed, true)
    assert.equal(d.reason, 'lease')
    assert.equal(d.limit, 600)
    assert.equal(d.windowMs, 60000)
    assert.equal(d.retryAfterMs, 0)
    assert.equal(d.rule, 0)
    assert.deepEqual(d.rules, [{ limit: 600, windowMs: 60000 }])
  }
  l.closeSync()
})

test('headers follow the IETF draft, from a Decision or a plain copy', () => {
  const l = new Limiter({ limit: 3, windowMs: 60000, leaseSize: 1 })
  const ok = l.acquireSync('k')
  assert.deepEqual(ok.headers(), { 'RateLimit-Policy': '"default";q=3;w=60', RateLimit: '"default";r=2;t=20' })
  l.acquireSync('k')
  l.acquireSync('k')
  const denied = l.acquireSync('k')
  assert.equal(denied.allowed, false)
  assert.equal(denied.reason, 'exhausted')
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 20000, `retryAfterMs ${denied.retryAfterMs}`)
  const h = denied.headers()
  assert.equal(h['Retry-After'], String(Math.ceil(denied.retryAfterMs / 1000)))
  assert.equal(h.RateLimit, `"default";r=0;t=${Math.ceil(denied.resetAfterMs / 1000)}`)
  assert.deepEqual(headers(JSON.parse(JSON.stringify(denied))), h)
  l.closeSync()
})

test('limit, window and lease size: defaults, rate strings and the limit held', () => {
  assert.deepEqual(parseRate('600/min'), { limit: 600, windowMs: 60000 })
  assert.deepEqual(parseRate('100/30s'), { limit: 100, windowMs: 30000 })
  assert.deepEqual(parseRate(' 5000 / hour '), { limit: 5000, windowMs: 3600000 })
  const byRate = new Limiter({ rate: '10/s' })
  const d = byRate.acquireSync('k')
  assert.equal(d.limit, 10)
  assert.equal(d.windowMs, 1000)
  assert.equal(new Limiter({ limit: 600 }).leaseSize, 12)
  assert.equal(new Limiter({ limit: 10 }).leaseSize, 1)
  assert.equal(new Limiter({ limit: 100000 }).leaseSize, 20)
  assert.equal(new Limiter({ limit: 100, leaseSize: 7 }).leaseSize, 7)
  // The limit holds: with a window of an hour nothing refills during the test.
  const l = new Limiter({ limit: 50, windowMs: 3600000, leaseSize: 5 })
  let allowed = 0
  for (let i = 0; i < 200; i++) if (l.acquireSync('k').allowed) allowed++
  assert.equal(allowed, 50)
  assert.equal(byRate.acquireSync('k', 9).allowed, true)
  l.closeSync()
  byRate.closeSync()
})

test('memory://NAME is one authority shared by limiters of the process', () => {
  const url = `memory://${unique('shared')}`
  const a = new Limiter({ url, limit: 10, windowMs: 3600000, leaseSize: 2 })
  const b = new Limiter({ url, limit: 10, windowMs: 3600000, leaseSize: 2 })
  let allowed = 0
  for (let i = 0; i < 20; i++) {
    if (a.acquireSync('k').allowed) allowed++
    if (b.acquireSync('k').allowed) allowed++
  }
  assert.equal(allowed, 10)
  // A private memory:// is not shared.
  const c = new Limiter({ limit: 10, windowMs: 3600000 })
  assert.equal(c.acquireSync('k').allowed, true)
  for (const l of [a, b, c]) l.closeSync()
})

test('setLimit overrides one key, by numbers or by rate', () => {
  const l = new Limiter({ limit: 100, windowMs: 60000, leaseSize: 1 })
  l.setLimit('vip', 1000, 60000)
  assert.equal(l.acquireSync('vip').limit, 1000)
  l.setLimit('slow', '2/min')
  const d = l.acquireSync('slow')
  assert.equal(d.limit, 2)
  assert.equal(d.windowMs, 60000)
  assert.equal(l.acquireSync('other').limit, 100)
  l.closeSync()
})

test('cost above one takes that many tokens', async () => {
  const l = new Limiter({ limit: 10, windowMs: 3600000, leaseSize: 10 })
  assert.equal((await l.acquire('k', 7)).allowed, true)
  assert.equal(l.acquireSync('k', 4).allowed, false)
  assert.equal(l.tryAcquire('k', 3).allowed, true)
  l.closeSync()
})

test('modes: exact and local decide with their own reason', () => {
  const exact = new Limiter({ limit: 5, windowMs: 60000, mode: 'exact' })
  assert.equal(exact.acquireSync('k').reason, 'exact')
  const local = new Limiter({ limit: 5, windowMs: 60000, mode: 'local' })
  assert.equal(local.acquireSync('k').reason, 'local')
  exact.closeSync()
  local.closeSync()
})

test('metrics carry the names of docs/design.md, also in Prometheus format', () => {
  const l = new Limiter({ limit: 2, windowMs: 3600000, leaseSize: 1 })
  for (let i = 0; i < 3; i++) l.acquireSync('k')
  const m = l.metrics()
  assert.deepEqual(Object.keys(m), [
    'admitted', 'denied', 'backend_calls', 'backend_errors', 'tokens_leased', 'tokens_returned',
    'tokens_expired', 'fallback_active', 'fallback_transitions', 'keys_tracked', 'overshoot_bound',
    'shadow_denied', 'tokens_debited',
  ])
  assert.equal(m.admitted, 2)
  assert.equal(m.denied, 1)
  assert.equal(m.keys_tracked, 1)
  const text = l.metricsPrometheus()
  assert.match(text, /^# TYPE quotalease_admitted_total counter$/m)
  assert.match(text, /^quotalease_admitted_total 2$/m)
  assert.match(text, /^quotalease_overshoot_bound \d+$/m)
  l.closeSync()
})

test('a manual clock moves refill; inspect shows the key', () => {
  const l = new Limiter({ limit: 10, windowMs: 1000, leaseSize: 10, clock: { manualStartMs: 5000 } })
  assert.equal(l.acquireSync('k', 10).allowed, true)
  assert.equal(l.acquireSync('k').allowed, false)
  l.advanceClock(1000) // a whole window: the bucket is full again
  l.settle()
  assert.equal(l.acquireSync('k').allowed, true)
  const i = l.inspect('k')
  assert.equal(i.limit, 10)
  assert.equal(i.windowMs, 1000)
  assert.equal(typeof i.leaseInFlight, 'boolean')
  assert.equal(i.admitted, 2)
  assert.equal(i.denied, 1)
  assert.equal(i.authorityRefilledAtMs, 6000)
  const m = new Limiter({ limit: 1, clock: 'manual' })
  m.advanceClock(1)
  m.closeSync()
  l.closeSync()
})

test('a manual clock starts at 1000000 ms (as in every language) unless told otherwise', () => {
  const l = new Limiter({ limit: 5, windowMs: 1000, clock: 'manual' })
  l.acquireSync('k')
  assert.equal(l.inspect('k').authorityRefilledAtMs, 1000000)
  l.advanceClock(250)
  l.acquireSync('other')
  assert.equal(l.inspect('other').authorityRefilledAtMs, 1000250)
  l.closeSync()
  for (const o of [{ clock: 'manual', clockStartMs: 7 }, { clock: { manualStartMs: 7 } }, { clock: 'manual', clock_start_ms: 7 }]) {
    const t = new Limiter({ limit: 5, ...o })
    t.acquireSync('k')
    assert.equal(t.inspect('k').authorityRefilledAtMs, 7, JSON.stringify(o))
    t.closeSync()
  }
})

test('httpKey: keys over 512 bytes become sha256:<hex>, shorter ones are unchanged', () => {
  const sha = (s) => 'sha256:' + crypto.createHash('sha256').update(s, 'utf8').digest('hex')
  for (const long of ['k'.repeat(600), 'x'.repeat(513), '€'.repeat(200)]) {
    assert.equal(httpKey(long), sha(long))
    assert.match(httpKey(long), /^sha256:[0-9a-f]{64}$/)
  }
  for (const short of ['', 'user:42', 'x'.repeat(512), '€'.repeat(170), 'ключ-🔑']) {
    assert.equal(httpKey(short), short)
  }
  assert.throws(() => httpKey(5), { name: 'TypeError', code: codes.INVALID_KEY })
})

test('flush gives leased tokens back; close is idempotent, sync or async', async () => {
  const url = `memory://${unique('flush')}`
  const a = new Limiter({ url, limit: 10, windowMs: 3600000, leaseSize: 5 })
  a.acquireSync('k')
  await a.flush()
  assert.ok(a.metrics().tokens_returned > 0)
  a.acquireSync('k')
  a.flushSync()
  const p1 = a.close()
  const p2 = a.close()
  assert.equal(p1, p2)
  await p1
  a.closeSync()
})

test('module exports', () => {
  assert.deepEqual(Object.keys(ql).sort(), [
    'Decision',
    'Limiter',
    'Permit',
    'Reservation',
    'codes',
    'engineVersion',
    'headers',
    'httpKey',
    'metricsPrometheus',
    'parseRate',
    'reasons',
    'redactUrl',
  ])
  // Both tables come from the engine (Reason::ALL, ErrorKind::ALL).
  assert.deepEqual(reasons, ['lease', 'exhausted', 'fallback', 'pending', 'exact', 'local', 'shadow', 'blocked', 'unlimited'])
  assert.ok(Object.isFrozen(reasons) && Object.isFrozen(codes))
  assert.deepEqual(codes, {
    CONFIG: 'ERR_QUOTALEASE_CONFIG',
    INVALID_KEY: 'ERR_QUOTALEASE_INVALID_KEY',
    INVALID_COST: 'ERR_QUOTALEASE_INVALID_COST',
    CLOSED: 'ERR_QUOTALEASE_CLOSED',
    BACKEND: 'ERR_QUOTALEASE_BACKEND',
    MISCONFIGURED: 'ERR_QUOTALEASE_MISCONFIGURED',
    RESERVATION: 'ERR_QUOTALEASE_RESERVATION',
  })
  assert.match(ql.engineVersion, /^\d+\.\d+\.\d+/)
  assert.equal(require('../package.json').name, 'quotalease')
})

test('overshootBudget caps what an instance holds under adaptive leasing', async () => {
  const l = new Limiter({ limit: 100, windowMs: 1000, overshootBudget: '5%', clock: 'manual' })
  for (let i = 0; i < 10; i++) assert.equal((await l.acquire('k')).allowed, true)
  l.advanceClock(100)
  // the 3 tokens still held serve three; the fourth asks, with the demand
  // measured, for more, and the budget (5 % of 100) caps it
  for (let i = 0; i < 4; i++) assert.equal((await l.acquire('k')).allowed, true)
  assert.equal(l.metrics().overshoot_bound, 5)
  // 'auto', the default, named
  const auto = new Limiter({ limit: 100, overshootBudget: 'auto' })
  assert.equal(auto.acquireSync('k').allowed, true)
  await auto.close()
  assert.throws(() => new Limiter({ limit: 100, overshootBudget: 'automatic' }), { code: codes.CONFIG, message: /overshoot_budget/ })
  assert.throws(() => new Limiter({ limit: 100, overshootBudget: '150%' }), { code: codes.CONFIG, message: /overshoot_budget/ })
  assert.throws(() => new Limiter({ limit: 100, overshootBudget: 0 }), { code: codes.CONFIG, message: /overshoot_budget/ })
})
