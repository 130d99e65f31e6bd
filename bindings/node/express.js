'use strict'
// Express / Connect middleware: one decision per request, RateLimit headers
// on every response, 429 with Retry-After when denied.

const { Limiter, codes, httpKey } = require('./index.js')

function fail(Ctor, message) {
  const err = new Ctor(message)
  err.code = codes.CONFIG
  return err
}

function defaultKey(req) {
  return req.ip || (req.socket && req.socket.remoteAddress) || 'unknown'
}

function defaultOnDenied(req, res) {
  res.statusCode = 429
  res.setHeader('Content-Type', 'text/plain; charset=utf-8')
  res.end('Too Many Requests\n')
}

/**
 * `rateLimit({ limiter, key?, cost?, skip?, onDenied? })` returns
 * `(req, res, next)` middleware. The decision is on `req.rateLimit`.
 */
function rateLimit(options) {
  if (options === null || typeof options !== 'object') {
    throw fail(TypeError, 'rateLimit(options): options must be an object such as { limiter }')
  }
  const { limiter, key = defaultKey, cost = 1, skip, onDenied = defaultOnDenied } = options
  for (const name of Object.keys(options)) {
    if (!['limiter', 'key', 'cost', 'skip', 'onDenied'].includes(name)) {
      throw fail(Error, `rateLimit: unknown option \`${name}\` (known: limiter, key, cost, skip, onDenied)`)
    }
  }
  if (!(limiter instanceof Limiter)) {
    throw fail(TypeError, 'rateLimit: `limiter` must be a quotalease Limiter (new Limiter({ ... }))')
  }
  if (typeof key !== 'function') throw fail(TypeError, 'rateLimit: `key` must be a function (req) => string')
  if (typeof cost !== 'number' && typeof cost !== 'function') {
    throw fail(TypeError, 'rateLimit: `cost` must be a number or a function (req) => number')
  }
  if (skip !== undefined && typeof skip !== 'function') {
    throw fail(TypeError, 'rateLimit: `skip` must be a function (req) => boolean')
  }
  if (typeof onDenied !== 'function') {
    throw fail(TypeError, 'rateLimit: `onDenied` must be a function (req, res, next, decision)')
  }

  return function quotaleaseRateLimit(req, res, next) {
    let k
    let c
    try {
      if (skip && skip(req)) return next()
      k = key(req)
      c = typeof cost === 'function' ? cost(req) : cost
    } catch (err) {
      return next(err)
    }
    Promise.resolve(k)
      // An over-long key is limited under its sha256 key, as in every middleware.
      .then((resolved) => limiter.acquire(httpKey(resolved), c))
      .then(
        (decision) => {
          req.rateLimit = decision
          let allowed
          try {
            const h = decision.headers()
            for (const name in h) res.setHeader(name, h[name])
            allowed = decision.allowed
            if (!allowed) onDenied(req, res, next, decision)
          } catch (err) {
            return next(err)
          }
          if (allowed) next()
        },
        (err) => next(err),
      )
  }
}

module.exports = { rateLimit }
