'use strict'
// Calendar quotas ('50/day@Europe/Berlin', '30/month@billing-day-15') through
// the Node API, sync and Promise, with manual clocks set to dates (a manual
// clock reads Unix ms): the whole quota comes back at the period's start in
// its zone and not a millisecond before, the decision's times are the true
// ones, a calendar rule sits in a tier beside a rate and the headers name it
// by its period ("1day", "1month", also for a decision that crossed a
// process boundary as JSON), and bad rules are the engine's config errors.
// The core's core/tests/calendar.rs is the model.

const test = require('node:test')
const assert = require('node:assert/strict')

const { Limiter, headers, codes } = require('..')
const { RedisServer, unique } = require('./helpers')

const HOUR = 3_600_000
const DAY = 24 * HOUR

/** Unix ms of a UTC instant written '2026-12-04T22:00:00'. */
const at = (text) => Date.parse(`${text}Z`)

function limiter(url, start, options) {
  return new Limiter({ url, clock: 'manual', clockStartMs: at(start), keyPrefix: unique('cal'), backendTimeoutMs: 10_000, ...options })
}

/** Requests of cost 1 admitted at this instant until the first denial. */
function drain(l, key) {
  let n = 0
  while (l.acquireSync(key).allowed) {
    n++
    assert.ok(n <= 100_000, 'never denied')
  }
  return n
}

async function drainAsync(l, key) {
  let n = 0
  while ((await l.acquire(key)).allowed) {
    n++
    assert.ok(n <= 100_000, 'never denied')
  }
  return n
}

/** A daily quota in Berlin across midnight (22:00 UTC on 2026-12-04 is 23:00 there). */
async function berlinDay(url) {
  const l = limiter(url, '2026-12-04T22:00:00', { rate: '50/day@Europe/Berlin' })
  assert.equal(drain(l, 'k'), 50)
  const d = l.acquireSync('k')
  assert.equal(d.allowed, false)
  assert.equal(d.reason, 'exhausted')
  assert.equal(d.limit, 50)
  assert.equal(d.retryAfterMs, HOUR, 'until midnight in Berlin')
  assert.equal(d.resetAfterMs, HOUR)
  assert.equal(d.windowMs, DAY, 'the nominal day')
  assert.equal(d.rule, 0)
  assert.deepEqual(d.rules, [{ limit: 50, windowMs: DAY, calendar: 'day@Europe/Berlin' }])
  assert.deepEqual(d.headers(), {
    'RateLimit-Policy': '"default";q=50;w=86400',
    RateLimit: '"default";r=0;t=3600',
    'Retry-After': '3600',
  })
  // Nothing refills within the day, however long it waits.
  l.advanceClock(HOUR - 1)
  const late = await l.acquire('k')
  assert.equal(late.allowed, false, 'a token bucket would have refilled')
  assert.equal(late.retryAfterMs, 1)
  assert.equal(late.resetAfterMs, 1)
  l.advanceClock(1)
  assert.equal(await drainAsync(l, 'k'), 50, "the next day's quota, all of it")
  const next = l.tryAcquire('k')
  assert.equal(next.allowed, false)
  assert.equal(next.retryAfterMs, DAY)
  assert.equal(next.resetAfterMs, DAY)
  await l.close()
}

test('a daily quota comes back at midnight in its zone (memory)', () => berlinDay(`memory://${unique('cal')}`))

test('a daily quota comes back at midnight in its zone (Redis)', async (t) => {
  const server = new RedisServer()
  t.after(() => server.stop())
  await berlinDay(server.url)
})

test('a monthly quota on a billing day resets on that day', async () => {
  const l = limiter(`memory://${unique('cal')}`, '2026-12-14T23:59:00', { rate: '30/month@billing-day-15' })
  const d = await l.acquire('k')
  assert.equal(d.allowed, true)
  assert.equal(d.resetAfterMs, 60_000, 'the 15th starts the month')
  assert.equal(d.windowMs, 30 * DAY, 'the nominal month')
  assert.deepEqual(d.rules, [{ limit: 30, windowMs: 30 * DAY, calendar: 'month@billing-day-15 UTC' }])
  assert.equal(d.headers()['RateLimit-Policy'], '"default";q=30;w=2592000')
  assert.equal(drain(l, 'k'), 29)
  l.advanceClock(60_000)
  assert.equal(await drainAsync(l, 'k'), 30)
  const denied = l.acquireSync('k')
  // 2026-12-15 to 2027-01-15: 31 days.
  assert.equal(denied.allowed, false)
  assert.equal(denied.retryAfterMs, 31 * DAY)
  assert.equal(denied.resetAfterMs, 31 * DAY)
  l.closeSync()
})

test("a billing day past a short month's end starts the month on its last day", () => {
  // February 2027 has 28 days: its month of billing day 31 starts on the 28th.
  const l = limiter(`memory://${unique('cal')}`, '2027-02-27T00:00:00', { rate: '10/month@billing-day-31' })
  assert.equal(drain(l, 'k'), 10)
  assert.equal(l.acquireSync('k').retryAfterMs, DAY, 'from January 31st to February 28th')
  l.advanceClock(DAY)
  assert.equal(drain(l, 'k'), 10)
  assert.equal(l.acquireSync('k').retryAfterMs, 31 * DAY, '2027-02-28 to 2027-03-31')
  l.closeSync()
})

test('a calendar quota is one rule among several: the daily rule denies, headers name it "1day"', async () => {
  const l = limiter(`memory://${unique('cal')}`, '2026-12-04T12:00:00', { limit: 1, tiers: 'pro=10/s, 25/day@UTC', defaultTier: 'pro' })
  let admitted = 0
  for (let i = 0; i < 10; i++) {
    admitted += i % 2 ? drain(l, 'k') : await drainAsync(l, 'k')
    l.advanceClock(1000)
  }
  assert.equal(admitted, 25, 'ten seconds of 10/s, held to 25 a day')
  for (const d of [l.acquireSync('k'), await l.acquire('k'), l.tryAcquire('k', { tier: 'pro' })]) {
    assert.equal(d.allowed, false)
    assert.equal(d.rule, 1, 'the daily rule denies')
    assert.deepEqual(d.rules, [
      { limit: 10, windowMs: 1000 },
      { limit: 25, windowMs: DAY, calendar: 'day@UTC' },
    ])
    assert.equal(d.limit, 25)
    assert.equal(d.remaining, 0)
    assert.equal(d.windowMs, DAY)
    assert.equal(d.retryAfterMs, 12 * HOUR - 10_000, 'until midnight UTC')
    assert.equal(d.resetAfterMs, 12 * HOUR - 10_000)
    const want = {
      'RateLimit-Policy': '"1s";q=10;w=1, "1day";q=25;w=86400',
      RateLimit: '"1day";r=0;t=43190',
      'Retry-After': '43190',
    }
    assert.deepEqual(d.headers(), want)
    assert.deepEqual(headers(JSON.parse(JSON.stringify(d))), want, 'a copy that lost its prototype')
  }
  assert.deepEqual(l.policy('k').rules, [
    { limit: 10, windowMs: 1000 },
    { limit: 25, windowMs: DAY, calendar: 'day@UTC' },
  ])
  assert.deepEqual(l.tiers()[0].rules, l.policy('k').rules)
  l.closeSync()
})

test('a month, a week and a year among several rules are named by their period, not their nominal window', () => {
  const l = limiter(`memory://${unique('cal')}`, '2026-12-02T00:00:00', {
    limit: 1,
    tiers: 'm=10/s, 3/month@UTC; w=10/s, 3/week@UTC; y=10/s, 3/year@UTC',
  })
  // 2026-12-02 is a Wednesday.
  for (const [tier, name, windowMs, reset] of [
    ['m', '1month', 30 * DAY, 30 * DAY],
    ['w', '1week', 7 * DAY, 5 * DAY],
    ['y', '1year', 365 * DAY, 30 * DAY],
  ]) {
    for (let i = 0; i < 3; i++) assert.equal(l.acquireSync(tier, { tier }).allowed, true, tier)
    const d = l.acquireSync(tier, { tier })
    assert.equal(d.allowed, false, tier)
    assert.equal(d.rule, 1, tier)
    assert.equal(d.windowMs, windowMs, tier)
    assert.equal(d.retryAfterMs, reset, tier)
    const want = {
      'RateLimit-Policy': `"1s";q=10;w=1, "${name}";q=3;w=${windowMs / 1000}`,
      RateLimit: `"${name}";r=0;t=${reset / 1000}`,
      'Retry-After': String(reset / 1000),
    }
    assert.deepEqual(d.headers(), want, tier)
    assert.deepEqual(headers(JSON.parse(JSON.stringify(d))), want, tier)
  }
  l.closeSync()
})

test('headers(): a hand-made calendar rule is checked by the engine', () => {
  const d = { allowed: false, limit: 3, remaining: 0, retryAfterMs: 5000, resetAfterMs: 5000, windowMs: 30 * DAY, rule: 1 }
  const rules = (calendar) => [{ limit: 10, windowMs: 1000 }, { limit: 3, windowMs: 30 * DAY, calendar }]
  assert.equal(headers({ ...d, rules: rules('month@America/New_York') }).RateLimit, '"1month";r=0;t=5')
  assert.equal(headers({ ...d, rules: rules(undefined) }).RateLimit, '"30day";r=0;t=5', 'without a calendar: a token bucket')
  assert.throws(() => headers({ ...d, rules: rules(7) }), (err) => err instanceof TypeError && err.code === codes.CONFIG)
  assert.throws(() => headers({ ...d, rules: rules('month@Mars/Olympus') }), (err) => err.code === codes.CONFIG && /does not know/.test(err.message))
  assert.throws(() => headers({ ...d, rules: rules('day@UTC') }), (err) => err.code === codes.CONFIG && /not a calendar period of windowMs/.test(err.message))
})

test('a calendar tier from the shared policy store', async () => {
  const url = `memory://${unique('cal')}`
  const a = limiter(url, '2026-12-04T22:00:00', { limit: 100, policyRefreshMs: 1000 })
  const b = limiter(url, '2026-12-04T22:00:00', { limit: 100, policyRefreshMs: 1000 })
  await a.policySetTier('daily', '5/day@Europe/Berlin')
  await a.policyAssign('k', 'tier:daily')
  await b.refreshPolicies()
  assert.deepEqual(b.policy('k').rules, [{ limit: 5, windowMs: DAY, calendar: 'day@Europe/Berlin' }])
  assert.deepEqual((await b.policyList()).tiers, [{ name: 'daily', rules: '5/day@Europe/Berlin' }])
  assert.equal(await drainAsync(b, 'k'), 5)
  assert.equal(b.acquireSync('k').retryAfterMs, HOUR)
  await assert.rejects(a.policySetTier('bad', '5/day@Mars/Olympus'), (err) => err.code === codes.CONFIG && /does not know/.test(err.message))
  a.closeSync()
  b.closeSync()
})

test('bad calendar rules are config errors, as rate and in tiers', () => {
  for (const [rate, want] of [
    ['10/month@Mars/Olympus', 'does not know'],
    ['10/month', 'needs a time zone'],
    ['10/day@billing-day-3', 'only months have one'],
    ['10/month@billing-day-40', '1 to 31'],
    ['10/fortnight@UTC', 'one of day, week, month, year'],
    ['9999999/month@UTC', 'at most 1737499 per month'],
  ]) {
    for (const options of [{ rate }, { limit: 5, tiers: `t=${rate}` }]) {
      assert.throws(
        () => new Limiter(options),
        (err) => !(err instanceof TypeError) && err.code === codes.CONFIG && err.message.includes(want),
        JSON.stringify(options),
      )
    }
  }
})

test('a calendar rule needs adaptive leasing', () => {
  for (const options of [
    { rate: '10/day@UTC', mode: 'exact' },
    { rate: '10/day@UTC', mode: 'local' },
    { rate: '10/day@UTC', leaseSize: 2 },
    { limit: 5, tiers: 't=10/day@UTC', mode: 'exact' },
    { limit: 5, tiers: 't=10/day@UTC', mode: 'local' },
  ]) {
    assert.throws(
      () => new Limiter(options),
      (err) => err.code === codes.CONFIG && err.message.includes('needs adaptive leasing'),
      JSON.stringify(options),
    )
  }
})
