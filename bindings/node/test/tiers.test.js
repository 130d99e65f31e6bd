'use strict'
// Plan tiers, several rules per key and the shared policy store (issue 15):
// acquire naming a tier, decisions and headers with several rules, inspect,
// the tier options, policy() / tiers(), and the store calls on memory://NAME
// and on a real Redis.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const { Limiter, Decision, headers, codes } = require('..')
const { RedisServer, unique, waitFor } = require('./helpers')

const TIERS = 'free=2/s; pro=5/s; burst=2/s, 3/10s'

function manual(extra = {}) {
  return new Limiter({ limit: 100, windowMs: 1000, leaseSize: 1, refillThreshold: 0, clock: 'manual', tiers: TIERS, policyRefreshMs: 1000, ...extra })
}

test('acquire, acquireSync and tryAcquire name a tier as { tier }, after the cost or in its place', async () => {
  const l = manual({ url: `memory://${unique('t')}` })
  const a = await l.acquire('a', { tier: 'pro' })
  assert.equal(a.allowed, true)
  assert.equal(a.limit, 5)
  assert.equal(a.remaining, 4)
  assert.equal((await l.acquire('a', 2, { tier: 'pro' })).remaining, 2)
  assert.equal(l.acquireSync('a', { tier: 'pro' }).remaining, 1)
  assert.equal(l.acquireSync('a', 1, { tier: 'pro' }).remaining, 0)
  l.settle()
  const denied = l.tryAcquire('a', { tier: 'pro' })
  assert.equal(denied.allowed, false)
  assert.equal(denied.limit, 5)
  // `tier: undefined` / `null`, an empty options object and no options are all "no tier": limit 100.
  for (const d of [
    await l.acquire('b'),
    await l.acquire('b', 1),
    await l.acquire('b', { tier: undefined }),
    await l.acquire('b', undefined, { tier: null }),
    l.acquireSync('b', {}),
    l.tryAcquire('b', 1, undefined),
  ]) {
    assert.equal(d.limit, 100)
  }
  l.closeSync()
})

test('defaultTier applies when the caller names none; a named tier wins over it', () => {
  const l = manual({ defaultTier: 'free' })
  assert.equal(l.acquireSync('k').limit, 2)
  assert.equal(l.acquireSync('other', { tier: 'pro' }).limit, 5)
  l.closeSync()
})

test('an unknown tier is the engine\'s config error (a plain Error), from every call', async () => {
  const l = manual()
  const want = (err) => {
    assert.ok(!(err instanceof TypeError), 'an unknown tier is a value error, not a type error')
    assert.equal(err.code, codes.CONFIG)
    assert.equal(
      err.message,
      'invalid configuration: unknown tier "gold" (known tiers: burst, free, pro); define it in `tiers`, the policy file or the store',
    )
    return true
  }
  await assert.rejects(l.acquire('k', { tier: 'gold' }), want)
  await assert.rejects(l.acquire('k', 1, { tier: 'gold' }), want)
  assert.throws(() => l.acquireSync('k', { tier: 'gold' }), want)
  assert.throws(() => l.tryAcquire('k', 3, { tier: 'gold' }), want)
  assert.throws(() => l.policy('k', 'gold'), want)
  l.closeSync()
})

test('wrong types around the tier are TypeErrors with a code; acquire rejects, never throws', async () => {
  const l = manual()
  const cases = [
    [[{ tier: 5 }], codes.CONFIG, /the tier must be a string \(got number 5\)/],
    [[1, { tier: ['pro'] }], codes.CONFIG, /the tier must be a string \(got an array\)/],
    [[1, 'pro'], codes.CONFIG, /options must be an object such as \{ tier: 'pro' \} \(got the string "pro"\)/],
    [[null], codes.INVALID_COST, /the cost must be a number \(got null\)/],
    [['2', { tier: 'pro' }], codes.INVALID_COST, /the cost must be a number \(got string\)/],
  ]
  for (const [args, code, message] of cases) {
    const want = (err) => err instanceof TypeError && err.code === code && message.test(err.message)
    await assert.rejects(l.acquire('k', ...args), want, JSON.stringify(args))
    assert.throws(() => l.acquireSync('k', ...args), want, JSON.stringify(args))
    assert.throws(() => l.tryAcquire('k', ...args), want, JSON.stringify(args))
  }
  // A misspelt option is no type error, but still the config code.
  await assert.rejects(l.acquire('k', { teir: 'pro' }), (err) => {
    assert.ok(!(err instanceof TypeError))
    assert.equal(err.code, codes.CONFIG)
    assert.equal(err.message, 'acquire: unknown option `teir` (known: tier, waitMs)')
    return true
  })
  assert.throws(() => l.policy('k', 7), (err) => err instanceof TypeError && err.code === codes.CONFIG)
  assert.throws(() => l.policy(7), (err) => err instanceof TypeError && err.code === codes.INVALID_KEY)
  l.closeSync()
})

test('two rules: the decision carries both and the binding one; headers list both policies', async () => {
  const l = manual()
  const first = l.acquireSync('k', { tier: 'burst' })
  assert.ok(first instanceof Decision)
  assert.deepEqual(Object.keys(first), ['allowed', 'limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'windowMs', 'reason', 'rule', 'rules'])
  assert.deepEqual(first.rules, [
    { limit: 2, windowMs: 1000 },
    { limit: 3, windowMs: 10000 },
  ])
  // Admitted: the binding rule is the one with the fewest tokens left (1 of 2 per second vs 2 of 3 per 10 s).
  assert.equal(first.rule, 0)
  assert.equal(first.limit, 2)
  assert.equal(first.remaining, 1)
  const fh = first.headers()
  assert.deepEqual(Object.keys(fh), ['RateLimit-Policy', 'RateLimit'])
  assert.equal(fh['RateLimit-Policy'], '"1s";q=2;w=1, "10s";q=3;w=10')
  assert.match(fh.RateLimit, /^"1s";r=1;t=\d+$/)
  assert.equal((await l.acquire('k', { tier: 'burst' })).allowed, true)
  l.advanceClock(1000)
  // Third request: the first rule has refilled, the 10 s rule has 1 left and binds.
  const third = l.acquireSync('k', { tier: 'burst' })
  assert.equal(third.allowed, true)
  assert.equal(third.rule, 1)
  assert.equal(third.limit, 3)
  assert.equal(third.windowMs, 10000)
  assert.equal(third.remaining, 0)
  const fourth = l.acquireSync('k', { tier: 'burst' })
  assert.equal(fourth.allowed, false)
  assert.equal(fourth.rule, 1)
  const h = fourth.headers()
  assert.equal(h['RateLimit-Policy'], '"1s";q=2;w=1, "10s";q=3;w=10')
  assert.match(h.RateLimit, /^"10s";r=0;t=\d+$/)
  assert.equal(h['Retry-After'], String(Math.ceil(fourth.retryAfterMs / 1000)))
  // A copy that lost its prototype gives the same headers; decisions with the same rules share one frozen array.
  assert.deepEqual(headers(JSON.parse(JSON.stringify(fourth))), h)
  assert.equal(third.rules, fourth.rules)
  assert.ok(Object.isFrozen(fourth.rules) && Object.isFrozen(fourth.rules[1]))
  l.closeSync()
})

test("each decision carries its own key's rules, call after call (one rule, two, another one)", async () => {
  // The wrapper reuses the previous decision's frozen rules when they are the
  // same; going from two rules back to one must not reuse the two.
  const l = manual()
  l.setLimit('seven', 7, 1000)
  const one = [{ limit: 100, windowMs: 1000 }]
  const two = [
    { limit: 2, windowMs: 1000 },
    { limit: 3, windowMs: 10000 },
  ]
  const steps = [
    ['k', undefined, one],
    ['b', 'burst', two],
    ['k', undefined, one],
    ['seven', undefined, [{ limit: 7, windowMs: 1000 }]],
    ['b', 'burst', two],
    ['b', 'burst', two],
    ['k', undefined, one],
    ['p', 'pro', [{ limit: 5, windowMs: 1000 }]],
  ]
  for (const [i, [key, tier, rules]] of steps.entries()) {
    const sync = tier === undefined ? l.acquireSync(key) : l.acquireSync(key, { tier })
    assert.deepEqual(sync.rules, rules, `step ${i}: acquireSync(${key})`)
    const tried = tier === undefined ? l.tryAcquire(key) : l.tryAcquire(key, { tier })
    assert.deepEqual(tried.rules, rules, `step ${i}: tryAcquire(${key})`)
    const awaited = tier === undefined ? await l.acquire(key) : await l.acquire(key, { tier })
    assert.deepEqual(awaited.rules, rules, `step ${i}: acquire(${key})`)
  }
  l.closeSync()
})

test('headers(): a plain object without rules is one rule; bad rules are config errors', () => {
  const plain = { allowed: true, limit: 10, remaining: 9, retryAfterMs: 0, resetAfterMs: 100, windowMs: 1000 }
  assert.deepEqual(headers(plain), { 'RateLimit-Policy': '"default";q=10;w=1', RateLimit: '"default";r=9;t=1' })
  const two = { ...plain, rule: 1, rules: [{ limit: 10, windowMs: 1000 }, { limit: 100, windowMs: 86400000 }], limit: 100, windowMs: 86400000 }
  assert.equal(headers(two)['RateLimit-Policy'], '"1s";q=10;w=1, "1day";q=100;w=86400')
  assert.equal(headers(two).RateLimit, '"1day";r=9;t=1')
  const typeErr = (err) => err instanceof TypeError && err.code === codes.CONFIG
  assert.throws(() => headers({ ...plain, rules: 'x' }), typeErr)
  assert.throws(() => headers({ ...plain, rules: [{ limit: 1 }] }), typeErr)
  assert.throws(() => headers({ ...plain, rule: '1' }), typeErr)
  assert.throws(() => headers({ ...plain, rule: 2 }), (err) => err.code === codes.CONFIG && /`rule` is 2, but the decision has 1 rule/.test(err.message))
  assert.throws(
    () => headers({ ...plain, rules: [{ limit: 1, windowMs: 1000 }, { limit: 2, windowMs: 1000 }] }),
    (err) => err.code === codes.CONFIG && /two rules with a window of 1000 ms/.test(err.message),
  )
})

test('inspect reports the rules, the tier and where the policy comes from', () => {
  const l = manual({ defaultTier: 'free' })
  l.acquireSync('k', { tier: 'burst' })
  const i = l.inspect('k')
  assert.equal(i.rules, '2/s, 3/10s')
  assert.equal(i.tier, 'burst')
  assert.equal(i.policySource, 'tier burst (assigned by caller, defined in config)')
  l.acquireSync('d')
  assert.equal(l.inspect('d').policySource, 'tier free (assigned by default_tier, defined in config)')
  l.setLimit('own', '7/s')
  l.acquireSync('own')
  const own = l.inspect('own')
  assert.equal(own.rules, '7/s')
  assert.equal(own.tier, null)
  assert.equal(own.policySource, 'own rules (from set_limit)')
  l.closeSync()
})

test('policy(key, tier) and tiers() read what the limiter knows', () => {
  const l = manual({ defaultTier: 'free' })
  assert.deepEqual(l.policy('k', 'burst'), {
    rules: [
      { limit: 2, windowMs: 1000 },
      { limit: 3, windowMs: 10000 },
    ],
    tier: 'burst',
    assignedBy: 'caller',
    definedBy: 'config',
    access: null,
    source: 'tier burst (assigned by caller, defined in config)',
  })
  assert.equal(l.policy('k').tier, 'free')
  assert.equal(l.policy('k', null).assignedBy, 'default_tier')
  assert.deepEqual(l.tiers(), [
    { name: 'burst', rules: [{ limit: 2, windowMs: 1000 }, { limit: 3, windowMs: 10000 }], definedBy: 'config' },
    { name: 'free', rules: [{ limit: 2, windowMs: 1000 }], definedBy: 'config' },
    { name: 'pro', rules: [{ limit: 5, windowMs: 1000 }], definedBy: 'config' },
  ])
  const none = new Limiter({ limit: 3 })
  assert.deepEqual(none.tiers(), [])
  assert.deepEqual(none.policy('k').rules, [{ limit: 3, windowMs: 60000 }])
  assert.equal(none.policy('k').tier, null)
  none.closeSync()
  l.closeSync()
})

test('the tier options by name: bad values are the engine\'s config errors', () => {
  const bad = [
    [{ tiers: 'x=1/fortnight' }, /`tiers`/],
    [{ tiers: 'free=1/s, 2/s' }, /two rules with a window of 1000 ms/],
    [{ tiers: 'free=1/s', defaultTier: 'gold' }, /gold/],
    [{ policyRefreshMs: -1 }, /policy_refresh_ms/],
    [{ policyFile: path.join(os.tmpdir(), unique('missing') + '.toml') }, /cannot be read/],
  ]
  for (const [o, message] of bad) {
    assert.throws(
      () => new Limiter({ limit: 10, ...o }),
      (err) => err.code === codes.CONFIG && message.test(err.message),
      JSON.stringify(o),
    )
  }
  // Snake_case works too, as for every option.
  const l = new Limiter({ limit: 10, tiers: 'free=1/s', default_tier: 'free', policy_refresh_ms: 250 })
  assert.equal(l.acquireSync('k').limit, 1)
  l.closeSync()
  // As for every string option, a number reaches the engine, which names the option.
  assert.throws(() => new Limiter({ limit: 10, tiers: 3 }), (err) => err.code === codes.CONFIG && /`tiers` must be a string/.test(err.message))
  assert.throws(() => new Limiter({ limit: 10, tiers: ['free=1/s'] }), (err) => err instanceof TypeError && err.code === codes.CONFIG)
})

test('policyFile: tiers, keys and the default tier from TOML, re-read on refreshPolicies', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ql-policy-'))
  const file = path.join(dir, 'policies.toml')
  fs.writeFileSync(file, 'default_tier = "free"\n[tiers]\nfree = "3/s"\npro = ["10/s", "100/day"]\n[keys]\n"user:42" = "tier:pro"\n')
  const l = new Limiter({ limit: 1000, policyFile: file, policyRefreshMs: 1000, url: `memory://${unique('f')}` })
  assert.equal(l.acquireSync('anyone').limit, 3)
  const vip = l.policy('user:42', 'free')
  assert.equal(vip.tier, 'pro')
  assert.equal(vip.assignedBy, 'file')
  assert.equal(vip.definedBy, 'file')
  assert.deepEqual(vip.rules, [{ limit: 10, windowMs: 1000 }, { limit: 100, windowMs: 86400000 }])
  // A changed file: the mtime is what the engine watches, so set it ahead explicitly.
  fs.writeFileSync(file, '[tiers]\nfree = "4/s"\n')
  const later = new Date(Date.now() + 5000)
  fs.utimesSync(file, later, later)
  await l.refreshPolicies()
  assert.deepEqual(l.policy('user:42', 'free').rules, [{ limit: 4, windowMs: 1000 }])
  await l.close()
  fs.rmSync(dir, { recursive: true, force: true })
})

test('by default (policyRefreshMs 0) a limiter follows no store: store calls reject with the engine\'s reason', async () => {
  const l = new Limiter({ limit: 10 })
  await assert.rejects(l.refreshPolicies(), (err) => err.code === codes.CONFIG && /policy_refresh_ms/.test(err.message))
  await l.close()
})

test('store calls check their arguments: TypeErrors reject, never throw', async () => {
  const l = new Limiter({ limit: 10 })
  const typeErr = (code) => (err) => err instanceof TypeError && err.code === code
  const calls = [
    [() => l.policySetTier(1, '1/s'), codes.CONFIG],
    [() => l.policySetTier('pro', 10), codes.CONFIG],
    [() => l.policyDeleteTier(undefined), codes.CONFIG],
    [() => l.policyAssign(42, 'tier:pro'), codes.INVALID_KEY],
    [() => l.policyAssign('k', null), codes.CONFIG],
    [() => l.policyUnassign({}), codes.INVALID_KEY],
    [() => l.policyGet(1), codes.INVALID_KEY],
  ]
  for (const [call, code] of calls) {
    let p
    assert.doesNotThrow(() => (p = call()))
    await assert.rejects(p, typeErr(code))
  }
  // Values the engine refuses: its config and invalid-key errors.
  await assert.rejects(l.policySetTier('b@d', '1/s'), (err) => err.code === codes.CONFIG && /names are 1 to 64/.test(err.message))
  await assert.rejects(l.policySetTier('ok', '1/fortnight'), (err) => err.code === codes.CONFIG)
  await assert.rejects(l.policyAssign('k', 'tier:'), (err) => err.code === codes.CONFIG)
  await assert.rejects(l.policyAssign('', '1/s'), (err) => err.code === codes.INVALID_KEY)
  await l.close()
  await assert.rejects(l.policyList(), (err) => err.code === codes.CLOSED)
})

/** The store API on `url`: two limiters (two "servers") share what one writes. */
async function storeRoundTrip(url, keyPrefix) {
  const opts = { url, keyPrefix, limit: 100, windowMs: 1000, leaseSize: 1, refillThreshold: 0, clock: 'manual', tiers: 'free=2/s; pro=4/s', policyRefreshMs: 1000 }
  const a = new Limiter(opts)
  const b = new Limiter(opts)
  try {
    const empty = await a.policyList()
    assert.deepEqual(empty.tiers, [])
    assert.deepEqual(empty.keys, [])
    assert.equal(await a.policyGet('user:1'), null)

    const v1 = await a.policySetTier('gold', '10/s, 1000/day')
    assert.ok(Number.isSafeInteger(v1) && v1 > empty.version, `version ${v1} after ${empty.version}`)
    const v2 = await a.policyAssign('user:1', 'tier:gold')
    assert.ok(v2 > v1, `version ${v2} after ${v1}`)
    const v3 = await a.policyAssign('user:2', '7/s')
    assert.ok(v3 > v2, `version ${v3} after ${v2}`)
    assert.equal(await b.policyGet('user:1'), 'tier:gold')
    assert.deepEqual(await b.policyList(), {
      version: v3,
      tiers: [{ name: 'gold', rules: '10/s, 1000/day' }],
      keys: [
        { key: 'user:1', assignment: 'tier:gold' },
        { key: 'user:2', assignment: '7/s' },
      ],
    })

    // The other limiter applies it once it polled (refreshPolicies: now).
    await b.refreshPolicies()
    const gold = b.tiers().find((t) => t.name === 'gold')
    assert.deepEqual(gold, { name: 'gold', rules: [{ limit: 10, windowMs: 1000 }, { limit: 1000, windowMs: 86400000 }], definedBy: 'store' })
    // The key's own entry wins over the tier the caller names.
    const d = await b.acquire('user:1', { tier: 'free' })
    assert.equal(d.limit, 10)
    assert.deepEqual(d.rules, [{ limit: 10, windowMs: 1000 }, { limit: 1000, windowMs: 86400000 }])
    assert.equal(d.headers()['RateLimit-Policy'], '"1s";q=10;w=1, "1day";q=1000;w=86400')
    assert.deepEqual(b.policy('user:1', 'free'), {
      rules: [{ limit: 10, windowMs: 1000 }, { limit: 1000, windowMs: 86400000 }],
      tier: 'gold',
      assignedBy: 'store',
      definedBy: 'store',
      access: null,
      source: 'tier gold (assigned by store, defined in store)',
    })
    assert.equal(b.acquireSync('user:2').limit, 7)
    assert.equal(b.inspect('user:2').policySource, 'own rules (from store)')
    // A tier the store defines can be named by callers.
    assert.equal(b.acquireSync('someone', { tier: 'gold' }).limit, 10)

    // Redefining a configured tier in the store wins over the configuration.
    await a.policySetTier('pro', '1/s')
    await b.refreshPolicies()
    assert.equal(b.acquireSync('p', { tier: 'pro' }).limit, 1)

    await a.policyUnassign('user:1')
    await a.policyDeleteTier('pro')
    await a.policyDeleteTier('gold')
    await b.refreshPolicies()
    assert.equal(await b.policyGet('user:1'), null)
    assert.equal(b.acquireSync('user:1', { tier: 'free' }).limit, 2)
    assert.equal(b.acquireSync('p2', { tier: 'pro' }).limit, 4)
    await assert.rejects(b.acquire('x', { tier: 'gold' }), (err) => err.code === codes.CONFIG && /unknown tier "gold"/.test(err.message))
    const after = await b.policyList()
    assert.deepEqual(after.tiers, [])
    assert.deepEqual(after.keys, [{ key: 'user:2', assignment: '7/s' }])
  } finally {
    a.closeSync()
    b.closeSync()
  }
}

test('the shared policy store on memory://NAME', async () => {
  await storeRoundTrip(`memory://${unique('store')}`, 'ql')
})

test('the shared policy store on a real Redis', async (t) => {
  const server = new RedisServer()
  t.after(() => server.stop())
  const prefix = unique('p')
  await storeRoundTrip(server.url, prefix)
  // The store lives in Redis under the limiter's prefix, in one hash slot.
  const keys = server.cli('--scan', '--pattern', `${prefix}:policy:*`).split('\n').sort()
  assert.ok(keys.includes(`${prefix}:policy:{~}:keys`), keys.join(' '))
  assert.ok(keys.includes(`${prefix}:policy:{~}:version`), keys.join(' '))
  // Store calls wait off the event loop: an interval ticks while one waits on a paused Redis.
  const l = new Limiter({ url: server.url, keyPrefix: prefix, limit: 10, backendTimeoutMs: 5000 })
  assert.equal(await l.policyGet('user:2'), '7/s')
  server.pause()
  try {
    let ticks = 0
    const timer = setInterval(() => ticks++, 5)
    let settled = false
    const p = l.policyGet('user:2').then(
      (v) => ((settled = true), { v }),
      (err) => ((settled = true), { err }),
    )
    // If the call blocked the loop, no interval could fire before it settled.
    await waitFor('the interval to tick while policyGet is pending', () => ticks >= 5)
    assert.equal(settled, false, 'policyGet should still be waiting on the paused Redis')
    server.resume()
    const r = await p
    clearInterval(timer)
    assert.equal(r.err, undefined, String(r.err))
    assert.equal(r.v, '7/s')
  } finally {
    server.resume()
    await l.close()
  }
})

test('shadow mode admits what the rules deny, with no headers, and counts it', async () => {
  const l = manual({ tiers: 'beta=shadow 2/s; free=2/s' })
  const got = []
  for (let i = 0; i < 5; i++) got.push(l.acquireSync('k', { tier: 'beta' }))
  assert.ok(got.every((d) => d.allowed))
  const shadowed = got.filter((d) => d.reason === 'shadow')
  assert.equal(shadowed.length, 3)
  for (const d of shadowed) {
    assert.deepEqual(d.headers(), {})
    assert.equal(d.remaining, 0)
    assert.ok(d.retryAfterMs > 0)
  }
  assert.deepEqual([1, 2, 3].map(() => l.acquireSync('j', { tier: 'free' }).allowed), [true, true, false])
  assert.equal(l.metrics().shadow_denied, 3)
  assert.equal(l.metrics().denied, 4)
  const all = new Limiter({ limit: 1, windowMs: 60000, shadow: true })
  assert.equal(all.acquireSync('x').reason, 'lease')
  assert.equal((await all.acquire('x')).reason, 'shadow')
  assert.equal(all.tryAcquire('x').reason, 'shadow')
  assert.match(all.metricsPrometheus(), /^quotalease_shadow_denied_total 2$/m)
  // bad values: a boolean only where the engine takes one; the engine's own words otherwise
  assert.throws(() => new Limiter({ limit: 5, shadow: 'yes' }), /`shadow` must be true or false/)
  assert.throws(() => new Limiter({ limit: 5, shadow: 2 }), /`shadow` must be true or false/)
  assert.throws(() => new Limiter({ limit: true }), { name: 'TypeError', message: /`limit` must be a number \(got boolean true\)/ })
  assert.throws(() => new Limiter({ limit: 5, shadow: [] }), { name: 'TypeError', message: /`shadow` must be a boolean/ })
  l.close()
  all.close()
})

test('allow and deny entries: reasons of their own, nothing spent', async () => {
  const url = `memory://${unique('access')}`
  const a = manual({ url })
  const b = manual({ url })
  await a.policyAssign('bot', 'blocked')
  await a.policyAssign('ops', 'unlimited')
  await b.refreshPolicies()
  for (let i = 0; i < 3; i++) {
    const d = b.acquireSync('bot')
    assert.deepEqual([d.allowed, d.reason], [false, 'blocked'])
    assert.deepEqual(Object.keys(d.headers()), ['Retry-After'])
  }
  for (let i = 0; i < 300; i++) {
    const d = b.acquireSync('ops')
    assert.deepEqual([d.allowed, d.reason, d.headers()], [true, 'unlimited', {}])
  }
  assert.equal((await b.acquire('ops')).reason, 'unlimited')
  assert.equal(b.metrics().tokens_leased, 0)
  const p = b.policy('bot')
  assert.deepEqual([p.access, p.source], ['blocked', 'blocked (from store)'])
  assert.equal(b.policy('anyone').access, null)
  a.close()
  b.close()
})

test('acquire waits with waitMs: in time, at once when it cannot, in arrival order; sync calls refuse it', async () => {
  const l = new Limiter({ limit: 2, windowMs: 1000, leaseSize: 1 })
  assert.equal((await l.acquire('k', 2)).allowed, true)
  const denied = await l.acquire('k', 2, { waitMs: 10 })
  assert.equal(denied.allowed, false)
  assert.ok(denied.retryAfterMs > 10, 'two tokens take a second')
  let ticks = 0
  const tick = setInterval(() => { ticks++ }, 5)
  const order = []
  const first = l.acquire('k', 2, { waitMs: 30000 }).then((d) => { assert.ok(d.allowed); order.push('two tokens, first') })
  await waitFor('the first waiter queued', () => l.waiters('k') === 1)
  const second = l.acquire('k', { waitMs: 30000 }).then((d) => { assert.ok(d.allowed); order.push('one token, second') })
  await Promise.all([first, second])
  clearInterval(tick)
  assert.deepEqual(order, ['two tokens, first', 'one token, second'])
  assert.ok(ticks > 0, 'the event loop ran while the requests waited')
  assert.deepEqual([l.metrics().admitted, l.metrics().denied], [3, 1])
  assert.throws(() => l.acquireSync('k', { waitMs: 5 }), { name: 'TypeError', message: /waitMs would block the event loop/ })
  assert.throws(() => l.tryAcquire('k', 1, { waitMs: 5 }), { name: 'TypeError' })
  await assert.rejects(l.acquire('k', { waitMs: -1 }), { code: codes.CONFIG, message: /`waitMs` must be a whole number/ })
  await assert.rejects(l.acquire('k', { waitMs: 'soon' }), { name: 'TypeError' })
  await assert.rejects(l.acquire('k', 0, { waitMs: 5 }), { code: codes.INVALID_COST })
  await assert.rejects(l.acquire('k', 'x', { waitMs: 5 }), { name: 'TypeError', code: codes.INVALID_COST })
  l.close()
})
