'use strict'
// A Redis URL the server refuses is a configuration error, not an outage
// (issue 25): acquire and check() throw ERR_QUOTALEASE_MISCONFIGURED naming
// the host, never the password; the degraded line goes to stderr by default
// and QUOTALEASE_STDERR_LOG=0 silences it. Prometheus labels put two
// limiters in one exposition with each family once.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const path = require('node:path')

const { Limiter, codes, metricsPrometheus } = require('..')
const { RedisServer, unique } = require('./helpers')

const PW = 's3cret-pw-XYZ'

function assertMisconfigured(err, host) {
  assert.equal(err.code, codes.MISCONFIGURED, String(err))
  assert.equal(codes.MISCONFIGURED, 'ERR_QUOTALEASE_MISCONFIGURED')
  assert.ok(err.message.includes(host), err.message)
  assert.ok(err.message.includes('authentication failed'), err.message)
  assert.ok(!err.message.includes(PW), err.message)
  return true
}

test('a wrong password throws from acquire and check', async () => {
  const server = new RedisServer()
  try {
    server.cli('CONFIG', 'SET', 'requirepass', 'the-right-one')
    const host = `127.0.0.1:${server.port}`
    const options = { url: `redis://:${PW}@${host}`, keyPrefix: unique('mis'), limit: 100, backendTimeoutMs: 1000 }
    const l = new Limiter(options)
    await assert.rejects(l.check(), (e) => assertMisconfigured(e, host))
    assert.throws(() => l.checkSync(), (e) => assertMisconfigured(e, host))
    await assert.rejects(l.acquire('k'), (e) => assertMisconfigured(e, host))
    assert.throws(() => l.acquireSync('k'), (e) => assertMisconfigured(e, host))
    assert.throws(() => l.tryAcquire('k'), (e) => assertMisconfigured(e, host))
    assert.equal(l.metrics().admitted, 0)
    l.closeSync()
    const good = new Limiter({ ...options, url: `redis://:the-right-one@${host}` })
    await good.check()
    assert.equal((await good.acquire('k')).reason, 'lease')
    good.closeSync()
  } finally {
    server.stop()
  }
})

test('the degraded line goes to stderr unless QUOTALEASE_STDERR_LOG=0', () => {
  const server = new RedisServer()
  try {
    server.cli('CONFIG', 'SET', 'requirepass', 'the-right-one')
    // The child exits after its degraded event (delivered after the stderr
    // line is written, both from the broker thread), then prints nothing more.
    const code = `
      const { Limiter } = require('.')
      const l = new Limiter({ url: 'redis://:${PW}@127.0.0.1:${server.port}', limit: 10, backendTimeoutMs: 1000 })
      l.on('degraded', () => { process.stdout.write('event\\n'); l.closeSync() })
      l.acquire('k').catch(() => {})
    `
    const loud = spawnSync(process.execPath, ['-e', code], { cwd: path.join(__dirname, '..'), encoding: 'utf8' })
    assert.equal(loud.stdout, 'event\n', loud.stderr)
    assert.match(loud.stderr, /quotalease: degraded \(redis:\/\/\*\*\*@127\.0\.0\.1:\d+\): backend misconfigured/)
    assert.ok(!loud.stderr.includes(PW), loud.stderr)
    const quiet = spawnSync(process.execPath, ['-e', code], {
      cwd: path.join(__dirname, '..'),
      env: { ...process.env, QUOTALEASE_STDERR_LOG: '0' },
      encoding: 'utf8',
    })
    assert.equal(quiet.stdout, 'event\n', quiet.stderr)
    assert.ok(!quiet.stderr.includes('quotalease:'), quiet.stderr)
  } finally {
    server.stop()
  }
})

test('two labelled limiters make one exposition, each family once', () => {
  const api = new Limiter({ limit: 10 })
  const route = new Limiter({ limit: 5 })
  api.acquireSync('k')
  const text = metricsPrometheus([
    { limiter: api, labels: { limiter: 'api' } },
    { limiter: route, labels: { limiter: 'per-route' } },
  ])
  assert.equal(text.split('# TYPE quotalease_admitted_total counter').length, 2, text)
  assert.ok(text.includes('quotalease_admitted_total{limiter="api"} 1\n'), text)
  assert.ok(text.includes('quotalease_admitted_total{limiter="per-route"} 0\n'), text)
  assert.ok(api.metricsPrometheus({ labels: { limiter: 'api' } }).includes('quotalease_admitted_total{limiter="api"} 1\n'))
  assert.ok(api.metricsPrometheus().includes('\nquotalease_admitted_total 1\n'))
  for (const labels of [{ '1bad': 'x' }, { __name__: 'x' }, { 'a-b': 'x' }]) {
    assert.throws(() => api.metricsPrometheus({ labels }), { code: codes.CONFIG, message: /labels/ })
  }
  assert.throws(
    () => metricsPrometheus([{ limiter: api, labels: { l: 'x' } }, { limiter: route, labels: { l: 'x' } }]),
    { code: codes.CONFIG, message: /same labels/ },
  )
  assert.throws(() => api.metricsPrometheus({ labels: { a: 1 } }), { code: codes.CONFIG, name: 'TypeError' })
  assert.throws(() => metricsPrometheus([{ limiter: {} }]), { code: codes.CONFIG, name: 'TypeError' })
})

test('check() resolves on memory://', async () => {
  const l = new Limiter({ limit: 1 })
  await l.check()
  l.checkSync()
})
