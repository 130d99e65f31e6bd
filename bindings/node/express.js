'use strict'
// Express / Connect middleware: one decision per request, RateLimit headers
// on every response, 429 with Retry-After when denied.

const { httpKey } = require('./index.js')
const { PROBLEM_CONTENT_TYPE, checkOptions, decide, fail, keyOption, problemBody, releaseWhenDone, setHeaders } = require('./http-common.js')

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

const KNOWN = ['limiter', 'key', 'cost', 'tier', 'waitMs', 'skip', 'onDenied', 'trustedProxies', 'concurrency']

/**
 * `rateLimit({ limiter, key?, cost?, tier?, waitMs?, skip?, onDenied?, trustedProxies? })`
 * returns `(req, res, next)` middleware. `tier`: a plan tier's name, or
 * `(req) => name | undefined`. `waitMs`: a request waits up to that long for
 * its tokens (the event loop free) instead of a 429. `trustedProxies` (a hop count or CIDRs): the
 * default key is the client's address from X-Forwarded-For / Forwarded
 * through those hops instead of `req.ip`. The decision is on `req.rateLimit`.
 * `concurrency: true`: a permit per request in flight instead of tokens (see
 * `concurrencyLimit`); `tier` picks the tier whose `"N concurrent"` applies;
 * `cost` and `waitMs` do not apply.
 */
function rateLimit(options) {
  checkOptions('rateLimit', options, KNOWN)
  const key = keyOption('rateLimit', options, defaultKey)
  const { limiter, cost = 1, tier, waitMs, skip, onDenied = defaultOnDenied, concurrency = false } = options
  if (typeof concurrency !== 'boolean') {
    throw fail(TypeError, 'rateLimit: `concurrency` must be true or false')
  }
  if (concurrency) {
    const given = ['cost', 'waitMs'].filter((name) => options[name] !== undefined)
    if (given.length > 0) {
      throw fail(
        Error,
        `rateLimit: ${given.map((n) => '`' + n + '`').join(' and ')} cannot be combined with \`concurrency: true\` ` +
          '(a request takes one permit); put a second rateLimit() without concurrency in front for a rate limit too',
      )
    }
    return concurrencyLimit(limiter, key, tier, skip, onDenied)
  }

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

/**
 * The `concurrency: true` middleware: each request takes a permit of its key
 * (`limiter.acquireConcurrent`), released once when the response emits
 * 'finish' or 'close' (an aborted request too). Past the limiter's
 * concurrency limit, `onDenied` answers (429 by default) with `Retry-After`
 * and no RateLimit headers, which describe rates. The permit's decision is on
 * `req.rateLimit`. A limiter error (no concurrency limit for the key, an
 * unknown tier, an empty key) goes to `next(err)`.
 */
function concurrencyLimit(limiter, key, tier, skip, onDenied) {
  return function quotaleaseConcurrency(req, res, next) {
    let raw
    let options
    try {
      if (skip && skip(req)) return next()
      raw = key(req)
      const t = typeof tier === 'function' ? tier(req) : tier
      if (t !== undefined && t !== null) options = { tier: t }
    } catch (err) {
      return next(err)
    }
    Promise.resolve(raw)
      .then((k) => limiter.acquireConcurrent(httpKey(k), options))
      .then(
        (permit) => {
          const decision = permit.decision
          req.rateLimit = decision
          if (!permit.allowed) {
            try {
              res.setHeader('Retry-After', decision.headers()['Retry-After'])
              onDenied(req, res, next, decision)
            } catch (err) {
              return next(err)
            }
            return
          }
          // The client went away while the permit was being taken: no next().
          if (releaseWhenDone(res, permit)) return
          next()
        },
        (err) => next(err),
      )
  }
}

module.exports = { rateLimit }
