'use strict'
// A Redis URL's user name and password are never printed: util.inspect,
// toString, error messages and the degraded event's message show the URL as
// the engine's rule gives it (redis://***@host:port). Each test also checks
// that the host is still shown, so an empty string cannot pass.

const test = require('node:test')
const assert = require('node:assert/strict')
const net = require('node:net')
const util = require('node:util')

const { Limiter, redactUrl, codes } = require('..')
const { RedisServer, unique, waitFor } = require('./helpers')

const USER = 'alice-user-QRS'
const PW = 's3cret-pw-XYZ'

function assertClean(what, text) {
  assert.ok(!text.includes(PW), `${what} shows the password: ${text}`)
  assert.ok(!text.includes(USER), `${what} shows the user name: ${text}`)
}

/** A loopback port nothing listens on (bound, then released). */
async function closedPort() {
  const s = net.createServer()
  await new Promise((resolve) => s.listen(0, '127.0.0.1', resolve))
  const { port } = s.address()
  await new Promise((resolve) => s.close(resolve))
  return port
}

/** A limiter on `url`, acquiring until its degraded event; its message. */
async function degradedMessage(url) {
  const l = new Limiter({ url, keyPrefix: unique('sec'), limit: 100, backendTimeoutMs: 300 })
  const seen = []
  l.on('degraded', (e) => seen.push(e.message))
  await waitFor('a degraded event', async () => {
    // a refused password is a configuration error (misconfig.test.js), not an outage
    await l.acquire('k').catch((e) => {
      if (e.code !== codes.MISCONFIGURED) throw e
      assertClean('the acquire error', e.message)
    })
    return seen.length > 0
  })
  return { l, message: seen[0] }
}

test('redactUrl is the engine rule', () => {
  assert.equal(redactUrl(`redis://${USER}:${PW}@h:6379/0`), 'redis://***@h:6379/0')
  assert.equal(redactUrl(`redis+cluster://:${PW}@a:1,b:2`), 'redis+cluster://***@a:1,b:2')
  assert.equal(redactUrl(`unix:///run/redis.sock?pass=${PW}`), 'unix:///run/redis.sock?pass=***')
  assert.equal(redactUrl(`redis://${USER}:${PW}`), 'redis://***')
  assert.equal(redactUrl('redis://127.0.0.1:6379'), 'redis://127.0.0.1:6379')
  assert.throws(() => redactUrl(5), { code: codes.CONFIG })
})

test('util.inspect, console formatting and toString show the URL redacted', () => {
  const l = new Limiter({ url: `redis://${USER}:${PW}@127.0.0.1:6379/0`, limit: 100 })
  const shown = 'redis://***@127.0.0.1:6379/0'
  for (const text of [
    util.inspect(l),
    util.inspect(l, { depth: 5, showHidden: true }),
    util.format('%o %O %s', l, l, l),
    String(l),
    `${l}`,
    util.inspect({ nested: [l] }),
  ]) {
    assertClean('the printed limiter', text)
    assert.ok(text.includes(shown), text)
  }
  assert.equal(
    util.inspect(l, { breakLength: Infinity }),
    "Limiter { url: 'redis://***@127.0.0.1:6379/0', limit: 100, windowMs: 60000, leaseSize: 2, mode: 'lease' }",
  )
  assert.equal(String(l), `Limiter(url='${shown}', limit=100, windowMs=60000, leaseSize=2, mode='lease')`)
  l.closeSync()
})

test('config errors never show the password', () => {
  for (const url of [
    `redis://${USER}:${PW}@127.0.0.1:notaport`,
    `redis://${USER}:${PW}@127.0.0.1:6379/notadb`,
    `unix:///run/redis.sock?user=${USER}&pass=${PW}`,
    `redis://${USER}:${PW}`,
  ]) {
    let err
    assert.throws(() => new Limiter({ url, limit: 5 }), (e) => ((err = e), e.code === codes.CONFIG))
    assertClean('the error', `${err.message} ${util.inspect(err)}`)
    assert.ok(err.message.includes('`url`'), err.message)
  }
  // A URL given to a number option.
  let err
  assert.throws(() => new Limiter({ limit: `redis://${USER}:${PW}@h:1` }), (e) => ((err = e), e.code === codes.CONFIG))
  assertClean('the error', err.message)
  assert.ok(err.message.includes('redis://***@h:1'), err.message)
})

test('a URL given to a string option the engine quotes is shown redacted', async () => {
  const url = `redis://${USER}:${PW}@h:1/0`
  const shown = 'redis://***@h:1/0'
  const cases = [
    ['rate', () => new Limiter({ rate: url })],
    ['mode', () => new Limiter({ rate: '5/min', mode: url })],
    ['onBackendFailure', () => new Limiter({ rate: '5/min', onBackendFailure: url })],
    ['overshootBudget', () => new Limiter({ rate: '5/min', overshootBudget: url })],
    ['tiers', () => new Limiter({ rate: '5/min', tiers: `free=${url}` })],
    ['policyFile', () => new Limiter({ rate: '5/min', policyFile: `/nonexistent/${url}` })],
    ['a quote in the value', () => new Limiter({ rate: `"${url}` })],
    ['parseRate', () => require('..').parseRate(url)],
    ['setLimit', () => new Limiter({ rate: '5/min' }).setLimit('k', url)],
  ]
  for (const [what, make] of cases) {
    let err
    assert.throws(make, (e) => ((err = e), e.code === codes.CONFIG), what)
    assertClean(what, `${err.message} ${err.stack} ${util.inspect(err)}`)
    assert.ok(err.message.includes('***'), `${what}: ${err.message}`)
  }
  // The value itself, where the engine quotes it whole, keeps its host; so
  // does one without its scheme (the engine redacts a quoted value with an @).
  assert.throws(() => new Limiter({ rate: url }), (e) => e.message.includes(shown))
  const bare = `${USER}:${PW}@h:1`
  for (const make of [() => new Limiter({ rate: bare }), () => new Limiter({ rate: '5/min', tiers: `pro=${bare}` })]) {
    let err
    assert.throws(make, (e) => ((err = e), e.code === codes.CONFIG))
    assertClean('a URL without its scheme', `${err.message} ${err.stack}`)
    assert.ok(err.message.includes('"***@h:1"'), err.message)
  }
  const store = new Limiter({ url: `memory://${unique('sec')}`, rate: '5/min' })
  try {
    for (const [what, call] of [
      ['policySetTier', () => store.policySetTier('pro', url)],
      ['policyAssign', () => store.policyAssign('k', url)],
    ]) {
      let err
      await assert.rejects(call, (e) => ((err = e), e.code === codes.CONFIG), what)
      assertClean(what, `${err.message} ${err.stack}`)
    }
  } finally {
    await store.close()
  }
})

test('a failing connection: the event, the inspect error and the limiter', async () => {
  const port = await closedPort()
  const { l, message } = await degradedMessage(`redis://${USER}:${PW}@127.0.0.1:${port}/0`)
  assertClean('the degraded message', message)
  assert.ok(message.includes('backend unreachable'), message)
  let err
  assert.throws(() => l.inspect('k'), (e) => ((err = e), e.code === codes.BACKEND))
  assertClean('the inspect error', `${err.message} ${util.inspect(err)}`)
  assertClean('the limiter', util.inspect(l))
  assert.ok(util.inspect(l).includes(`redis://***@127.0.0.1:${port}/0`))
  await l.close()
})

test('a wrong password on a real server', async () => {
  const server = new RedisServer()
  try {
    server.cli('ACL', 'SETUSER', USER, 'on', '>another-password', '~*', '+@all')
    const { l, message } = await degradedMessage(`redis://${USER}:${PW}@127.0.0.1:${server.port}`)
    assertClean('the degraded message', message)
    assert.ok(message.includes('AuthenticationFailed'), message)
    let err
    assert.throws(() => l.inspect('k'), (e) => ((err = e), e.code === codes.MISCONFIGURED))
    assertClean('the inspect error', err.message)
    await l.close()
  } finally {
    server.stop()
  }
})
