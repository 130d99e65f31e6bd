'use strict'
// quotalease for Node: a thin layer over the Rust engine (binding.js loads
// the native addon). This file adds what is JavaScript-specific: JS type
// checks with helpful errors, Decision objects, Promises and events. Option
// names, values and the rules between them are the engine's.

const { EventEmitter } = require('node:events')
const util = require('node:util')

let native
try {
  native = require('./binding.js')
} catch (cause) {
  const err = new Error(
    `quotalease: no native addon for ${process.platform}-${process.arch} could be loaded. ` +
      'Reinstall to build it from source (needs Rust: https://rustup.rs): `npm rebuild quotalease`.\n' +
      String(cause && cause.message),
  )
  err.code = 'ERR_QUOTALEASE_NATIVE'
  err.cause = cause
  throw err
}

/** Stable `code` values of the errors this package throws (from the engine's error kinds). */
const codes = Object.freeze(native.errorCodes())

/** Indexed by the engine's reason code (`Reason as u8`). */
const REASONS = Object.freeze(native.reasons())
// The decisions' lookup table: a plain array (read by index on every call,
// a frozen one took V8's generic keyed load), never handed out.
const REASON_OF = [...REASONS]

function fail(Ctor, code, message) {
  const err = new Ctor(message)
  err.code = code
  return err
}

function describe(v) {
  if (v === null) return 'null'
  if (Array.isArray(v)) return 'an array'
  if (typeof v === 'string') {
    // A URL given to the wrong option is shown redacted (the engine's rule).
    const s = /[@:]/.test(v) ? native.redactUrl(v) : v
    return `the string ${JSON.stringify(s.length > 40 ? s.slice(0, 40) + '…' : s)}`
  }
  if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return `${typeof v} ${String(v)}`
  return typeof v
}

/**
 * The outcome of one acquire. Its own enumerable properties are exactly the
 * nine data fields (it serialises, spreads and compares as a plain object);
 * `headers()` is inherited from `Decision.prototype`. `rules` lists every
 * rule the key is held to (`[{ limit, windowMs }]`, frozen, shared by
 * decisions with the same rules; a calendar quota's has `calendar` too,
 * `'month@Europe/Berlin'`, and its `windowMs` is the nominal period); `limit`, `remaining`, `windowMs` and the
 * times are those of the binding rule, `rules[rule]`: the one that denied,
 * or, when admitted, the one with the fewest tokens left.
 */
class Decision {
  constructor(allowed, limit, remaining, retryAfterMs, resetAfterMs, windowMs, reason, rule, rules) {
    this.allowed = allowed
    this.limit = limit
    this.remaining = remaining
    this.retryAfterMs = retryAfterMs
    this.resetAfterMs = resetAfterMs
    this.windowMs = windowMs
    this.reason = reason
    this.rule = rule
    this.rules = rules
  }

  /** `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After`. */
  headers() {
    return headers(this)
  }
}

/**
 * HTTP response headers for a decision, or for any object with its fields
 * (for example one that crossed a process boundary as JSON): the IETF
 * `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers)
 * plus `Retry-After` in seconds when denied. Computed by the engine, so every
 * language sends the same headers.
 */
function headers(d) {
  if (d === null || typeof d !== 'object') {
    throw fail(TypeError, codes.CONFIG, `headers(decision): expected a decision object, got ${describe(d)}`)
  }
  for (const f of ['limit', 'remaining', 'retryAfterMs', 'resetAfterMs', 'windowMs']) {
    if (typeof d[f] !== 'number') {
      throw fail(TypeError, codes.CONFIG, `headers(decision): \`${f}\` must be a number (got ${describe(d[f])})`)
    }
  }
  // A decision of an older version (or a hand-made one) has no rules: its one rule is limit per windowMs.
  let flat
  let calendars
  if (d.rules !== undefined && d.rules !== null) {
    if (!Array.isArray(d.rules)) {
      throw fail(TypeError, codes.CONFIG, `headers(decision): \`rules\` must be an array of { limit, windowMs } (got ${describe(d.rules)})`)
    }
    flat = []
    for (const r of d.rules) {
      if (r === null || typeof r !== 'object' || typeof r.limit !== 'number' || typeof r.windowMs !== 'number') {
        throw fail(TypeError, codes.CONFIG, `headers(decision): every rule must be { limit: number, windowMs: number } (got ${describe(r)})`)
      }
      flat.push(r.limit, r.windowMs)
    }
    // A calendar quota among several is named by its period ("1month"), not its nominal window.
    if (d.rules.some((r) => r.calendar !== undefined && r.calendar !== null)) {
      calendars = d.rules.map((r) => {
        if (r.calendar === undefined || r.calendar === null) return ''
        if (typeof r.calendar !== 'string') {
          throw fail(TypeError, codes.CONFIG, `headers(decision): a rule's \`calendar\` must be a string such as 'month@UTC' (got ${describe(r.calendar)})`)
        }
        return r.calendar
      })
    }
  }
  const rule = d.rule ?? undefined
  if (rule !== undefined && typeof rule !== 'number') {
    throw fail(TypeError, codes.CONFIG, `headers(decision): \`rule\` must be a number (got ${describe(rule)})`)
  }
  return native.decisionHeaders(
    Boolean(d.allowed),
    d.limit,
    d.remaining,
    d.retryAfterMs,
    d.resetAfterMs,
    d.windowMs,
    rule,
    flat,
    typeof d.reason === 'string' ? d.reason : undefined,
    calendars,
  )
}

/** Calendar texts by the native side's codes (0: a token bucket, no calendar). */
const calendarTexts = new Map()

/** The calendar with code `code` as a rule writes it after its `/` ('month@UTC'), or undefined for 0. */
function calendarOf(code) {
  if (code === 0) return undefined
  let text = calendarTexts.get(code)
  if (text === undefined) {
    text = native.calendarText(code) ?? undefined
    calendarTexts.set(code, text)
  }
  return text
}

/** Whether `rules` holds the `n` rules stored as triples in `a` from index `at`. */
function sameRules(rules, a, at, n) {
  if (rules === null || rules.length !== n) return false
  for (let i = 0; i < n; i++) {
    const r = rules[i]
    if (r.limit !== a[at + 3 * i] || r.windowMs !== a[at + 3 * i + 1] || r.calendar !== calendarOf(a[at + 3 * i + 2])) return false
  }
  return true
}

/**
 * The `n` rules stored as triples (limit, windowMs, calendar code) in `a`
 * from index `at`, frozen: `{ limit, windowMs }`, and `calendar` for a
 * calendar quota.
 */
function readRules(a, at, n) {
  // Built by push: a packed array, whose frozen form V8 still reads by index
  // inline (`new Array(n)` is holey, and frozen it took the generic keyed
  // load on every `sameRules`).
  const out = []
  for (let i = 0; i < n; i++) {
    const limit = a[at + 3 * i]
    const windowMs = a[at + 3 * i + 1]
    const calendar = calendarOf(a[at + 3 * i + 2])
    out.push(Object.freeze(calendar === undefined ? { limit, windowMs } : { limit, windowMs, calendar }))
  }
  return Object.freeze(out)
}

/** Settles a cold acquire: the native side resolves with the numbers or an Error. */
function completed(r) {
  if (r instanceof Error) throw r
  return decisionFromArray(r)
}

function decisionFromArray(a) {
  const c = a[0]
  return new Decision((c & 16) !== 0, a[1], a[2], a[3], a[4], a[5], REASON_OF[c & 15], a[6], readRules(a, 8, a[7]))
}

/**
 * The native arguments `[cost, tier]` of a call with an options object:
 * `acquire(key, { tier })` or `acquire(key, cost, { tier })`.
 */
function callArgs(cost, options) {
  if (options === undefined && isPlainObject(cost)) {
    options = cost
    cost = undefined
  }
  if (cost === null) {
    throw fail(TypeError, codes.INVALID_COST, 'invalid cost: the cost must be a number (got null)')
  }
  if (options === undefined || options === null) return [cost, undefined]
  if (!isPlainObject(options)) {
    throw fail(TypeError, codes.CONFIG, `acquire: options must be an object such as { tier: 'pro' } (got ${describe(options)})`)
  }
  for (const name in options) {
    if (name !== 'tier' && name !== 'waitMs') {
      throw fail(Error, codes.CONFIG, `acquire: unknown option \`${name}\` (known: tier, waitMs)`)
    }
  }
  const tier = options.tier
  if (tier !== undefined && tier !== null && typeof tier !== 'string') {
    throw fail(TypeError, codes.CONFIG, `invalid tier: the tier must be a string (got ${describe(tier)})`)
  }
  const waitMs = options.waitMs
  if (waitMs !== undefined && waitMs !== null && typeof waitMs !== 'number') {
    throw fail(TypeError, codes.CONFIG, `invalid waitMs: it must be a number of milliseconds (got ${describe(waitMs)})`)
  }
  return [cost, tier, waitMs ?? undefined]
}

/** `acquireSync` / `tryAcquire` options: no `waitMs` (it would block the event loop). */
function syncCallArgs(cost, options, method) {
  const [c, tier, waitMs] = callArgs(cost, options)
  if (waitMs !== undefined) {
    throw fail(
      TypeError,
      codes.CONFIG,
      `${method}: waitMs would block the event loop; use \`await limiter.acquire(key, { waitMs })\``,
    )
  }
  return [c, tier]
}

/**
 * The tier of `reserve(key, estimate, { tier })` / `reserveSync`, after
 * checking the estimate's type (the engine checks its value as a cost's:
 * a whole number, at least 1, at most the key's limit) and the options.
 */
function reserveArgs(method, estimate, options) {
  if (typeof estimate !== 'number') {
    throw fail(TypeError, codes.INVALID_COST, `invalid estimate: the estimate must be a number of tokens (got ${describe(estimate)})`)
  }
  return tierOption(method, options)
}

/** The tier of a call whose only option is `{ tier }` (`reserve`, `acquireConcurrent`). */
function tierOption(method, options) {
  if (options === undefined || options === null) return undefined
  if (!isPlainObject(options)) {
    throw fail(TypeError, codes.CONFIG, `${method}: options must be an object such as { tier: 'pro' } (got ${describe(options)})`)
  }
  for (const name in options) {
    if (name !== 'tier') throw fail(Error, codes.CONFIG, `${method}: unknown option \`${name}\` (known: tier)`)
  }
  const tier = options.tier
  if (tier !== undefined && tier !== null && typeof tier !== 'string') {
    throw fail(TypeError, codes.CONFIG, `invalid tier: the tier must be a string (got ${describe(tier)})`)
  }
  return tier ?? undefined
}

/**
 * A request admitted (or denied) at an estimate of its cost by
 * `limiter.reserve()` / `reserveSync()`, to be settled once, with
 * `settle(actual)`, when its actual cost is known (an LLM response's tokens,
 * bytes streamed). Settled below the estimate, the rest goes back to the key;
 * above it, the key is charged the difference, into debt if need be (later
 * requests wait for the refill). Never settled (garbage-collected), it keeps
 * its estimate.
 */
class Reservation {
  #native
  #decision

  constructor(handle) {
    if (!(handle instanceof native.NativeReservation)) {
      throw fail(TypeError, codes.CONFIG, 'Reservation: made by limiter.reserve() or limiter.reserveSync(), not by `new`')
    }
    this.#native = handle
    this.#decision = decisionFromArray(handle.decision())
  }

  /** Whether the request was admitted at its estimate. */
  get allowed() {
    return this.#decision.allowed
  }

  /** The decision on the estimate, as `acquire` would have returned it. */
  get decision() {
    return this.#decision
  }

  /** The tokens reserved. */
  get estimate() {
    return this.#native.estimate
  }

  /** The key reserved on. */
  get key() {
    return this.#native.key
  }

  /** Whether `settle` was called (successfully or not). */
  get settled() {
    return this.#native.settled
  }

  /**
   * Settle at `actual` tokens (0 when the request used nothing), once.
   * Throws (`code` `ERR_QUOTALEASE_RESERVATION`) when settled already, for a
   * denied reservation, or for an `actual` that is not a whole number 0 or
   * more (a `TypeError` when not a number, a `RangeError` otherwise: the
   * reservation stays unsettled); `ERR_QUOTALEASE_CLOSED` after the limiter
   * was closed (the estimate stands).
   */
  settle(actual) {
    if (typeof actual !== 'number') {
      throw fail(TypeError, codes.RESERVATION, `invalid settle: actual must be a number of tokens (got ${describe(actual)})`)
    }
    this.#native.settle(actual)
  }

  /** `Reservation { key, estimate, allowed, settled }` in `console.log`. */
  [util.inspect.custom](depth, options, inspect) {
    const { key, estimate, allowed, settled } = this
    return `Reservation ${inspect({ key, estimate, allowed, settled }, options)}`
  }
}

/** Settles a cold reserve: the native side resolves with a NativeReservation or an Error. */
function reserved(r) {
  if (r instanceof Error) throw r
  return new Reservation(r)
}

/**
 * One of a key's requests in flight, from `limiter.acquireConcurrent()` /
 * `acquireConcurrentSync()` under the limiter's `concurrency`: `allowed`
 * says whether the request may start. Release it once with `release()` when
 * the request ends; garbage-collected unreleased, an admitted permit is
 * released then (do not count on when).
 */
class Permit {
  #native
  #decision

  constructor(handle) {
    if (!(handle instanceof native.NativePermit)) {
      throw fail(TypeError, codes.CONFIG, 'Permit: made by limiter.acquireConcurrent() or limiter.acquireConcurrentSync(), not by `new`')
    }
    this.#native = handle
    this.#decision = decisionFromArray(handle.decision())
  }

  /** Whether the request may go ahead (a permit was taken). */
  get allowed() {
    return this.#decision.allowed
  }

  /** The decision: `limit` is the concurrency, `remaining` the permits left; a denial's `retryAfterMs` says when to ask again. */
  get decision() {
    return this.#decision
  }

  /** The key the permit is for. */
  get key() {
    return this.#native.key
  }

  /** Whether `release` was called. */
  get released() {
    return this.#native.released
  }

  /**
   * Release the permit: the key may have one more request in flight. Once
   * only: throws (`code` `ERR_QUOTALEASE_RESERVATION`) when released already
   * or for a denied permit (no permit was taken); `ERR_QUOTALEASE_CLOSED`
   * after the limiter was closed.
   */
  release() {
    this.#native.release()
  }

  /** `Permit { key, allowed, released }` in `console.log`. */
  [util.inspect.custom](depth, options, inspect) {
    const { key, allowed, released } = this
    return `Permit ${inspect({ key, allowed, released }, options)}`
  }
}

/** Settles a cold acquireConcurrent: the native side resolves with a NativePermit or an Error. */
function permitted(p) {
  if (p instanceof Error) throw p
  return new Permit(p)
}

/** The value of a store call, or its Error thrown (the engine redacts a URL it echoes). */
function stored(r) {
  if (r instanceof Error) throw r
  return r
}

function checkString(who, name, v) {
  if (typeof v !== 'string') {
    throw fail(TypeError, codes.CONFIG, `${who}: \`${name}\` must be a string (got ${describe(v)})`)
  }
}

function checkTier(who, tier) {
  if (tier !== undefined && tier !== null && typeof tier !== 'string') {
    throw fail(TypeError, codes.CONFIG, `${who}: \`tier\` must be a string (got ${describe(tier)})`)
  }
}

function checkInt(name, v) {
  if (typeof v !== 'number') {
    throw fail(TypeError, codes.CONFIG, `invalid configuration: \`${name}\` must be a number (got ${describe(v)})`)
  }
  if (!Number.isSafeInteger(v) || v < 0) {
    throw fail(
      RangeError,
      codes.CONFIG,
      `invalid configuration: \`${name}\` must be a whole number >= 0 (got ${String(v)})`,
    )
  }
  return v
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

/**
 * The options as `[names, values]` for the engine, which knows every name
 * (camelCase or snake_case) and checks every value: `undefined` and `null`
 * leave the default, numbers and strings go as they are. Here: `onEvent`,
 * the `clock: { manualStartMs }` form, and values of no type the engine reads.
 */
function nativeOptions(options) {
  if (!isPlainObject(options)) {
    throw fail(
      TypeError,
      codes.CONFIG,
      `new Limiter(options): options must be an object such as { limit: 100, windowMs: 60000 } (got ${describe(options)})`,
    )
  }
  const names = []
  const values = []
  let onEvent
  for (const name of Object.keys(options)) {
    const v = options[name]
    if (name === 'onEvent') {
      if (v !== undefined && v !== null && typeof v !== 'function') {
        throw fail(TypeError, codes.CONFIG, `invalid configuration: \`onEvent\` must be a function (got ${describe(v)})`)
      }
      onEvent = v ?? undefined
    } else if (name === 'clock' && isPlainObject(v)) {
      if (v.manualStartMs === undefined) {
        throw fail(
          TypeError,
          codes.CONFIG,
          'invalid configuration: `clock` must be "system", "manual" or { manualStartMs: number } (got an object without manualStartMs)',
        )
      }
      names.push('clock', 'clockStartMs')
      values.push('manual', v.manualStartMs)
    } else if (v === undefined || v === null || typeof v === 'number' || typeof v === 'string') {
      names.push(name)
      values.push(v)
    } else if (typeof v === 'boolean' && native.optionType(name) === 'boolean') {
      // A boolean only where the engine takes one (`shadow`): never 0 or 1 for a number.
      names.push(name)
      values.push(v)
    } else {
      // optionType throws for an unknown name, with the engine's suggestion.
      throw fail(
        TypeError,
        codes.CONFIG,
        `invalid configuration: \`${name}\` must be a ${native.optionType(name)} (got ${describe(v)})`,
      )
    }
  }
  return { names, values, onEvent }
}

function checkKey(key) {
  if (typeof key !== 'string') {
    throw fail(TypeError, codes.INVALID_KEY, `invalid key: the key must be a string (got ${describe(key)})`)
  }
}

/**
 * A distributed rate limiter. See README.md (## Node) and index.d.ts.
 *
 * Events: `'degraded'` and `'recovered'` with `{ kind, message }` when the
 * backend fails or comes back. Listening never keeps the process alive.
 */
/** A limiter's native handle, for the module's functions (set in the class's static block). */
let nativeOf

/** `{ labels }` of `metricsPrometheus(options)`: its labels object. */
function checkLabelOptions(options) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw fail(TypeError, codes.CONFIG, `metricsPrometheus: options must be an object such as { labels: { limiter: 'api' } } (got ${describe(options)})`)
  }
  for (const name of Object.keys(options)) {
    if (name !== 'labels') throw fail(Error, codes.CONFIG, `metricsPrometheus: unknown option \`${name}\` (known: labels)`)
  }
  return options.labels
}

/** `[names, values]` of a labels object (`undefined`: none); every value a string. */
function labelArrays(who, labels) {
  if (labels === undefined || labels === null) return [[], []]
  if (typeof labels !== 'object' || Array.isArray(labels)) {
    throw fail(TypeError, codes.CONFIG, `${who}: \`labels\` must be an object of strings such as { limiter: 'api' } (got ${describe(labels)})`)
  }
  const names = Object.keys(labels)
  const values = names.map((n) => {
    const v = labels[n]
    if (typeof v !== 'string') {
      throw fail(TypeError, codes.CONFIG, `${who}: label \`${n}\` must be a string (got ${describe(v)})`)
    }
    return v
  })
  return [names, values]
}

class Limiter extends EventEmitter {
  #native
  #scratch
  #acquire
  #tryAcquire
  #acquireAsync
  #reserve
  #reserveAsync
  #closing
  #rules
  // The one rule of `#rules` as the scratch array codes it (limit, windowMs,
  // calendar code); NaN when `#rules` has several (or none yet).
  #limit0 = NaN
  #window0 = NaN
  #calendar0 = NaN

  constructor(options) {
    super()
    const { names, values, onEvent } = nativeOptions(options)
    // [limit, remaining, retryAfterMs, resetAfterMs, windowMs, reason | allowed << 4,
    //  rule, rule count, limit, windowMs and calendar code of each rule (at most 4)]
    this.#scratch = new Float64Array(new ArrayBuffer(8 * 20))
    this.#rules = null
    // The native side holds this callback for as long as the limiter lives;
    // through a WeakRef it does not keep the limiter itself reachable.
    const self = new WeakRef(this)
    const deliver = (kind, message) => {
      const event = { kind, message }
      if (onEvent) onEvent(event)
      const l = self.deref()
      if (l) l.emit(kind, event)
    }
    // The engine's errors show a URL given to any option redacted.
    this.#native = new native.NativeLimiter(names, values, this.#scratch, deliver)
    const hot = this.#native.hotPath()
    this.#acquire = hot.acquire
    this.#tryAcquire = hot.tryAcquire
    this.#acquireAsync = hot.acquireAsync
    this.#reserve = hot.reserve
    this.#reserveAsync = hot.reserveAsync
    this.#closing = null
  }

  #decision() {
    const s = this.#scratch
    const c = s[5]
    // Decisions with the rules of the previous one share its (frozen) rules
    // array. One rule (most keys) is compared as three numbers: reading the
    // frozen array itself took V8's generic keyed load, about 6 ns a call.
    const n = s[7]
    const same =
      n === 1 ? s[8] === this.#limit0 && s[9] === this.#window0 && s[10] === this.#calendar0 : sameRules(this.#rules, s, 8, n)
    if (!same) {
      this.#rules = readRules(s, 8, n)
      this.#limit0 = n === 1 ? s[8] : NaN
      this.#window0 = n === 1 ? s[9] : NaN
      this.#calendar0 = n === 1 ? s[10] : NaN
    }
    return new Decision((c & 16) !== 0, s[0], s[1], s[2], s[3], s[4], REASON_OF[c & 15], s[6], this.#rules)
  }

  /**
   * Take `cost` tokens (default 1) for `key`, in plan tier `options.tier`
   * when given (`acquire(key, { tier })` or `acquire(key, cost, { tier })`).
   * Resolves without any network call while the local lease holds enough
   * tokens; otherwise waits for a lease request (at most `backendTimeoutMs`)
   * without blocking the event loop.
   */
  acquire(key, cost, options) {
    // Not an `async` function: the hot path returns an already resolved
    // Promise without the async-function machinery; errors still reject.
    let p
    try {
      if (options === undefined && (cost === undefined || typeof cost === 'number')) {
        p = cost === undefined ? this.#acquireAsync(key) : this.#acquireAsync(key, cost)
      } else {
        const [c, tier, waitMs] = callArgs(cost, options)
        if (waitMs !== undefined) {
          checkKey(key)
          if (c !== undefined && typeof c !== 'number') {
            throw fail(TypeError, codes.INVALID_COST, `invalid cost: the cost must be a number (got ${describe(c)})`)
          }
          return this.#native.acquireWait(key, c === undefined ? 1 : c, tier ?? undefined, waitMs).then(completed)
        }
        p = this.#acquireAsync(key, c, tier)
      }
    } catch (err) {
      return Promise.reject(err)
    }
    if (p === undefined) return Promise.resolve(this.#decision())
    return p.then(completed)
  }

  /**
   * Like `acquire`, synchronously. On a key's first request (or when its
   * lease ran dry) it may block the event loop for up to `backendTimeoutMs`
   * waiting for Redis; prefer `await acquire()` in servers.
   */
  acquireSync(key, cost, options) {
    if (options === undefined && (cost === undefined || typeof cost === 'number')) {
      if (cost === undefined) this.#acquire(key)
      else this.#acquire(key, cost)
    } else {
      const [c, tier] = syncCallArgs(cost, options, 'acquireSync')
      this.#acquire(key, c, tier)
    }
    return this.#decision()
  }

  /**
   * Reserve `estimate` tokens of `key` for a request whose cost is known only
   * after it ran, in plan tier `options.tier` when given: decided as
   * `acquire(key, estimate)` would be, it resolves to a `Reservation` (its
   * `allowed` and `decision` say whether to go ahead); call
   * `reservation.settle(actual)` once the cost is known. Waits for a lease
   * request like `acquire`, without blocking the event loop.
   */
  reserve(key, estimate, options) {
    let r
    try {
      checkKey(key)
      const tier = reserveArgs('reserve', estimate, options)
      r = this.#reserveAsync(key, estimate, tier)
    } catch (err) {
      return Promise.reject(err)
    }
    if (r instanceof Promise) return r.then(reserved)
    return Promise.resolve(new Reservation(r))
  }

  /** Like `reserve`, synchronously: may block the event loop as `acquireSync` may. */
  reserveSync(key, estimate, options) {
    checkKey(key)
    const tier = reserveArgs('reserveSync', estimate, options)
    return new Reservation(this.#reserve(key, estimate, tier))
  }

  /**
   * Take a permit for one request of `key` in flight (the `concurrency`
   * option, or the `"N concurrent"` of the key's rules: its own entry's,
   * `options.tier`'s or its assigned tier's): admitted while fewer than that
   * many of the key's requests are in flight across the fleet, denied
   * otherwise. Resolves to a `Permit` (check `allowed`; `release()` it when
   * the request ends). Waits for a lease call like `acquire`, without
   * blocking the event loop. Rejects with `ERR_QUOTALEASE_CONFIG` when the
   * key has no concurrency limit, or the tier is unknown.
   */
  acquireConcurrent(key, options) {
    try {
      checkKey(key)
      const tier = tierOption('acquireConcurrent', options)
      return this.#native.acquireConcurrent(key, tier).then(permitted)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /** Like `acquireConcurrent`, synchronously: may block the event loop as `acquireSync` may. */
  acquireConcurrentSync(key, options) {
    checkKey(key)
    const tier = tierOption('acquireConcurrentSync', options)
    return new Permit(this.#native.acquireConcurrentSync(key, tier))
  }

  /** How many requests of `key` wait (`acquire(key, { waitMs })`) in this process now. */
  waiters(key) {
    checkKey(key)
    return this.#native.waiters(key)
  }

  /**
   * Never waits: with no local tokens and a lease request needed it starts
   * one and denies with reason `'pending'`.
   */
  tryAcquire(key, cost, options) {
    if (options === undefined && (cost === undefined || typeof cost === 'number')) {
      if (cost === undefined) this.#tryAcquire(key)
      else this.#tryAcquire(key, cost)
    } else {
      const [c, tier] = syncCallArgs(cost, options, 'tryAcquire')
      this.#tryAcquire(key, c, tier)
    }
    return this.#decision()
  }

  /**
   * The rules `key` is held to on a call naming `tier` (none: the default
   * tier, or `limit`/`windowMs`), and why: `{ rules, tier, assignedBy,
   * definedBy, source }`. Reads what this limiter knows (no backend call).
   */
  policy(key, tier) {
    checkKey(key)
    checkTier('policy', tier)
    return this.#native.policy(key, tier ?? undefined)
  }

  /** Every tier this limiter knows now, by name: `[{ name, rules, definedBy }]`. */
  tiers() {
    return this.#native.tiers()
  }

  /**
   * Define (or redefine) tier `name` in the shared policy store (`rules`
   * like `'6000/min, 1000000/day'`): every limiter on the store applies it
   * within `policyRefreshMs`, this one before the Promise resolves.
   * Resolves to the store's version after the change.
   */
  async policySetTier(name, rules) {
    checkString('policySetTier', 'name', name)
    checkString('policySetTier', 'rules', rules)
    return stored(await this.#native.policySetTier(name, rules))
  }

  /** Remove tier `name` from the store; resolves to the store's version. */
  async policyDeleteTier(name) {
    checkString('policyDeleteTier', 'name', name)
    return stored(await this.#native.policyDeleteTier(name))
  }

  /**
   * Give `key` its own entry in the store, `'tier:pro'` or rules
   * (`'10/s, 1000/day'`): it wins over the tier callers name. Resolves to
   * the store's version.
   */
  async policyAssign(key, assignment) {
    checkKey(key)
    checkString('policyAssign', 'assignment', assignment)
    return stored(await this.#native.policyAssign(key, assignment))
  }

  /** Remove `key`'s entry from the store; resolves to the store's version. */
  async policyUnassign(key) {
    checkKey(key)
    return stored(await this.#native.policyUnassign(key))
  }

  /** The store's entry for `key` as stored (`'tier:pro'`, `'10/s'`), or `null`. */
  async policyGet(key) {
    checkKey(key)
    return stored(await this.#native.policyGet(key))
  }

  /**
   * What the store holds: `{ version, tiers: [{ name, rules }], keys: [{ key,
   * assignment }] }`, sorted by name. Reads the whole store: an operator call.
   */
  async policyList() {
    return stored(await this.#native.policyList())
  }

  /** Check the policy store (and file) now and apply what changed before resolving. */
  async refreshPolicies() {
    stored(await this.#native.refreshPolicies())
  }

  /**
   * Override one key's policy: `setLimit(key, limit, windowMs)` or
   * `setLimit(key, '100/min')`. Takes effect at the key's next lease.
   */
  setLimit(key, limit, windowMs) {
    checkKey(key)
    if (typeof limit === 'string' && windowMs === undefined) {
      ;[limit, windowMs] = native.parseRate(limit)
    }
    if (typeof limit !== 'number') {
      throw fail(TypeError, codes.CONFIG, `setLimit: \`limit\` must be a number or a rate like "100/min" (got ${describe(limit)})`)
    }
    if (typeof windowMs !== 'number') {
      throw fail(TypeError, codes.CONFIG, `setLimit: \`windowMs\` must be a number (got ${describe(windowMs)})`)
    }
    this.#native.setLimit(key, checkInt('limit', limit), checkInt('windowMs', windowMs))
  }

  /** Counters and gauges, named as in every quotalease binding (snake_case). */
  metrics() {
    return this.#native.metrics()
  }

  static {
    nativeOf = (l) => l.#native
  }

  /** The metrics in Prometheus text format (prefix `quotalease_`), with `labels` on every sample. */
  metricsPrometheus(options) {
    const [names, values] = labelArrays('metricsPrometheus', options === undefined ? undefined : checkLabelOptions(options))
    return this.#native.metricsPrometheus(names, values)
  }

  /** Connect to the backend now and run a read-only probe; off the event loop. */
  async check() {
    const r = await this.#native.check()
    if (r instanceof Error) throw r
  }

  /** `check()`, blocking the calling thread. */
  checkSync() {
    this.#native.checkSync()
  }

  /** Give every leased token back now (graceful shutdown); off the event loop. */
  async flush() {
    const r = await this.#native.flush()
    if (r instanceof Error) throw r
  }

  /** `flush()`, blocking the calling thread until the backend took the tokens. */
  flushSync() {
    this.#native.flushSync()
  }

  /**
   * Give every leased token back, stop the background broker and release the
   * event callback. Afterwards every call fails with `ERR_QUOTALEASE_CLOSED`
   * and nothing of the limiter keeps the process alive. Idempotent: every
   * call returns the same promise.
   */
  close() {
    if (this.#closing === null) {
      this.#closing = this.#native.close().then((r) => {
        if (r instanceof Error) throw r
      })
    }
    return this.#closing
  }

  /** `close()`, blocking the calling thread until done. */
  closeSync() {
    this.#native.closeSync()
    if (this.#closing === null) this.#closing = Promise.resolve()
  }

  /** Tokens per lease request after defaults (the accuracy budget per instance). */
  get leaseSize() {
    return this.#native.leaseSize
  }

  /** What this limiter and the authority know about `key` (debugging denials). */
  inspect(key) {
    checkKey(key)
    return this.#native.inspect(key)
  }

  /** Tests with `clock: 'manual'`: move the clock forward by `ms`. */
  advanceClock(ms) {
    if (typeof ms !== 'number') {
      throw fail(TypeError, codes.CONFIG, `advanceClock: \`ms\` must be a number (got ${describe(ms)})`)
    }
    this.#native.advanceClock(checkInt('ms', ms))
  }

  /**
   * Tests: run lease-TTL maintenance, then wait (blocking, at most 10 s)
   * until no lease or give-back request is in flight.
   */
  settle() {
    this.#native.settle()
  }

  /** `Limiter(url='redis://***@host:6379', limit=…, …)`: the URL's credentials are never shown. */
  toString() {
    const s = this.#native.summary()
    return `Limiter(url='${s.url}', limit=${s.limit}, windowMs=${s.windowMs}, leaseSize=${s.leaseSize}, mode='${s.mode}')`
  }

  /** What `console.log` and `util.inspect` show: the main options, the URL redacted. */
  [util.inspect.custom](depth, options, inspect) {
    return `Limiter ${inspect(this.#native.summary(), options)}`
  }
}

/**
 * The limiter key an HTTP middleware uses for a raw key (a header, an
 * address): the key itself up to 512 UTF-8 bytes, else `'sha256:'` and the
 * 64 hex digits of its SHA-256. The engine's rule, the same in every
 * language's middleware: an over-long key is limited, never an error.
 */
function httpKey(raw) {
  checkKey(raw)
  return native.httpKey(raw)
}

/**
 * `url` as quotalease prints it everywhere: the user name and password
 * (everything between `://` and the last `@`), a port that is not a number,
 * query values other than a valid `protocol` or `db` become `***`; hosts,
 * ports and the database stay. The engine's rule, the same in every language.
 */
function redactUrl(url) {
  if (typeof url !== 'string') {
    throw fail(TypeError, codes.CONFIG, `redactUrl: \`url\` must be a string (got ${typeof url})`)
  }
  return native.redactUrl(url)
}

/**
 * Several limiters' counters in ONE Prometheus exposition: each family's
 * `# HELP` and `# TYPE` once, then one sample per limiter, told apart by its
 * labels: `metricsPrometheus([{ limiter: a, labels: { limiter: 'api' } }, ...])`.
 */
function metricsPrometheus(limiters) {
  if (!Array.isArray(limiters)) {
    throw fail(TypeError, codes.CONFIG, `metricsPrometheus: expected an array of { limiter, labels } (got ${describe(limiters)})`)
  }
  const natives = []
  const names = []
  const values = []
  for (const item of limiters) {
    if (item === null || typeof item !== 'object' || !(item.limiter instanceof Limiter)) {
      throw fail(TypeError, codes.CONFIG, `metricsPrometheus: expected { limiter: Limiter, labels } (got ${describe(item)})`)
    }
    const [n, v] = labelArrays('metricsPrometheus', item.labels)
    natives.push(nativeOf(item.limiter))
    names.push(n)
    values.push(v)
  }
  return native.metricsPrometheusMany(natives, names, values)
}

/** `{ limit, windowMs }` from a rate such as `'600/min'`, `'10/s'`, `'100/30s'`. */
function parseRate(rate) {
  if (typeof rate !== 'string') {
    throw fail(TypeError, codes.CONFIG, `parseRate: \`rate\` must be a string like "600/min" (got ${describe(rate)})`)
  }
  const [limit, windowMs] = native.parseRate(rate)
  return { limit, windowMs }
}

module.exports = {
  Limiter,
  Decision,
  Reservation,
  Permit,
  headers,
  parseRate,
  httpKey,
  redactUrl,
  metricsPrometheus,
  codes,
  reasons: REASONS,
  engineVersion: native.engineVersion(),
}
