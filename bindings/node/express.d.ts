// Types of `quotalease/express` (express.js). Works with Express and Connect:
// Express's Request/Response extend Node's IncomingMessage/ServerResponse.

import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Decision, Limiter } from './index'

export type NextFunction = (err?: unknown) => void

/** Trusted proxies: a hop count, or a CIDR / address or a list of them. */
export type TrustedProxies = number | string | readonly string[]

export interface RateLimitOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  /** The limiter deciding every request (you create and close it). */
  limiter: Limiter
  /**
   * The rate-limit key of a request. Default: `req.ip`, else the socket's
   * remote address; with `trustedProxies`, the client's address behind them.
   */
  key?: (req: Req) => string | Promise<string>
  /**
   * Behind a load balancer or reverse proxy: which hops to believe, so the
   * default key is the client's address from `X-Forwarded-For` (else
   * `Forwarded`), walked from the right past trusted hops. A hop count (`1`:
   * one proxy in front), or CIDRs / addresses (`['10.0.0.0/8', '::1']`). An
   * untrusted peer's headers are ignored; a malformed entry keys by the peer.
   * Default: none trusted. A negative count or a bad CIDR is an
   * `ERR_QUOTALEASE_CONFIG` error when the middleware is built, as is giving
   * `key` too.
   */
  trustedProxies?: TrustedProxies
  /** Tokens a request costs: a number or a function of the request (default 1). */
  cost?: number | ((req: Req) => number)
  /**
   * The plan tier of a request (the limiter's `tiers`): a name, or a function
   * of the request returning one (`undefined` or `null`: the default tier).
   * An unknown tier is an `ERR_QUOTALEASE_CONFIG` error, passed to `next(err)`.
   */
  tier?: string | ((req: Req) => string | undefined | null)
  /** Wait up to this many ms for the tokens (the event loop free) instead of a 429. */
  waitMs?: number
  /** Requests for which this returns true are not limited (and get no headers). */
  skip?: (req: Req) => boolean
  /**
   * Called instead of `next()` when denied, after the RateLimit and
   * Retry-After headers were set. Default: status 429, `application/problem+json`
   * (RFC 9457) `{"type":"about:blank","title":"Too Many Requests","status":429,
   * "detail":"rate limit exceeded","retry_after_ms":N}`, as in every quotalease middleware.
   */
  onDenied?: (req: Req, res: Res, next: NextFunction, decision: Decision) => void
  /**
   * Limit the requests of a key in flight at once instead of its rate: each
   * request takes a permit (`limiter.acquireConcurrent(key)`; the limiter needs
   * its `concurrency` option, else every request goes to `next(err)` with
   * `ERR_QUOTALEASE_CONFIG`), released once when the response emits 'finish'
   * or 'close', so an aborted request gives its permit back too. A request past
   * the limit gets `onDenied` (the 429 above by default) with `Retry-After`
   * and no RateLimit headers, which describe rates; `req.rateLimit` is the
   * permit's decision. `tier` picks the tier whose `"N concurrent"` applies;
   * `cost` and `waitMs` do not: giving one is an `ERR_QUOTALEASE_CONFIG` error
   * when the middleware is built. For a rate
   * and a concurrency limit both, use two middlewares, the rate one first.
   * Default: false.
   */
  concurrency?: boolean
}

/** The middleware puts the request's decision here. */
export interface RateLimitedRequest extends IncomingMessage {
  rateLimit?: Decision
}

/**
 * Middleware: one `limiter.acquire(key(req), cost)` per request (with
 * `concurrency: true`, one permit per request in flight instead), the IETF
 * `RateLimit-Policy` / `RateLimit` headers on every response, 429 with
 * `Retry-After` when denied. The decision is on `req.rateLimit`. A key over
 * 512 bytes is limited under `httpKey(key)` (its sha256), never an error; a
 * limiter error (e.g. an empty key) goes to `next(err)`.
 */
export declare function rateLimit<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: RateLimitOptions<Req, Res>,
): (req: Req, res: Res, next: NextFunction) => void
