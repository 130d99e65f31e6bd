'use strict'
// Against a real redis-server (tests/harness/redisctl): leasing, sharing,
// events, the event loop while Redis is paused, and process lifetime.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const path = require('node:path')

const { Limiter } = require('..')
const { RedisServer, unique, waitFor } = require('./helpers')

const server = new RedisServer()
test.after(() => server.stop())

const make = (o = {}) => new Limiter({ url: server.url, keyPrefix: unique('t'), limit: 100, windowMs: 3600000, ...o })

test('a cold await acquire leases from Redis; later ones are local', async () => {
  const l = make({ leaseSize: 5 })
  const d = await l.acquire('user:1')
  assert.equal(d.allowed, true)
  assert.equal(d.reason, 'lease')
  const calls = l.metrics().backend_calls
  for (let i = 0; i < 3; i++) assert.equal((await l.acquire('user:1')).allowed, true)
  assert.equal(l.metrics().backend_calls, calls, 'the hot path made no backend call')
  await l.close()
})

test('the bucket lives in Redis under {prefix}:{key}', async () => {
  const prefix = unique('p')
  const l = new Limiter({ url: server.url, keyPrefix: prefix, limit: 10, windowMs: 3600000, leaseSize: 2 })
  await l.acquire('k')
  assert.equal(server.cli('EXISTS', `${prefix}:{k}`), '1')
  assert.ok(Number(server.cli('PTTL', `${prefix}:{k}`)) > 0, 'the bucket expires when idle')
  await l.close()
})

test('a key is its UTF-8 bytes, ASCII or not, from every call', async () => {
  // The hot path reads an ASCII key as UTF-16 and narrows it; any other key
  // goes through V8's UTF-8 writer (a lone surrogate becomes U+FFFD, as in
  // Buffer.from). 'Łx' narrowed by byte truncation would read as 'Ax'.
  const prefix = unique('u')
  const l = new Limiter({ url: server.url, keyPrefix: prefix, limit: 10, windowMs: 3600000, leaseSize: 2 })
  const keys = ['café', '用户:42', '🙂', 'Łx', 'Ax', 'k\ud800x', 'é'.repeat(200)]
  for (const [i, k] of keys.entries()) {
    const d = i % 2 === 0 ? l.acquireSync(k) : await l.acquire(k)
    assert.equal(d.allowed, true, k)
    const stored = Buffer.from(`${prefix}:{${k}}`, 'utf8').toString('utf8')
    assert.equal(server.cli('EXISTS', stored), '1', `stored under its UTF-8 bytes: ${JSON.stringify(k)}`)
    assert.equal(l.inspect(k).admitted, 1, JSON.stringify(k))
  }
  assert.equal(server.cli('EXISTS', `${prefix}:{k\ufffdx}`), '1', 'a lone surrogate is U+FFFD')
  assert.equal(l.inspect('Ax').admitted, 1, "'Łx' did not count as 'Ax'")
  assert.throws(() => l.acquireSync('é'.repeat(257)), { code: 'ERR_QUOTALEASE_INVALID_KEY' }, '514 bytes')
  await l.close()
})

test('two limiters on one Redis share one bucket', async () => {
  const keyPrefix = unique('share')
  const opts = { url: server.url, keyPrefix, limit: 20, windowMs: 3600000, leaseSize: 3 }
  const a = new Limiter(opts)
  const b = new Limiter(opts)
  let allowed = 0
  for (let i = 0; i < 40; i++) {
    if ((await a.acquire('k')).allowed) allowed++
    if (b.acquireSync('k').allowed) allowed++
  }
  assert.ok(allowed <= 20, `admitted ${allowed} > limit 20`)
  assert.ok(allowed >= 20 - 2 * 3, `admitted ${allowed}: leases left unspent can't exceed 2 x leaseSize`)
  await Promise.all([a.close(), b.close()])
})

test('tryAcquire never waits: pending on a cold key, then leased', async () => {
  const l = make({ leaseSize: 5 })
  const d = l.tryAcquire('cold')
  assert.equal(d.allowed, false)
  assert.equal(d.reason, 'pending')
  l.settle()
  const e = l.tryAcquire('cold')
  assert.equal(e.allowed, true)
  assert.equal(e.reason, 'lease')
  await l.close()
})

test('flush and close give unused tokens back to Redis', async () => {
  const l = make({ leaseSize: 10 })
  await l.acquire('k')
  await l.flush()
  assert.ok(l.metrics().tokens_returned >= 9, JSON.stringify(l.metrics()))
  await l.acquire('k')
  await l.close()
  assert.ok(l.metrics().tokens_returned >= 18, JSON.stringify(l.metrics()))
})

test('exact mode calls Redis per request without blocking the loop', async () => {
  const l = make({ mode: 'exact', limit: 3 })
  const ds = []
  for (let i = 0; i < 4; i++) ds.push(await l.acquire('k'))
  assert.deepEqual(ds.map((d) => d.allowed), [true, true, true, false])
  assert.ok(ds.every((d) => d.reason === 'exact'))
  assert.equal(l.metrics().backend_calls, 4)
  await l.close()
})

test('degraded and recovered events when Redis dies and comes back', async () => {
  const own = new RedisServer()
  const seen = []
  const viaOption = []
  const l = new Limiter({ url: own.url, limit: 100, windowMs: 60000, leaseSize: 1, backendTimeoutMs: 200, onEvent: (e) => viaOption.push(e.kind) })
  l.on('degraded', (e) => seen.push(e))
  l.on('recovered', (e) => seen.push(e))
  assert.equal((await l.acquire('k')).reason, 'lease')
  own.kill()
  await waitFor('a degraded event', async () => {
    const d = await l.acquire(unique('k'))
    assert.equal(d.reason, 'fallback')
    return seen.length >= 1
  })
  assert.equal(seen[0].kind, 'degraded')
  assert.match(seen[0].message, /\w/)
  assert.equal(l.metrics().fallback_active, 1)
  own.restart()
  await waitFor('a recovered event', async () => {
    await l.acquire(unique('k'))
    return seen.length >= 2
  })
  assert.equal(seen[1].kind, 'recovered')
  assert.deepEqual(viaOption, ['degraded', 'recovered'])
  await waitFor('leasing again', async () => (await l.acquire(unique('k'))).reason === 'lease')
  await l.close()
  own.stop()
})

test('the event loop keeps running while an acquire waits on a paused Redis', async () => {
  const own = new RedisServer()
  const l = new Limiter({ url: own.url, limit: 100, windowMs: 60000, backendTimeoutMs: 5000 })
  own.pause()
  try {
    let ticks = 0
    const timer = setInterval(() => ticks++, 5)
    let settled = false
    const p = l.acquire('cold').then((d) => {
      settled = true
      return d
    })
    // If the acquire blocked the loop, no interval could fire before it settled.
    await waitFor('the interval to tick while the acquire is pending', () => ticks >= 5)
    assert.equal(settled, false, 'the acquire should still be waiting on the paused Redis')
    own.resume()
    const d = await p
    clearInterval(timer)
    assert.ok(['lease', 'fallback'].includes(d.reason), d.reason)
  } finally {
    own.resume()
    await l.close()
    own.stop()
  }
})

function runChild(code) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', code], {
      cwd: path.resolve(__dirname, '..'),
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let out = ''
    let err = ''
    child.stdout.on('data', (b) => (out += b))
    child.stderr.on('data', (b) => (err += b))
    // Hang guard: a process kept alive by the limiter never exits by itself.
    const guard = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`the child process did not exit by itself\nstdout: ${out}\nstderr: ${err}`))
    }, 30000)
    child.on('exit', (status) => {
      clearTimeout(guard)
      resolve({ status, out, err })
    })
  })
}

test('after close() nothing keeps the process alive (with event listeners)', async () => {
  const r = await runChild(`
    const { Limiter } = require('.')
    const l = new Limiter({ url: ${JSON.stringify(server.url)}, limit: 10, windowMs: 60000, onEvent: () => {} })
    l.on('degraded', () => {})
    l.acquire('k').then(async (d) => { console.log('allowed', d.allowed); await l.close(); console.log('closed') })
  `)
  assert.equal(r.status, 0, r.err)
  assert.equal(r.out, 'allowed true\nclosed\n')
})

test('an idle limiter that was never closed does not keep the process alive', async () => {
  const r = await runChild(`
    const { Limiter } = require('.')
    const l = new Limiter({ url: ${JSON.stringify(server.url)}, limit: 10, windowMs: 60000 })
    l.on('recovered', () => {})
    console.log('allowed', l.acquireSync('k').allowed)
  `)
  assert.equal(r.status, 0, r.err)
  assert.equal(r.out, 'allowed true\n')
})

test('a pending acquire keeps the process alive until it settles', async () => {
  // Nothing else is scheduled: without the pending promise holding the loop,
  // the process would exit before printing.
  const r = await runChild(`
    const { Limiter } = require('.')
    const l = new Limiter({ url: ${JSON.stringify(server.url)}, limit: 10, windowMs: 60000 })
    l.acquire('k').then((d) => console.log('settled', d.reason))
  `)
  assert.equal(r.status, 0, r.err)
  assert.equal(r.out, 'settled lease\n')
})
