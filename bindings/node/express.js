'use strict'
// Express / Connect middleware: one decision per request, RateLimit headers
// on every response, 429 with Retry-After when denied.

const { PROBLEM_CONTENT_TYPE, checkOptions, decide, keyOption, problemBody, setHeaders } = require('./http-common.js')

function defaultKey(req) {
  return req.ip || (req.socket && req.socket.remoteAddress) || 'unknown'
}

// The body of every quotalease middleware: RFC 9457 problem details.
function defaultOnDenied(req, res, next, decision) {
  const body = problemBody(decision)
  res.statusCode = 429
  res.setHeader('Content-Type', PROBLEM_CONTENT_TYPE)
  res.setHeader('Content-Length', Buffer.byteLength(body))
  res.end(body)
}

const KNOWN = ['limiter', 'key', 'cost', 'tier', 'waitMs', 'skip', 'onDenied', 'trustedProxies']

/**
 * `rateLimit({ limiter, key?, cost?, tier?, waitMs?, skip?, onDenied?, trustedProxies? })`
 * returns `(req, res, next)` middleware. `tier`: a plan tier's name, or
 * `(req) => name | undefined`. `waitMs`: a request waits up to that long for
 * its tokens (the event loop free) instead of a 429. `trustedProxies` (a hop count or CIDRs): the
 * default key is the client's address from X-Forwarded-For / Forwarded
 * through those hops instead of `req.ip`. The decision is on `req.rateLimit`.
 */
function rateLimit(options) {
  checkOptions('rateLimit', options, KNOWN)
  const key = keyOption('rateLimit', options, defaultKey)
  const { limiter, cost = 1, tier, waitMs, skip, onDenied = defaultOnDenied } = options

  return function quotaleaseRateLimit(req, res, next) {
    try {
      if (skip && skip(req)) return next()
    } catch (err) {
      return next(err)
    }
    decide(limiter, key, cost, req, tier, waitMs).then(
      (decision) => {
        req.rateLimit = decision
        let allowed
        try {
          setHeaders(decision, (name, value) => res.setHeader(name, value))
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
