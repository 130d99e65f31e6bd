'use strict'
// Fastify plugin: one decision per request in an `onRequest` hook of every
// route (or of the routes that ask for it), RateLimit headers on every
// response, 429 with Retry-After when denied. Per-route settings come from the
// route's `config: { rateLimit: { ... } }`, as with @fastify/rate-limit. With
// `concurrency: true`, a permit per request in flight instead (see
// concurrencyHook).

const { httpKey } = require('./index.js')
const { checkOptions, decide, fail, keyOption, releaseWhenDone, setHeaders } = require('./http-common.js')

const ROUTE_OPTIONS = ['limiter', 'key', 'cost', 'tier', 'waitMs', 'skip', 'onDenied', 'trustedProxies', 'concurrency']
const PLUGIN_OPTIONS = [...ROUTE_OPTIONS, 'global']

function defaultKey(request) {
  return request.ip || 'unknown'
}

// Fastify's own error convention (the shape of its error replies and of
// @fastify/rate-limit's 429), not the problem+json body of the other
// middleware: what Fastify users and their error handlers expect.
function defaultOnDenied(request, reply, decision) {
  const s = Math.max(1, Math.ceil(decision.retryAfterMs / 1000))
  reply.code(429).send({
    statusCode: 429,
    error: 'Too Many Requests',
    message: `Rate limit exceeded, retry in ${s} second${s === 1 ? '' : 's'}`,
  })
}

function onRequestHook({ limiter, key, cost, tier, waitMs, skip, onDenied }) {
  return async function quotaleaseOnRequest(request, reply) {
    if (skip && skip(request)) return
    const decision = await decide(limiter, key, cost, request, tier, waitMs)
    request.rateLimit = decision
    setHeaders(decision, (name, value) => reply.header(name, value))
    if (decision.allowed) return
    return deny(request, reply, decision, onDenied)
  }
}

// onDenied sends the reply itself, or returns the body to send (429 unless it
// set an error status). Returning the reply ends the request before its handler.
async function deny(request, reply, decision, onDenied) {
  const body = await onDenied(request, reply, decision)
  if (!reply.sent) {
    if (reply.statusCode < 400) reply.code(429)
    reply.send(body)
  }
  return reply
}

/**
 * The `concurrency: true` hook: each request takes a permit of its key
 * (`limiter.acquireConcurrent`), released once when the raw response emits
 * 'finish' or 'close': sent, failed (Fastify's error reply is a response
 * too) or aborted by the client. Past the limiter's concurrency limit,
 * `onDenied` answers (429 by default) with `Retry-After` and no RateLimit
 * headers, which describe rates. The permit's decision is on
 * `request.rateLimit`. A limiter error (no concurrency limit for the key, an
 * unknown tier, an empty key) goes to Fastify's error handler.
 */
function concurrencyHook({ limiter, key, tier, skip, onDenied }) {
  return async function quotaleaseConcurrency(request, reply) {
    if (skip && skip(request)) return
    const raw = key(request)
    const t = typeof tier === 'function' ? tier(request) : tier
    const options = t !== undefined && t !== null ? { tier: t } : undefined
    const permit = await limiter.acquireConcurrent(httpKey(await raw), options)
    const decision = permit.decision
    request.rateLimit = decision
    if (!permit.allowed) {
      reply.header('Retry-After', decision.headers()['Retry-After'])
      return deny(request, reply, decision, onDenied)
    }
    // The client went away while the permit was being taken: no handler.
    if (releaseWhenDone(reply.raw, permit)) {
      reply.hijack()
      return reply
    }
  }
}

/**
 * Checks `concurrency` in one options object (the plugin's, or one route's
 * `config.rateLimit`): a boolean, and not given with `cost` or `waitMs`,
 * which do not apply to a permit.
 */
function checkConcurrency(who, options) {
  const { concurrency } = options
  if (concurrency === undefined) return
  if (typeof concurrency !== 'boolean') throw fail(TypeError, `${who}: \`concurrency\` must be true or false`)
  if (!concurrency) return
  const given = ['cost', 'waitMs'].filter((name) => options[name] !== undefined)
  if (given.length > 0) {
    throw fail(
      Error,
      `${who}: ${given.map((n) => '`' + n + '`').join(' and ')} cannot be combined with \`concurrency: true\` ` +
        '(a request takes one permit); register the plugin a second time without concurrency for a rate limit too',
    )
  }
}

/**
 * `fastify.register(rateLimit, { limiter, key?, cost?, tier?, skip?, onDenied?, trustedProxies?, concurrency?, global? })`.
 * Routes registered after it are limited (with `global: false`, only those
 * whose `config.rateLimit` is set); `config: { rateLimit: false }` exempts a
 * route, `config: { rateLimit: { limiter?, key?, cost?, tier?, skip?, onDenied? } }`
 * overrides the plugin's options for it. `tier`: a plan tier's name, or
 * `(request) => name | undefined`. `trustedProxies` (a hop count or CIDRs):
 * the default key is the client's address from X-Forwarded-For / Forwarded
 * through those hops instead of `request.ip`. The decision is on `request.rateLimit`.
 * `concurrency: true` (plugin-wide or per route): a permit per request in
 * flight instead of tokens (see `concurrencyHook`); `tier` picks the tier
 * whose `"N concurrent"` applies; `cost` and `waitMs` do not apply (giving
 * one in the same options is an error; one inherited from the plugin's
 * options is not used).
 */
function rateLimit(fastify, options, done) {
  try {
    checkOptions('quotalease/fastify', options, PLUGIN_OPTIONS)
    checkConcurrency('quotalease/fastify', options)
    options = { ...options, key: keyOption('quotalease/fastify', options, defaultKey) }
  } catch (err) {
    return done(err)
  }
  const { global = true, trustedProxies: _proxies, ...rest } = options
  if (typeof global !== 'boolean') return done(fail(TypeError, 'quotalease/fastify: `global` must be a boolean'))
  const base = {
    key: defaultKey,
    cost: 1,
    tier: undefined,
    waitMs: undefined,
    skip: undefined,
    onDenied: defaultOnDenied,
    concurrency: false,
    ...defined(rest),
  }
  if (!fastify.hasRequestDecorator('rateLimit')) fastify.decorateRequest('rateLimit', null)

  fastify.addHook('onRoute', (route) => {
    const config = route.config && route.config.rateLimit
    if (config === false || (config === undefined && !global)) return
    const where = `quotalease/fastify (route ${[].concat(route.method).join(',')} ${route.url})`
    if (config !== undefined && config !== true && (config === null || typeof config !== 'object')) {
      throw fail(TypeError, `${where}: config.rateLimit must be an object, true or false`)
    }
    const own = typeof config === 'object' ? config : {}
    checkOptions(where, own, ROUTE_OPTIONS, { limiterRequired: false })
    checkConcurrency(where, own)
    const { trustedProxies: routeProxies, ...ownRest } = own
    const routeKey = routeProxies === undefined ? own.key : keyOption(where, own, defaultKey)
    const settings = { ...base, ...defined({ ...ownRest, key: routeKey }) }
    const hook = settings.concurrency ? concurrencyHook(settings) : onRequestHook(settings)
    route.onRequest = route.onRequest ? [].concat(route.onRequest, hook) : [hook]
  })
  done()
}

function defined(o) {
  const out = {}
  for (const k of Object.keys(o)) if (o[k] !== undefined) out[k] = o[k]
  return out
}

// What fastify-plugin would set: the hooks and the decorator apply to the
// registering context, not to an encapsulated child.
rateLimit[Symbol.for('skip-override')] = true
rateLimit[Symbol.for('fastify.display-name')] = 'quotalease'
rateLimit[Symbol.for('plugin-meta')] = { name: 'quotalease', fastify: '>=4' }

module.exports = rateLimit
module.exports.default = rateLimit
module.exports.rateLimit = rateLimit
