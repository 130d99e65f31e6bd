// Types of `quotalease/fastify` (fastify.js), for Fastify 4 and 5.
// fastify.js is CommonJS (`module.exports = rateLimit`, with `.default` and
// `.rateLimit` pointing at it), so these types say `export =`: an ES module's
// default import is then the plugin itself, as Node gives it at run time
// (`export default` here would type it as the module object).

import type { FastifyPluginCallback, FastifyReply, FastifyRequest } from 'fastify'
import type { Decision, Limiter } from './index'

declare module 'fastify' {
  interface FastifyRequest {
    /** The request's decision (null where the route is not limited). */
    rateLimit: Decision | null
  }
  interface FastifyContextConfig {
    rateLimit?: rateLimit.RouteRateLimitOptions | boolean
  }
}

type RateLimitPlugin = FastifyPluginCallback<rateLimit.RateLimitPluginOptions>

declare namespace rateLimit {
  export interface RouteRateLimitOptions {
    /** Another limiter for this route (e.g. another rate); default: the plugin's. */
    limiter?: Limiter
    /**
     * The rate-limit key of a request. Default: `request.ip`; with
     * `trustedProxies`, the client's address behind them.
     */
    key?: (request: FastifyRequest) => string | Promise<string>
    /**
     * Behind a load balancer or reverse proxy: which hops to believe, so the
     * default key is the client's address from `X-Forwarded-For` (else
     * `Forwarded`), walked from the right past trusted hops. A hop count (`1`:
     * one proxy in front), or CIDRs / addresses (`['10.0.0.0/8', '::1']`). An
     * untrusted peer's headers are ignored; a malformed entry keys by the peer.
     * Default: none trusted. A negative count or a bad CIDR is an
     * `ERR_QUOTALEASE_CONFIG` error at registration, as is giving `key` too.
     */
    trustedProxies?: number | string | readonly string[]
    /** Tokens a request costs: a number or a function of the request (default 1). */
    cost?: number | ((request: FastifyRequest) => number)
    /**
     * The plan tier of a request (the limiter's `tiers`): a name, or a function
     * of the request returning one (`undefined` or `null`: the default tier).
     * An unknown tier is an `ERR_QUOTALEASE_CONFIG` error for Fastify's error handler.
     */
    tier?: string | ((request: FastifyRequest) => string | undefined | null)
    /** Wait up to this many ms for the tokens (the event loop free) instead of a 429. */
    waitMs?: number
    /** Requests for which this returns true are not limited (and get no headers). */
    skip?: (request: FastifyRequest) => boolean
    /**
     * Called when denied, after the RateLimit and Retry-After headers were set.
     * Send the reply yourself, or return the body to send (status 429 unless you
     * set an error status). Default: 429 with
     * `{ statusCode: 429, error: 'Too Many Requests', message }`.
     */
    onDenied?: (request: FastifyRequest, reply: FastifyReply, decision: Decision) => unknown
    /**
     * Limit the requests of a key in flight at once instead of its rate: each
     * request takes a permit (`limiter.acquireConcurrent(key)` in the
     * `onRequest` hook; the limiter needs its `concurrency` option, else every
     * request goes to Fastify's error handler with `ERR_QUOTALEASE_CONFIG`),
     * released once when the raw response emits 'finish' or 'close': sent,
     * answered by the error handler after a throw, or aborted by the client. A
     * request past the limit gets `onDenied` (the 429 above by default) with
     * `Retry-After` and no RateLimit headers, which describe rates;
     * `request.rateLimit` is the permit's decision. `tier` picks the tier whose
     * `"N concurrent"` applies; `cost` and `waitMs` do not: giving one in the
     * same options (the plugin's, or a route's `config.rateLimit`) is an
     * `ERR_QUOTALEASE_CONFIG` error at registration, and the plugin's are not
     * used by a route that sets `concurrency: true`. For a rate and a
     * concurrency limit both, register the plugin twice, the rate one first.
     * Default: false.
     */
    concurrency?: boolean
  }

  export interface RateLimitPluginOptions extends RouteRateLimitOptions {
    /** The limiter deciding every request (you create and close it). */
    limiter: Limiter
    /**
     * `true` (default): every route registered after the plugin is limited,
     * except those with `config: { rateLimit: false }`. `false`: only routes
     * with a `config.rateLimit` (`true` or options).
     */
    global?: boolean
  }

  /** The plugin (also the module itself and its `default`). */
  export const rateLimit: RateLimitPlugin
  export { rateLimit as default }
}

/**
 * The plugin: `fastify.register(rateLimit, { limiter, ... })`. One
 * `limiter.acquire(key(request), cost)` per request in an `onRequest` hook
 * (with `concurrency: true`, one permit per request in flight instead),
 * the IETF `RateLimit-Policy` / `RateLimit` headers on every response, 429
 * with `Retry-After` when denied. A key over 512 bytes is limited under
 * `httpKey(key)` (its sha256); a limiter error (e.g. an empty key) goes to
 * Fastify's error handler.
 */
declare function rateLimit(...args: Parameters<RateLimitPlugin>): ReturnType<RateLimitPlugin>
export = rateLimit
