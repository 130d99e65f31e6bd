'use strict'
// The conformance vectors (tests/vectors, format in its README) against the
// in-memory authority and a real Redis, through the public API, once with
// `await acquire()` and once with `acquireSync()`.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const { Limiter } = require('..')
const { RedisServer, unique, REPO } = require('./helpers')

const DIR = path.join(REPO, 'tests', 'vectors')
const FILES = fs
  .readdirSync(DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()

const NAMES = {
  limit: 'limit',
  window_ms: 'windowMs',
  lease_size: 'leaseSize',
  refill_threshold: 'refillThreshold',
  lease_ttl_ms: 'leaseTtlMs',
  on_backend_failure: 'onBackendFailure',
  expected_replicas: 'expectedReplicas',
  backend_timeout_ms: 'backendTimeoutMs',
  max_keys: 'maxKeys',
  mode: 'mode',
  url: 'url',
  key_prefix: 'keyPrefix',
  tiers: 'tiers',
  default_tier: 'defaultTier',
  policy_file: 'policyFile',
  policy_refresh_ms: 'policyRefreshMs',
}

const KINDS = {
  ERR_QUOTALEASE_CONFIG: 'config',
  ERR_QUOTALEASE_INVALID_KEY: 'invalid_key',
  ERR_QUOTALEASE_INVALID_COST: 'invalid_cost',
  ERR_QUOTALEASE_CLOSED: 'closed',
  ERR_QUOTALEASE_BACKEND: 'backend',
  ERR_QUOTALEASE_MISCONFIGURED: 'misconfigured',
  ERR_QUOTALEASE_RESERVATION: 'reservation',
}

const FIELDS = {
  allowed: 'allowed',
  reason: 'reason',
  limit: 'limit',
  remaining: 'remaining',
  retry_after_ms: 'retryAfterMs',
  reset_after_ms: 'resetAfterMs',
  window_ms: 'windowMs',
  rule: 'rule',
}

function options(json, url, prefix) {
  // The vectors' manual clock starts at 1000000 ms: the engine's default.
  const o = { url, keyPrefix: prefix, clock: 'manual' }
  for (const [k, v] of Object.entries(json)) {
    // Names the table does not list go through as written: the engine takes snake_case too.
    o[NAMES[k] ?? k] = v
  }
  return o
}

function keyOf(step) {
  const k = step.key
  if (typeof k === 'string') return k
  if (k && typeof k === 'object') return k.repeat.repeat(k.times)
  return 'k'
}

function kindOf(err) {
  assert.ok(err instanceof Error, `expected an Error, got ${err}`)
  assert.ok(KINDS[err.code], `error without a quotalease code: ${err.code} ${err.message}`)
  return KINDS[err.code]
}

async function outcome(fn) {
  try {
    return { value: await fn() }
  } catch (err) {
    return { err }
  }
}

async function runVector(file, backend, url, sync) {
  const v = JSON.parse(fs.readFileSync(path.join(DIR, file), 'utf8'))
  const base = v.config || {}
  const ns = unique('v')
  const theUrl = url || `memory://${v.name}-${ns}`
  const limiters = []
  for (let i = 0; i < (v.instances || 1); i++) limiters.push(new Limiter(options(base, theUrl, ns)))
  const settle = () => {
    for (const l of limiters) {
      try {
        l.settle()
      } catch (err) {
        if (err.code !== 'ERR_QUOTALEASE_CLOSED') throw err
      }
    }
  }
  // A step's `tier` goes in the options argument, as an application names it.
  const acquire = (l, key, cost, tier) => {
    if (tier === undefined) return sync ? l.acquireSync(key, cost) : l.acquire(key, cost)
    return sync ? l.acquireSync(key, cost, { tier }) : l.acquire(key, cost, { tier })
  }
  const tryAcquire = (l, key, cost, tier) => (tier === undefined ? l.tryAcquire(key, cost) : l.tryAcquire(key, cost, { tier }))
  let checked = 0
  for (const [i, step] of v.steps.entries()) {
    if (step.only && step.only !== backend) continue
    const ctx = `${v.name} [${backend}${sync ? ', sync' : ''}] step ${i} ${JSON.stringify(step)}`
    const l = limiters[step.instance || 0]
    const cost = step.cost === undefined ? 1 : step.cost
    let r = null
    switch (step.op) {
      case 'acquire':
        r = await outcome(() => acquire(l, keyOf(step), cost, step.tier))
        break
      case 'try_acquire':
        r = await outcome(() => tryAcquire(l, keyOf(step), cost, step.tier))
        break
      case 'acquire_n': {
        let allowed = 0
        let denied = 0
        for (let n = 0; n < step.count; n++) {
          const d = await acquire(l, keyOf(step), cost, step.tier)
          if (d.allowed) allowed++
          else denied++
          settle()
        }
        assert.deepEqual({ allowed, denied }, step.expect, ctx)
        break
      }
      case 'policy_set_tier':
      case 'policy_delete_tier':
      case 'policy_assign':
      case 'policy_unassign': {
        const call = {
          policy_set_tier: () => l.policySetTier(step.name, step.rules),
          policy_delete_tier: () => l.policyDeleteTier(step.name),
          policy_assign: () => l.policyAssign(keyOf(step), step.assignment),
          policy_unassign: () => l.policyUnassign(keyOf(step)),
        }[step.op]
        const s = await outcome(call)
        if (step.expect_error) {
          assert.ok(s.err, `${ctx}: expected error ${step.expect_error}, got ${JSON.stringify(s.value)}`)
          assert.equal(kindOf(s.err), step.expect_error, `${ctx}: ${s.err.message}`)
        } else {
          assert.equal(s.err, undefined, `${ctx}: ${s.err && s.err.message}`)
          // Every write answers with the store's version, a whole number > 0.
          assert.ok(Number.isSafeInteger(s.value) && s.value > 0, `${ctx}: version ${s.value}`)
        }
        break
      }
      case 'advance':
        for (const x of limiters) x.advanceClock(step.ms)
        break
      case 'settle':
        break
      case 'set_limit': {
        const s = await outcome(() => l.setLimit(keyOf(step), step.limit, step.window_ms))
        if (step.expect_error) assert.equal(kindOf(s.err), step.expect_error, ctx)
        else assert.equal(s.err, undefined, `${ctx}: ${s.err && s.err.message}`)
        break
      }
      case 'flush':
        await l.flush()
        break
      case 'close':
        await l.close()
        break
      case 'metrics': {
        const m = l.metrics()
        for (const [k, want] of Object.entries(step.expect)) {
          assert.ok(k in m, `${ctx}: unknown metric ${k}`)
          assert.equal(m[k], want, `${ctx}: metric ${k} of ${JSON.stringify(m)}`)
        }
        break
      }
      case 'new': {
        const cfg = { ...base, ...step.config }
        const n = await outcome(() => new Limiter(options(cfg, theUrl, ns)))
        assert.ok(n.err, `${ctx}: expected an error`)
        assert.equal(kindOf(n.err), step.expect_error, ctx)
        break
      }
      default:
        assert.fail(`${ctx}: unknown op ${step.op}`)
    }
    if (r) {
      if (step.expect_error) {
        assert.ok(r.err, `${ctx}: expected error ${step.expect_error}, got ${JSON.stringify(r.value)}`)
        assert.equal(kindOf(r.err), step.expect_error, `${ctx}: ${r.err.message}`)
      } else {
        assert.equal(r.err, undefined, `${ctx}: unexpected error ${r.err && r.err.message}`)
        for (const [k, want] of Object.entries(step.expect || {})) {
          assert.ok(FIELDS[k], `${ctx}: unknown decision field ${k}`)
          assert.equal(r.value[FIELDS[k]], want, `${ctx}: field ${k} of ${JSON.stringify(r.value)}`)
        }
      }
    }
    settle()
    checked++
  }
  for (const l of limiters) l.closeSync()
  return checked
}

test('there are conformance vectors', () => {
  assert.ok(FILES.length >= 15, `expected at least 15 vectors in ${DIR}`)
})

for (const sync of [false, true]) {
  test(`vectors on memory:// (${sync ? 'acquireSync' : 'await acquire'})`, async (t) => {
    let steps = 0
    for (const f of FILES) {
      await t.test(f, async () => {
        steps += await runVector(f, 'memory', null, sync)
      })
    }
    assert.ok(steps > 100, `only ${steps} steps ran`)
  })
}

test('vectors on a real Redis', async (t) => {
  const server = new RedisServer()
  t.after(() => server.stop())
  for (const sync of [false, true]) {
    let steps = 0
    for (const f of FILES) {
      await t.test(`${f} (${sync ? 'acquireSync' : 'await acquire'})`, async () => {
        steps += await runVector(f, 'redis', server.url, sync)
      })
    }
    assert.ok(steps > 100, `only ${steps} steps ran`)
  }
})
