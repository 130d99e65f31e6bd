'use strict'
// What the HTTP integrations (quotalease/express, quotalease/fastify) share:
// their option checks, one decision per request (with the long-key rule) and
// the RateLimit / Retry-After headers. Each framework file only adapts this
// to its request and reply objects.

const { Limiter, codes, httpKey } = require('./index.js')
const { clientKey, trustedProxies } = require('./proxies.js')

/** The content type of the 429 body (RFC 9457 problem details). */
const PROBLEM_CONTENT_TYPE = 'application/problem+json'

/**
 * The 429 body every quotalease HTTP middleware sends by default, in every
 * language (the same bytes in Python and Go): RFC 9457 problem details with
 * the retry delay in milliseconds.
 */
function problemBody(decision) {
  return JSON.stringify({
    type: 'about:blank',
    title: 'Too Many Requests',
    status: 429,
    detail: 'rate limit exceeded',
    retry_after_ms: decision.retryAfterMs,
  })
}

function fail(Ctor, message) {
  const err = new Ctor(message)
  err.code = codes.CONFIG
  return err
}

/**
 * Checks an options object: only `known` names, and the types of `limiter`,
 * `key`, `cost`, `tier`, `waitMs`, `skip`, `onDenied` where given. `who` starts each message.
 */
function checkOptions(who, options, known, { limiterRequired = true } = {}) {
  if (options === null || typeof options !== 'object') {
    throw fail(TypeError, `${who}(options): options must be an object such as { limiter }`)
  }
  for (const name of Object.keys(options)) {
    if (!known.includes(name)) {
      throw fail(Error, `${who}: unknown option \`${name}\` (known: ${known.join(', ')})`)
    }
  }
  const { limiter, key, cost, tier, waitMs, skip, onDenied } = options
  if ((limiterRequired || limiter !== undefined) && !(limiter instanceof Limiter)) {
    throw fail(TypeError, `${who}: \`limiter\` must be a quotalease Limiter (new Limiter({ ... }))`)
  }
  if (key !== undefined && typeof key !== 'function') {
    throw fail(TypeError, `${who}: \`key\` must be a function (req) => string`)
  }
  if (cost !== undefined && typeof cost !== 'number' && typeof cost !== 'function') {
    throw fail(TypeError, `${who}: \`cost\` must be a number or a function (req) => number`)
  }
  if (tier !== undefined && typeof tier !== 'string' && typeof tier !== 'function') {
    throw fail(TypeError, `${who}: \`tier\` must be a string or a function (req) => string | undefined`)
  }
  if (waitMs !== undefined && !(Number.isSafeInteger(waitMs) && waitMs >= 0)) {
    throw fail(TypeError, `${who}: \`waitMs\` must be a whole number of milliseconds >= 0`)
  }
  if (skip !== undefined && typeof skip !== 'function') {
    throw fail(TypeError, `${who}: \`skip\` must be a function (req) => boolean`)
  }
  if (onDenied !== undefined && typeof onDenied !== 'function') {
    throw fail(TypeError, `${who}: \`onDenied\` must be a function (req, res, ..., decision)`)
  }
}

/**
 * The key function of `options`: its own `key`, else the client's address
 * through `options.trustedProxies` when set, else `defaultKey` (the peer's).
 * A bad `trustedProxies`, or one given with a `key`, throws here.
 */
function keyOption(who, options, defaultKey) {
  const client = trustedProxies(who, options.trustedProxies)
  if (client === null) return options.key === undefined ? defaultKey : options.key
  if (options.key !== undefined) {
    throw fail(TypeError, `${who}: \`trustedProxies\` picks the default key (the client's address); give \`key\` or \`trustedProxies\`, not both`)
  }
  return clientKey(client)
}

/**
 * The request's decision: `limiter.acquire(httpKey(key(req)), cost, { tier, waitMs })`
 * (no tier named when `tier` is absent or returns `undefined` / `null`; with
 * `waitMs` the request waits up to that long for its tokens instead of a 429). `key`
 * may return a Promise. A key over 512 bytes is limited under its sha256
 * key, as in every middleware of every language. Rejects on a limiter error
 * (an unknown tier among them) and when `key`, `cost` or `tier` throws.
 */
function decide(limiter, key, cost, req, tier, waitMs) {
  let k
  let c
  let options
  try {
    k = key(req)
    c = typeof cost === 'function' ? cost(req) : cost
    const t = typeof tier === 'function' ? tier(req) : tier
    if (t !== undefined && t !== null) options = { tier: t }
    if (waitMs !== undefined) options = { ...options, waitMs }
  } catch (err) {
    return Promise.reject(err)
  }
  if (typeof k === 'string') return limiter.acquire(httpKey(k), c, options)
  return Promise.resolve(k).then((resolved) => limiter.acquire(httpKey(resolved), c, options))
}

/** Sets the decision's headers through `set(name, value)`. */
function setHeaders(decision, set) {
  const h = decision.headers()
  for (const name in h) set(name, h[name])
}

/**
 * Releases `permit` once, when the response `res` emits 'finish' or 'close'
 * (sent, failed or aborted). Returns true when the response is over already
 * (the client went away while the permit was being taken: 'close' was
 * emitted before the listeners): the permit is released now, and the
 * request must not run.
 */
function releaseWhenDone(res, permit) {
  let released = false
  const release = () => {
    if (released) return
    released = true
    res.off('finish', release)
    res.off('close', release)
    try {
      permit.release()
    } catch {
      // The limiter was closed meanwhile: nothing left to give back to.
    }
  }
  res.once('finish', release)
  res.once('close', release)
  if (res.destroyed || res.writableFinished) {
    release()
    return true
  }
  return false
}

module.exports = { checkOptions, decide, fail, keyOption, PROBLEM_CONTENT_TYPE, problemBody, releaseWhenDone, setHeaders }
