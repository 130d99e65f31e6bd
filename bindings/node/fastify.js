'use strict'
// Fastify plugin: one decision per request in an `onRequest` hook of every
// route (or of the routes that ask for it), RateLimit headers on every
// response, 429 with Retry-After when denied. Per-route settings come from the
// route's `config: { rateLimit: { ... } }`, as with @fastify/rate-limit.

const { checkOptions, decide, fail, keyOption, setHeaders } = require('./http-common.js')

const ROUTE_OPTIONS = ['limiter', 'key', 'cost', 'tier', 'waitMs', 'skip', 'onDenied', 'trustedProxies']
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
    const body = await onDenied(request, reply, decision)
    // onDenied sends the reply itself, or returns the body to send (429
    // unless it set an error status).
    if (!reply.sent) {
      if (reply.statusCode < 400) reply.code(429)
      reply.send(body)
    }
    return reply
  }
}

/**
 * `fastify.register(rateLimit, { limiter, key?, cost?, tier?, skip?, onDenied?, trustedProxies?, global? })`.
 * Routes registered after it are limited (with `global: false`, only those
 * whose `config.rateLimit` is set); `config: { rateLimit: false }` exempts a
 * route, `config: { rateLimit: { limiter?, key?, cost?, tier?, skip?, onDenied? } }`
 * overrides the plugin's options for it. `tier`: a plan tier's name, or
 * `(request) => name | undefined`. `trustedProxies` (a hop count or CIDRs):
 * the default key is the client's address from X-Forwarded-For / Forwarded
 * through those hops instead of `request.ip`. The decision is on `request.rateLimit`.
 */
function rateLimit(fastify, options, done) {
  try {
    checkOptions('quotalease/fastify', options, PLUGIN_OPTIONS)
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
    const { trustedProxies: routeProxies, ...ownRest } = own
    const routeKey = routeProxies === undefined ? own.key : keyOption(where, own, defaultKey)
    const hook = onRequestHook({ ...base, ...defined({ ...ownRest, key: routeKey }) })
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
