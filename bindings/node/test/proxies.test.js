'use strict'
// Behind a proxy: `trustedProxies` makes the default key of quotalease/express
// and quotalease/fastify the client's address from X-Forwarded-For /
// Forwarded, read only through trusted hops (the same table as Python's).

const test = require('node:test')
const assert = require('node:assert/strict')
const express = require('express')
const Fastify = require('fastify')

const { Limiter, codes } = require('..')
const { rateLimit } = require('../express')
const fastifyRateLimit = require('../fastify')
const { trustedProxies } = require('../proxies.js')
const { listen } = require('./helpers')

const LB = '10.0.0.5' // the load balancer, the peer of every request

const CASES = [
  // None trusted (the default): the peer, whatever the headers say.
  [undefined, LB, null, '1.2.3.4', LB],
  [0, LB, 'for=1.2.3.4', null, LB],
  // An untrusted peer's headers are ignored (spoofed).
  [['10.0.0.0/8'], '203.0.113.9', null, '1.2.3.4', '203.0.113.9'],
  [1, 'not an address', null, '1.2.3.4', 'not an address'],
  // A trusted chain: past the trusted hops, the first untrusted one.
  [['10.0.0.0/8'], LB, null, '1.2.3.4', '1.2.3.4'],
  [['10.0.0.0/8'], LB, null, '6.6.6.6, 1.2.3.4, 10.1.1.1', '1.2.3.4'],
  [['10.0.0.0/8', '192.0.2.7'], LB, null, '1.2.3.4,192.0.2.7', '1.2.3.4'],
  [['10.0.0.0/8'], LB, null, '10.9.9.9, 10.1.1.1', '10.9.9.9'],
  ['10.0.0.0/8', '::ffff:10.0.0.5', null, '1.2.3.4', '1.2.3.4'],
  // The hop count: skip exactly N hops from the right.
  [1, LB, null, '6.6.6.6, 1.2.3.4', '1.2.3.4'],
  [2, LB, null, '6.6.6.6, 1.2.3.4, 10.1.1.1', '1.2.3.4'],
  [3, LB, null, '1.2.3.4', '1.2.3.4'],
  // X-Forwarded-For with ports and IPv6.
  [1, LB, null, '1.2.3.4:5555', '1.2.3.4'],
  [1, LB, null, '[2001:db8::1]:443', '2001:db8::1'],
  [1, LB, null, '2001:DB8::0:1', '2001:db8::1'],
  [['::1'], '::1', null, '2001:db8::1', '2001:db8::1'],
  // Forwarded (RFC 7239): quoted values, IPv6 in brackets, other parameters.
  [1, LB, 'for=1.2.3.4', null, '1.2.3.4'],
  [1, LB, 'for="[2001:db8:cafe::17]:4711";proto=https', null, '2001:db8:cafe::17'],
  [1, LB, 'for=6.6.6.6, For="1.2.3.4:80";by=10.0.0.5', null, '1.2.3.4'],
  [2, LB, 'for=1.2.3.4;host="a,b", for=10.1.1.1', null, '1.2.3.4'],
  // X-Forwarded-For wins over Forwarded when both are present.
  [1, LB, 'for=6.6.6.6', '1.2.3.4', '1.2.3.4'],
  // Malformed: the peer, never an exception.
  [1, LB, null, 'not-an-ip', LB],
  [1, LB, null, '1.2.3.4, ', LB],
  [1, LB, null, '1.2.3.4:port', LB],
  [1, LB, null, '[::1', LB],
  [1, LB, 'for=unknown', null, LB],
  [1, LB, 'for=_hidden', null, LB],
  [1, LB, 'for="1.2.3.4', null, LB],
  [1, LB, 'proto=https', null, LB],
  [1, LB, 'for=1.2.3.4;;', null, '1.2.3.4'],
  [1, LB, null, '\u0661.2.3.4', LB],
  // Garbage to the left of the client is never read.
  [1, LB, null, 'garbage, 1.2.3.4', '1.2.3.4'],
  [1, LB, null, '', LB],
]

test('proxies: the client address through trusted hops', () => {
  for (const [spec, peer, forwarded, xff, client] of CASES) {
    const of = trustedProxies('test', spec)
    const got = of === null ? peer : of(peer, forwarded, xff)
    assert.equal(got, client, JSON.stringify({ spec, peer, forwarded, xff }))
  }
})

const BAD = [
  [-1, RangeError, /hop count >= 0/],
  [1.5, RangeError, /hop count >= 0/],
  [['10.0.0.0/33'], RangeError, /not an IP address or CIDR/],
  ['nonsense', RangeError, /'nonsense'/],
  [['10.0.0.0/8/1'], RangeError, /not an IP address or CIDR/],
  [[10], TypeError, /entries must be CIDR strings/],
  [true, TypeError, /hop count or CIDRs/],
]

test('proxies: bad settings are ERR_QUOTALEASE_CONFIG errors when the middleware is built', async () => {
  const limiter = new Limiter({ limit: 1 })
  try {
    for (const [spec, name, message] of BAD) {
      const expected = { name: name.name, code: codes.CONFIG, message }
      assert.throws(() => rateLimit({ limiter, trustedProxies: spec }), expected)
      await assert.rejects(Fastify().register(fastifyRateLimit, { limiter, trustedProxies: spec }).ready(), expected)
      const f = Fastify()
      await f.register(fastifyRateLimit, { limiter })
      assert.throws(() => f.get('/x', { config: { rateLimit: { trustedProxies: spec } } }, async () => 'ok'), expected)
      await f.close()
    }
    const both = { name: 'TypeError', code: codes.CONFIG, message: /not both/ }
    assert.throws(() => rateLimit({ limiter, key: () => 'k', trustedProxies: 1 }), both)
    await assert.rejects(Fastify().register(fastifyRateLimit, { limiter, key: () => 'k', trustedProxies: 1 }).ready(), both)
  } finally {
    await limiter.close()
  }
})

test('express: spoofed headers from an untrusted peer are ignored; a trusted one names the client', async (t) => {
  const limiter = new Limiter({ limit: 1, windowMs: 60000, leaseSize: 1 })
  const untrusted = express()
  untrusted.use(rateLimit({ limiter, trustedProxies: ['10.0.0.0/8'] })) // the peer, 127.0.0.1, is not
  untrusted.get('/', (req, res) => res.send('ok'))
  const trusted = express()
  trusted.use(rateLimit({ limiter, trustedProxies: ['127.0.0.1', '::1'] }))
  trusted.get('/', (req, res) => res.send('ok'))
  const hops = express()
  hops.use(rateLimit({ limiter, trustedProxies: 2 }))
  hops.get('/', (req, res) => res.send('ok'))
  const [a, b, c] = await Promise.all([listen(untrusted), listen(trusted), listen(hops)])
  t.after(async () => {
    await Promise.all([a.close(), b.close(), c.close()])
    await limiter.close()
  })
  const get = async (srv, headers) => (await fetch(`${srv.base}/`, { headers })).status

  assert.equal(await get(a, { 'x-forwarded-for': '1.1.1.1' }), 200)
  assert.equal(await get(a, { 'x-forwarded-for': '2.2.2.2' }), 429) // both 127.0.0.1's
  assert.equal(await get(b, { 'x-forwarded-for': '1.2.3.4' }), 200)
  assert.equal(await get(b, { 'x-forwarded-for': '5.6.7.8' }), 200)
  assert.equal(await get(b, { 'x-forwarded-for': '6.6.6.6, 1.2.3.4' }), 429)
  assert.equal(await get(b, { forwarded: 'for="[2001:db8::1]:80"' }), 200)
  assert.equal(await get(b, { forwarded: 'for=unknown' }), 429) // the peer's bucket, spent above
  assert.equal(await get(c, { 'x-forwarded-for': '6.6.6.6, 9.9.9.9, 10.1.1.1' }), 200)
  assert.equal(await get(c, { 'x-forwarded-for': '9.9.9.9, 10.1.1.2' }), 429)
  assert.equal((await limiter.inspect('2001:db8::1')).admitted, 1)
})

test('fastify: trustedProxies plugin-wide and per route', async (t) => {
  const limiter = new Limiter({ limit: 1, windowMs: 60000, leaseSize: 1 })
  t.after(() => limiter.close())
  const fastify = Fastify()
  await fastify.register(fastifyRateLimit, { limiter, trustedProxies: ['10.0.0.0/8'] })
  fastify.get('/', async () => 'ok')
  fastify.get('/hops', { config: { rateLimit: { trustedProxies: 1 } } }, async () => 'ok')
  fastify.get('/peer', { config: { rateLimit: { trustedProxies: 0 } } }, async () => 'ok')
  await fastify.ready()
  t.after(() => fastify.close())
  const get = async (url, remoteAddress, headers) => (await fastify.inject({ url, remoteAddress, headers })).statusCode

  assert.equal(await get('/', '203.0.113.9', { 'x-forwarded-for': '1.1.1.1' }), 200)
  assert.equal(await get('/', '203.0.113.9', { 'x-forwarded-for': '2.2.2.2' }), 429)
  assert.equal(await get('/', LB, { 'x-forwarded-for': '1.2.3.4' }), 200)
  assert.equal(await get('/', LB, { 'x-forwarded-for': '5.6.7.8' }), 200)
  assert.equal(await get('/', LB, { 'x-forwarded-for': '6.6.6.6, 1.2.3.4' }), 429)
  assert.equal(await get('/', LB, { forwarded: 'garbage' }), 200) // the peer's bucket
  assert.equal(await get('/hops', '127.0.0.1', { 'x-forwarded-for': '7.7.7.7' }), 200)
  assert.equal(await get('/peer', LB, { 'x-forwarded-for': '8.8.8.8' }), 429) // LB's, spent above
  assert.equal((await limiter.inspect(LB)).admitted, 1)
  assert.equal((await limiter.inspect('7.7.7.7')).admitted, 1)
})
