'use strict'
// Concurrency limits (`concurrency: N`, `limiter.acquireConcurrent` /
// `acquireConcurrentSync`, `Permit`) on memory://NAME and a real
// redis-server, two limiters on one authority with manual clocks: at most N
// permits of a key in flight across limiters, a release frees one, released
// permits reach the other limiter once given back, a long request keeps its
// permits far past a commitment's life (7 s), a dead instance's come back
// after its commitment, and the typed errors. core/tests/concurrency.rs and
// bindings/python/tests/test_concurrency.py are the models.

const test = require('node:test')
const assert = require('node:assert/strict')
const util = require('node:util')

const { Limiter, Permit, Decision, codes } = require('..')
const { RedisServer, unique } = require('./helpers')

const RESERVATION = { code: codes.RESERVATION }
const CONFIG = { code: codes.CONFIG }
const CLOSED = { code: codes.CLOSED }
const INVALID_KEY = { code: codes.INVALID_KEY }

// A commitment's life at the authority and its expiry margin (the core's
// ledger TUNING: commit_ms 7000, expiry_margin_ms 1000).
const COMMIT_MS = 7000
const MARGIN_MS = 1000

const server = new RedisServer()
test.after(() => server.stop())

/** memory:// (a name of its own) and the redis-server. */
const AUTHORITIES = {
  memory: () => `memory://${unique('inflight')}`,
  redis: () => server.url,
}

/** Two limiters on one authority and key prefix (two instances), manual clocks. */
function pair(url, concurrency = 3) {
  const keyPrefix = unique('inflight')
  const make = () => new Limiter({ url, keyPrefix, clock: 'manual', limit: 1000, concurrency, backendTimeoutMs: 10000 })
  return [make(), make()]
}

/** Permits taken at once until the first denial (the admitted ones, kept). */
function takeAll(l, key) {
  const out = []
  for (;;) {
    const p = l.acquireConcurrentSync(key)
    if (!p.allowed) {
      const d = p.decision
      assert.equal(d.allowed, false)
      assert.equal(d.reason, 'exhausted')
      assert.equal(d.remaining, 0)
      // a permit denial stays local recheck_ms (250) from when it was decided
      assert.ok(d.retryAfterMs >= 1 && d.retryAfterMs <= 250, `${d.retryAfterMs}`)
      return out
    }
    out.push(p)
    assert.ok(out.length <= 100, 'never denied')
  }
}

/** Every clock moves `ms` in steps of half a second, each followed by the limiter's maintenance. */
function advance(limiters, ms) {
  for (let left = ms; left > 0; ) {
    const step = Math.min(left, 500)
    for (const l of limiters) {
      l.advanceClock(step)
      l.settle()
    }
    left -= step
  }
}

async function closeAll(...limiters) {
  for (const l of limiters) await l.close()
}

for (const [name, url] of Object.entries(AUTHORITIES)) {
  test(`${name}: at most the limit is in flight, and a release frees one`, async () => {
    const [l, other] = pair(url())
    const held = takeAll(l, 'k')
    assert.equal(held.length, 3)
    const p = held[0]
    assert.ok(p instanceof Permit)
    assert.ok(p.decision instanceof Decision)
    assert.equal(p.allowed, true)
    assert.equal(p.key, 'k')
    assert.equal(p.released, false)
    assert.equal(p.decision.limit, 3)
    assert.equal(p.decision.reason, 'lease')
    assert.deepEqual(
      held.map((h) => h.decision.remaining),
      [2, 1, 0],
    )
    assert.equal(p.release(), undefined)
    assert.equal(p.released, true)
    assert.equal(l.acquireConcurrentSync('k').allowed, true, 'the released permit is taken again')
    const denied = l.acquireConcurrentSync('k')
    assert.equal(denied.allowed, false)
    assert.equal(denied.released, false)
    assert.equal(denied.decision.headers()['Retry-After'], '1')
    // other keys have their own permits
    assert.equal(takeAll(l, 'other').length, 3)
    await closeAll(l, other)
  })

  test(`${name}: permits are shared by the fleet`, async () => {
    const [l1, l2] = pair(url())
    const mine = takeAll(l1, 'k')
    assert.equal(mine.length, 3)
    assert.equal(takeAll(l2, 'k').length, 0, 'l1 holds all 3')
    for (const p of mine) p.release()
    // released, the permits go back to the authority at once; l2's last
    // denial stays local for a recheck (250 ms), then it asks again
    assert.equal(takeAll(l2, 'k').length, 0, "l2's denial is still local")
    advance([l1, l2], 1000)
    assert.equal(takeAll(l2, 'k').length, 3)
    assert.equal(takeAll(l1, 'k').length, 0, 'l2 holds all 3 now')
    await closeAll(l1, l2)
  })

  test(`${name}: a long request keeps its permit`, async () => {
    const [l1, l2] = pair(url())
    const mine = takeAll(l1, 'k')
    assert.equal(mine.length, 3)
    // far past a commitment's life (7 s): l1's maintenance renews it
    advance([l1, l2], 30000)
    assert.equal(takeAll(l2, 'k').length, 0, 'the permits are still in flight')
    assert.ok(mine.every((p) => !p.released))
    for (const p of mine) p.release()
    l1.flushSync()
    advance([l1, l2], 1000)
    assert.equal(takeAll(l2, 'k').length, 3)
    await closeAll(l1, l2)
  })

  test(`${name}: a dead instance's permits come back after its commitment`, async () => {
    const [l1, l2] = pair(url())
    const mine = takeAll(l1, 'k')
    assert.equal(mine.length, 3)
    // l1 "dies" holding them: it never runs again (no release, renewal or give-back)
    advance([l2], COMMIT_MS - MARGIN_MS)
    assert.equal(takeAll(l2, 'k').length, 0, 'still committed')
    advance([l2], MARGIN_MS + 1000)
    assert.equal(takeAll(l2, 'k').length, 3, 'back after the expiry')
    await closeAll(l1, l2)
  })

  test(`${name}: acquireConcurrent resolves to a Permit`, async () => {
    const [l, other] = pair(url(), 2)
    const a = await l.acquireConcurrent('k')
    assert.ok(a instanceof Permit)
    assert.equal(a.allowed, true)
    assert.equal(a.decision.limit, 2)
    const b = await l.acquireConcurrent('k')
    assert.equal(b.allowed, true)
    const c = await l.acquireConcurrent('k')
    assert.equal(c.allowed, false)
    const ms = c.decision.retryAfterMs
    assert.ok(ms >= 1 && ms <= 250, `${ms}`)
    b.release()
    assert.equal((await l.acquireConcurrent('k')).allowed, true)
    await closeAll(l, other)
  })

  test(`${name}: releasing twice or a denied permit throws ERR_QUOTALEASE_RESERVATION`, async () => {
    const [l, other] = pair(url(), 1)
    const p = l.acquireConcurrentSync('k')
    p.release()
    assert.throws(() => p.release(), { ...RESERVATION, message: /released already/ })
    const held = l.acquireConcurrentSync('k')
    const denied = await l.acquireConcurrent('k')
    assert.equal(held.allowed, true)
    assert.equal(denied.allowed, false)
    assert.throws(() => denied.release(), { ...RESERVATION, message: /no permit was taken/ })
    assert.equal(denied.released, false)
    // neither error released anything: the key's one permit is still held
    assert.equal(l.acquireConcurrentSync('k').allowed, false)
    held.release()
    assert.equal(l.acquireConcurrentSync('k').allowed, true)
    await closeAll(l, other)
  })

  test(`${name}: a closed limiter`, async () => {
    const [l, other] = pair(url())
    const p = l.acquireConcurrentSync('k')
    await l.close()
    assert.throws(() => p.release(), CLOSED)
    assert.throws(() => l.acquireConcurrentSync('k'), CLOSED)
    await assert.rejects(l.acquireConcurrent('k'), CLOSED)
    await other.close()
  })
}

test('concurrency options: 0 is none, bad values and fixed leases are config errors', async () => {
  for (const o of [{}, { concurrency: 0 }, { concurrency: undefined }, { concurrency: null }]) {
    const l = new Limiter({ limit: 10, ...o })
    assert.throws(() => l.acquireConcurrentSync('k'), { ...CONFIG, message: /`concurrency` is 0/ })
    await assert.rejects(l.acquireConcurrent('k'), { ...CONFIG, message: /`concurrency` is 0/ })
    await l.close()
  }
  for (const bad of [-1, 1.5, 2 ** 52, Infinity, NaN, 'three']) {
    assert.throws(() => new Limiter({ limit: 10, concurrency: bad }), { ...CONFIG, message: /concurrency/ }, String(bad))
  }
  for (const wrong of [true, [2], { n: 2 }]) {
    assert.throws(() => new Limiter({ limit: 10, concurrency: wrong }), { name: 'TypeError', ...CONFIG, message: /`concurrency` must be a number/ })
  }
  for (const o of [{ mode: 'exact' }, { mode: 'local' }, { leaseSize: 2 }]) {
    assert.throws(() => new Limiter({ limit: 10, concurrency: 2, ...o }), { ...CONFIG, message: /needs adaptive leasing/ }, JSON.stringify(o))
  }
  const ok = new Limiter({ limit: 10, concurrency: 2 })
  assert.equal(ok.acquireConcurrentSync('k').allowed, true)
  await ok.close()
})

test("a call's tier sets its concurrency; bad options are errors", async () => {
  const l = new Limiter({ limit: 100, concurrency: 3, tiers: 'free=100/min, 1 concurrent; pro=100/min, 2 concurrent' })
  const take = (key, options) => {
    const held = []
    for (;;) {
      const p = l.acquireConcurrentSync(key, options)
      if (!p.allowed) return held
      held.push(p)
    }
  }
  assert.equal(take('a', { tier: 'free' }).length, 1)
  const pro = []
  for (;;) {
    const p = await l.acquireConcurrent('b', { tier: 'pro' })
    if (!p.allowed) break
    assert.equal(p.decision.limit, 2)
    pro.push(p)
  }
  assert.equal(pro.length, 2)
  assert.equal(take('c', { tier: null }).length, 3, "no tier: the limiter's concurrency")
  assert.throws(() => l.acquireConcurrentSync('d', { tier: 'gold' }), { ...CONFIG, message: /gold/ })
  await assert.rejects(l.acquireConcurrent('d', { tier: 'gold' }), { ...CONFIG, message: /gold/ })
  assert.throws(() => l.acquireConcurrentSync('d', { tier: 5 }), { name: 'TypeError', ...CONFIG })
  assert.throws(() => l.acquireConcurrentSync('d', { cost: 2 }), { ...CONFIG, message: /unknown option `cost`/ })
  await assert.rejects(l.acquireConcurrent('d', 'pro'), { name: 'TypeError', ...CONFIG })
  assert.equal(take('d').length, 3, 'no bad call took a permit of d')
  await l.close()
})

test('bad keys: the sync form throws, the Promise form rejects', async () => {
  const l = new Limiter({ limit: 10, concurrency: 1 })
  for (const bad of ['', 'a\u001fb', 'k'.repeat(513)]) {
    assert.throws(() => l.acquireConcurrentSync(bad), INVALID_KEY, JSON.stringify(bad))
    await assert.rejects(l.acquireConcurrent(bad), INVALID_KEY, JSON.stringify(bad))
  }
  for (const wrong of [5, undefined, null, {}]) {
    assert.throws(() => l.acquireConcurrentSync(wrong), { name: 'TypeError', ...INVALID_KEY })
    let threw = false
    const p = (() => {
      try {
        return l.acquireConcurrent(wrong)
      } catch {
        threw = true
      }
    })()
    assert.equal(threw, false, 'the Promise API rejects, it never throws')
    await assert.rejects(p, { name: 'TypeError', ...INVALID_KEY })
  }
  assert.equal(l.acquireConcurrentSync('k').allowed, true, 'no bad key took a permit of k')
  await l.close()
})

test('a Permit is made by the limiter only, and shows its state in console.log', async () => {
  assert.throws(() => new Permit({}), { name: 'TypeError', ...CONFIG, message: /acquireConcurrent\(\)/ })
  const l = new Limiter({ limit: 10, concurrency: 1 })
  const p = l.acquireConcurrentSync('user:1')
  assert.equal(util.inspect(p), "Permit { key: 'user:1', allowed: true, released: false }")
  p.release()
  assert.equal(util.inspect(p), "Permit { key: 'user:1', allowed: true, released: true }")
  await l.close()
})

test('redis: acquireConcurrent on a cold key waits for the lease without blocking the event loop', async () => {
  const own = new RedisServer()
  const l = new Limiter({ url: own.url, limit: 100, concurrency: 2, keyPrefix: unique('cz'), clock: 'manual', backendTimeoutMs: 60000 })
  own.pause()
  try {
    let settled = false
    const p = l.acquireConcurrent('cold').then((permit) => {
      settled = true
      return permit
    })
    // If acquireConcurrent blocked the loop, no turn could pass before it resolved.
    for (let turns = 0; turns < 5; turns++) await new Promise(setImmediate)
    assert.equal(settled, false, 'acquireConcurrent should still be waiting on the paused Redis')
    own.resume()
    const permit = await p
    assert.ok(permit instanceof Permit)
    assert.equal(permit.allowed, true)
    assert.equal(permit.decision.reason, 'lease')
    permit.release()
  } finally {
    own.resume()
    await l.close()
    own.stop()
  }
})
