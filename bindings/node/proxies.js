'use strict'
// The client's address behind trusted proxies, for the HTTP middleware's
// default key (quotalease/express, quotalease/fastify). Behind a load
// balancer every request comes from the balancer, so a key by peer address
// puts every client in one bucket. `trustedProxies` says which hops may be
// believed: a hop count, or CIDRs / addresses. The chain is the
// X-Forwarded-For addresses (else RFC 7239 Forwarded `for=`) followed by the
// peer, walked from the right past trusted hops to the first untrusted one.
// An untrusted peer's headers are ignored, and a malformed entry on the walk
// gives the peer: a client cannot pick its own key. Python's _proxies.py and
// Go's proxies.go follow the same rules.

const net = require('node:net')
const { codes } = require('./index.js')

/** `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]`, `[::1]:80` in canonical form (IPv4-mapped IPv6 as IPv4), else null. */
function parseIp(text) {
  let s = text.trim()
  const port = /^\d+$/
  if (s.startsWith('[')) {
    const end = s.indexOf(']')
    const rest = end < 0 ? '' : s.slice(end + 1)
    if (end < 0 || (rest && !(rest[0] === ':' && port.test(rest.slice(1))))) return null
    s = s.slice(1, end)
  } else if (s.split(':').length === 2) {
    const [host, p] = s.split(':')
    if (!port.test(p)) return null
    s = host
  }
  const family = net.isIP(s)
  if (family === 4) return { address: s, family: 'ipv4' }
  if (family !== 6) return null
  const address = new net.SocketAddress({ address: s, family: 'ipv6' }).address
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)
  return mapped ? { address: mapped[1], family: 'ipv4' } : { address, family: 'ipv6' }
}

/** `value` split at `sep` outside quoted strings; null when a quote is left open. */
function split(value, sep) {
  const parts = []
  let current = ''
  let quoted = false
  let escaped = false
  for (const ch of value) {
    if (escaped) escaped = false
    else if (quoted && ch === '\\') escaped = true
    else if (ch === '"') quoted = !quoted
    else if (ch === sep && !quoted) {
      parts.push(current)
      current = ''
      continue
    }
    current += ch
  }
  if (quoted) return null
  parts.push(current)
  return parts
}

/** The `for=` value of one Forwarded element, unquoted (null: none). */
function forwardedFor(element) {
  for (const pair of split(element, ';') || []) {
    const eq = pair.indexOf('=')
    if (eq < 0 || pair.slice(0, eq).trim().toLowerCase() !== 'for') continue
    let value = pair.slice(eq + 1).trim()
    if (value.length >= 2 && value[0] === '"' && value[value.length - 1] === '"') {
      value = value.slice(1, -1).replace(/\\/g, '')
    }
    return value
  }
  return null
}

/** The header's hops, nearest last: X-Forwarded-For when present, else Forwarded. */
function chain(forwarded, xForwardedFor) {
  if (xForwardedFor && xForwardedFor.trim()) return xForwardedFor.split(',')
  if (forwarded && forwarded.trim()) {
    const elements = split(forwarded, ',')
    return elements === null ? [null] : elements.map(forwardedFor)
  }
  return []
}

function configError(Ctor, message) {
  const err = new Ctor(message)
  err.code = codes.CONFIG
  return err
}

/**
 * Validates a `trustedProxies` setting (undefined / 0: nobody, a hop count,
 * or a CIDR / address or an array of them) and returns
 * `(peer, forwarded, xForwardedFor) => client address`, or null when nobody
 * is trusted. `who` starts each error message.
 */
function trustedProxies(who, spec) {
  if (spec === undefined || spec === null) return null
  if (typeof spec === 'number') {
    if (!Number.isInteger(spec) || spec < 0) {
      throw configError(RangeError, `${who}: \`trustedProxies\` must be a hop count >= 0 (an integer), got ${spec}`)
    }
    return spec === 0 ? null : clientOf((ip, hop) => hop < spec)
  }
  const entries = typeof spec === 'string' ? [spec] : spec
  if (!Array.isArray(entries)) {
    throw configError(TypeError, `${who}: \`trustedProxies\` must be a hop count or CIDRs such as ['10.0.0.0/8']`)
  }
  const list = new net.BlockList()
  for (const entry of entries) {
    if (typeof entry !== 'string') {
      throw configError(TypeError, `${who}: \`trustedProxies\` entries must be CIDR strings, not ${typeof entry}`)
    }
    const [addr, bits, extra] = entry.trim().split('/')
    const family = net.isIP(addr)
    const max = family === 4 ? 32 : 128
    if (!family || extra !== undefined || (bits !== undefined && !(/^\d+$/.test(bits) && Number(bits) <= max))) {
      throw configError(
        RangeError,
        `${who}: \`trustedProxies\`: '${entry}' is not an IP address or CIDR (e.g. '10.0.0.0/8', '::1')`,
      )
    }
    list.addSubnet(addr, bits === undefined ? max : Number(bits), family === 4 ? 'ipv4' : 'ipv6')
  }
  if (entries.length === 0) return null
  return clientOf((ip) => list.check(ip.address, ip.family))
}

function clientOf(trusted) {
  return function client(peer, forwarded, xForwardedFor) {
    const peerIp = parseIp(peer)
    if (peerIp === null || !trusted(peerIp, 0)) return peer
    let found = null
    const hops = chain(forwarded, xForwardedFor)
    for (let i = hops.length - 1, hop = 1; i >= 0; i--, hop++) {
      const ip = hops[i] === null ? null : parseIp(hops[i])
      if (ip === null) return peer
      found = ip
      if (!trusted(ip, hop)) break
    }
    // Every hop trusted: the furthest one is as near the client as we can tell.
    return found === null ? peer : found.address
  }
}

/** One field of a Node request's headers: repeated fields joined with ','. */
function header(headers, name) {
  const v = headers && headers[name]
  return Array.isArray(v) ? v.join(',') : v
}

/**
 * The default key of a request behind `client` (from trustedProxies): the
 * socket's remote address, or the client's through trusted hops.
 */
function clientKey(client) {
  return function key(req) {
    const peer = req.socket && req.socket.remoteAddress
    if (!peer) return 'unknown'
    const headers = req.raw ? req.raw.headers : req.headers
    return client(peer, header(headers, 'forwarded'), header(headers, 'x-forwarded-for'))
  }
}

module.exports = { trustedProxies, clientKey, parseIp }
