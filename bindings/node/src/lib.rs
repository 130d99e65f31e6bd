//! The native half of the npm package `quotalease`: a thin napi-rs
//! translation of the Rust engine. The JavaScript wrapper (`index.js`) owns
//! JS argument checking, the `Decision` objects and events; this crate
//! turns JS values into engine calls and engine results into JS values.
//! Option names, their values and the rules between them are the core's
//! (`quotalease::Options`), as are the reason and error-kind names.
//!
//! Hot path: `acquire` reads the key into a stack buffer (no allocation),
//! calls the engine and writes the decision's numbers into a `Float64Array`
//! the wrapper handed over at construction, returning the reason and the
//! allowed bit as one small integer. The wrapper builds the decision object
//! from that, which is far cheaper than building it through N-API.
//!
//! Cold path: `acquireAsync` uses the engine's `acquire_or_notify`; when the
//! engine must wait for Redis it returns a Promise settled from the broker
//! thread through a `JsDeferred`, so the event loop never blocks.
//! `reserveAsync` does the same with `reserve_or_notify`, resolving with a
//! `NativeReservation` (the engine's `Reservation`, settled by the wrapper's
//! `Reservation.settle`; garbage-collected unsettled, it keeps its estimate).
#![deny(clippy::all)]

mod fast;

use std::ffi::{CStr, CString};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use quotalease::Quota;
use quotalease::{
    Calendar, Decision, Error as QlError, ErrorKind, Event, Limiter, OptionValue, Options, Permit, PolicyListing,
    PolicySource, Reason, Reservation, Rules,
};

/// `ERR_QUOTALEASE_` and the kind's name in capitals, for every
/// `ErrorKind::ALL` in its order.
static CODES: LazyLock<Vec<CString>> = LazyLock::new(|| {
    ErrorKind::ALL
        .iter()
        .map(|k| CString::new(format!("ERR_QUOTALEASE_{}", k.as_str().to_ascii_uppercase())).expect("no NUL"))
        .collect()
});

/// Errors thrown to JavaScript carry one of these as `code`.
pub(crate) fn code_of(kind: ErrorKind) -> &'static CStr {
    let i = ErrorKind::ALL
        .iter()
        .position(|k| *k == kind)
        .expect("ALL holds every kind");
    &CODES[i]
}

fn code_str(kind: ErrorKind) -> &'static str {
    code_of(kind).to_str().expect("ASCII")
}

type JsResult<T> = std::result::Result<T, napi::Error<String>>;

fn js_err(e: QlError) -> napi::Error<String> {
    napi::Error::new(code_str(e.kind()).to_string(), e.to_string())
}

fn bad(kind: ErrorKind, msg: impl Into<String>) -> napi::Error<String> {
    napi::Error::new(code_str(kind).to_string(), msg.into())
}

/// Largest integer a JS number holds exactly.
pub(crate) const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

/// A JS number that must be a whole number in 0..=2^53-1.
fn whole(v: f64, kind: ErrorKind, what: &str) -> JsResult<u64> {
    if v.is_finite() && (0.0..=MAX_SAFE).contains(&v) && v.fract() == 0.0 {
        Ok(v as u64)
    } else {
        Err(bad(kind, format!("`{what}` must be a whole number >= 0 (got {v})")))
    }
}

/// Keys longer than this many UTF-8 bytes are rejected by the engine anyway;
/// the buffer leaves room to tell "too long" from "fits".
pub(crate) const KEY_BUF: usize = 1024;

/// Numbers in the scratch array: limit, remaining, retryAfterMs,
/// resetAfterMs, windowMs, `reason | allowed << 4`, the binding rule's
/// index, the number of rules, then each rule's limit, windowMs and
/// calendar code ([`calendar_code`]).
pub(crate) const SCRATCH_LEN: usize = 8 + 3 * quotalease::internals::MAX_RULES;

/// The calendars decisions have named to JavaScript, by code - 1. Only
/// grows, as the engine's own table of calendars does (one per distinct
/// rule text).
static CALENDAR_CODES: RwLock<Vec<Calendar>> = RwLock::new(Vec::new());

/// A rule's calendar as a number for the wrapper: 0 for a token bucket,
/// else a code `calendarText(code)` turns into the calendar's text
/// (`'month@Europe/Berlin'`), so the wrapper's rules (and the headers
/// built from them) tell a calendar quota from a token bucket.
#[inline]
pub(crate) fn calendar_code(c: Calendar) -> f64 {
    if !c.is_some() {
        return 0.0;
    }
    let known = |all: &[Calendar]| all.iter().position(|k| *k == c).map(|i| (i + 1) as f64);
    if let Some(code) = known(&CALENDAR_CODES.read().unwrap_or_else(|e| e.into_inner())) {
        return code;
    }
    let mut all = CALENDAR_CODES.write().unwrap_or_else(|e| e.into_inner());
    if let Some(code) = known(&all) {
        return code;
    }
    all.push(c);
    all.len() as f64
}

/// The text of the calendar with code `code` (see `calendar_code`), as a
/// rule writes it after its `/`: `'day@UTC'`, `'month@billing-day-15 UTC'`.
#[napi]
pub fn calendar_text(code: u32) -> Option<String> {
    let all = CALENDAR_CODES.read().unwrap_or_else(|e| e.into_inner());
    let c = *all.get((code as usize).checked_sub(1)?)?;
    c.spec().map(|s| s.to_string())
}

/// A decision as numbers, in the scratch array's order but with the code
/// first: `[code, limit, remaining, retryAfterMs, resetAfterMs, windowMs,
/// rule, rule count, limit, windowMs and calendar code of each rule]`.
fn decision_numbers(d: &Decision) -> Vec<f64> {
    let all = d.rules();
    let rules = all.as_slice();
    let mut v = Vec::with_capacity(8 + 3 * rules.len());
    v.extend_from_slice(&[
        code_of_decision(d) as f64,
        d.limit as f64,
        d.remaining as f64,
        d.retry_after_ms as f64,
        d.reset_after_ms as f64,
        d.window_ms as f64,
        d.rule as f64,
        rules.len() as f64,
    ]);
    for p in rules {
        v.push(p.limit as f64);
        v.push(p.window_ms as f64);
        v.push(calendar_code(p.calendar));
    }
    v
}

/// `[{ limit, windowMs }, ...]`, with `calendar` (`'day@UTC'`) on a
/// calendar quota.
fn rules_value<'e>(env: &'e Env, rules: &Rules) -> Result<Array<'e>> {
    let list = rules.as_slice();
    let mut a = env.create_array(list.len() as u32)?;
    for (i, p) in list.iter().enumerate() {
        let mut o = Object::new(env)?;
        o.set("limit", p.limit as f64)?;
        o.set("windowMs", p.window_ms as f64)?;
        if let Some(c) = p.calendar.spec() {
            o.set("calendar", c.to_string())?;
        }
        a.set(i as u32, o)?;
    }
    Ok(a)
}

/// `{ rules, tier, assignedBy, definedBy, access, source }`.
fn policy_value<'e>(env: &'e Env, rules: &Rules, src: &PolicySource) -> Result<Object<'e>> {
    let mut o = Object::new(env)?;
    o.set("rules", rules_value(env, rules)?)?;
    o.set("tier", src.tier.clone())?;
    o.set("assignedBy", src.assigned_by.as_str())?;
    o.set("definedBy", src.defined_by.as_str())?;
    o.set("access", src.access.map(|a| a.as_str()))?;
    o.set("source", src.to_string())?;
    Ok(o)
}

/// `reason | allowed << 4`: what the wrapper needs besides the numbers
/// (the reason's code is `Reason as u8`, its name `reasons()[code]`).
#[inline]
fn code_of_decision(d: &Decision) -> u32 {
    (d.reason as u32) | ((d.allowed as u32) << 4)
}

/// An option's value as the wrapper passes it: `undefined`/`null` leave
/// the default; numbers, strings and booleans go to the core as they are.
type NativeValue = Option<Either3<f64, String, bool>>;

/// Every option through the core's `Options::set`, by the name the caller
/// used (camelCase or snake_case): names, values, defaults and the rules
/// between options are the core's.
fn options_from(names: Vec<String>, values: Vec<NativeValue>) -> JsResult<Options> {
    if names.len() != values.len() {
        return Err(bad(ErrorKind::Config, "names and values differ in length"));
    }
    let mut opts = Options::new();
    for (name, value) in names.iter().zip(&values) {
        let v = match value {
            None => OptionValue::Null,
            Some(Either3::A(n)) => OptionValue::Float(*n),
            Some(Either3::B(s)) => OptionValue::Str(s),
            Some(Either3::C(b)) => OptionValue::Bool(*b),
        };
        opts.set(name, v).map_err(js_err)?;
    }
    Ok(opts)
}

/// Events reach JS through a weak (unref'd) threadsafe function: it never
/// keeps the process alive. Taken out (released) by `close`.
type EventFn = ThreadsafeFunction<FnArgs<(String, String)>, (), FnArgs<(String, String)>, Status, false, true>;

/// The outcome of an asynchronous call, turned into a JS value on the JS
/// thread: a decision as numbers (`decision_numbers`), a `NativeReservation`,
/// a `NativePermit`, `undefined` for calls without a result, the policy store's version (a
/// number), a store entry (a string or `null`), the store's listing, or an
/// `Error` with a `code` (resolved, not rejected, so it keeps its code; the
/// wrapper throws it).
enum Completion {
    Decided(std::result::Result<Decision, QlError>),
    Reserved(std::result::Result<Reservation, QlError>),
    Permitted(std::result::Result<Permit, QlError>),
    Done(std::result::Result<(), QlError>),
    Version(std::result::Result<u64, QlError>),
    Entry(std::result::Result<Option<String>, QlError>),
    Listing(std::result::Result<PolicyListing, QlError>),
}

/// `{ version, tiers: [{ name, rules }], keys: [{ key, assignment }] }`.
fn listing_value(env: &Env, l: PolicyListing) -> Result<Object<'_>> {
    let mut o = Object::new(env)?;
    o.set("version", l.version as f64)?;
    let mut tiers = env.create_array(l.tiers.len() as u32)?;
    for (i, (name, rules)) in l.tiers.into_iter().enumerate() {
        let mut t = Object::new(env)?;
        t.set("name", name)?;
        t.set("rules", rules)?;
        tiers.set(i as u32, t)?;
    }
    o.set("tiers", tiers)?;
    let mut keys = env.create_array(l.keys.len() as u32)?;
    for (i, (key, assignment)) in l.keys.into_iter().enumerate() {
        let mut k = Object::new(env)?;
        k.set("key", key)?;
        k.set("assignment", assignment)?;
        keys.set(i as u32, k)?;
    }
    o.set("keys", keys)?;
    Ok(o)
}

impl ToNapiValue for Completion {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        let err = match val {
            Completion::Decided(Ok(d)) => return unsafe { Vec::<f64>::to_napi_value(env, decision_numbers(&d)) },
            Completion::Reserved(Ok(r)) => {
                return unsafe { NativeReservation::to_napi_value(env, NativeReservation { inner: r }) }
            }
            Completion::Permitted(Ok(p)) => {
                return unsafe { NativePermit::to_napi_value(env, NativePermit { inner: p }) }
            }
            Completion::Done(Ok(())) => return unsafe { <()>::to_napi_value(env, ()) },
            Completion::Version(Ok(v)) => return unsafe { f64::to_napi_value(env, v as f64) },
            Completion::Entry(Ok(e)) => return unsafe { Option::<String>::to_napi_value(env, e) },
            Completion::Listing(Ok(l)) => {
                let e = Env::from_raw(env);
                let o = listing_value(&e, l)?;
                return unsafe { Object::to_napi_value(env, o) };
            }
            Completion::Decided(Err(e))
            | Completion::Reserved(Err(e))
            | Completion::Permitted(Err(e))
            | Completion::Done(Err(e))
            | Completion::Version(Err(e))
            | Completion::Entry(Err(e))
            | Completion::Listing(Err(e)) => e,
        };
        Ok(unsafe { JsError::from(js_err(err)).into_value(env) })
    }
}

type Resolver = Box<dyn FnOnce(Env) -> Result<Completion> + Send>;
type Deferred = napi::JsDeferred<Completion, Resolver>;

fn settle(d: Deferred, c: Completion) {
    d.resolve(Box::new(move |_| Ok(c)));
}

/// What an engine call with a completion callback produces: a decision
/// (`acquire_or_notify`, `acquire_wait_or_notify`), a reservation
/// (`reserve_or_notify`) or a permit (`acquire_concurrent_or_notify`).
trait Outcome: Sized + Send + 'static {
    fn completion(r: std::result::Result<Self, QlError>) -> Completion;
}

impl Outcome for Decision {
    fn completion(r: std::result::Result<Self, QlError>) -> Completion {
        Completion::Decided(r)
    }
}

impl Outcome for Reservation {
    fn completion(r: std::result::Result<Self, QlError>) -> Completion {
        Completion::Reserved(r)
    }
}

impl Outcome for Permit {
    fn completion(r: std::result::Result<Self, QlError>) -> Completion {
        Completion::Permitted(r)
    }
}

/// Meeting point of a JS thread that may create a promise and a broker
/// thread that may already have the answer: whoever comes second settles.
enum Meet<T> {
    Empty,
    Waiting(Deferred),
    Ready(std::result::Result<T, QlError>),
}

/// Owned by the engine's completion callback. If the engine drops the
/// callback without calling it (the limiter closed while a lease request was
/// in flight), the promise still settles, with `ERR_QUOTALEASE_CLOSED`: an
/// unsettled deferred would keep the event loop alive forever.
struct Notifier<T: Outcome> {
    meet: Arc<Mutex<Meet<T>>>,
    fired: bool,
}

impl<T: Outcome> Notifier<T> {
    /// A meeting point and the notifier that reports to it.
    fn pair() -> (Arc<Mutex<Meet<T>>>, Self) {
        let meet = Arc::new(Mutex::new(Meet::Empty));
        let n = Notifier {
            meet: meet.clone(),
            fired: false,
        };
        (meet, n)
    }

    fn fire(&mut self, r: std::result::Result<T, QlError>) {
        self.fired = true;
        let mut g = self.meet.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Meet::Empty) {
            Meet::Waiting(d) => {
                drop(g);
                settle(d, T::completion(r));
            }
            _ => *g = Meet::Ready(r),
        }
    }
}

/// The Promise of an engine call with a completion callback: `start` makes
/// the call with a notifier; settled at once when it decided without
/// waiting (or the broker answered before the promise was stored), else
/// from the broker thread.
fn promise_of<'e, T: Outcome>(
    env: &'e Env,
    start: impl FnOnce(Notifier<T>) -> std::result::Result<Option<T>, QlError>,
) -> Result<Object<'e>, String> {
    let napi = |e: napi::Error| bad(ErrorKind::Backend, e.reason.clone());
    let (deferred, promise): (Deferred, Object<'e>) = env.create_deferred().map_err(napi)?;
    let (meet, notifier) = Notifier::<T>::pair();
    let r = match start(notifier) {
        Ok(Some(v)) => Ok(v),
        Err(e) => Err(e),
        Ok(None) => {
            let mut g = meet.lock().unwrap_or_else(|p| p.into_inner());
            match std::mem::replace(&mut *g, Meet::Empty) {
                Meet::Ready(r) => r,
                _ => {
                    *g = Meet::Waiting(deferred);
                    return Ok(promise);
                }
            }
        }
    };
    settle(deferred, T::completion(r));
    Ok(promise)
}

impl<T: Outcome> Drop for Notifier<T> {
    fn drop(&mut self) {
        if !self.fired {
            self.fire(Err(QlError::Closed));
        }
    }
}

/// The engine's limiter, as the wrapper sees it.
#[napi]
pub struct NativeLimiter {
    inner: Arc<Limiter>,
    shared: Arc<fast::Shared>,
    events: Arc<Mutex<Option<EventFn>>>,
}

impl NativeLimiter {
    fn drop_events(&self) {
        let taken = self.events.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(taken);
    }

    /// Run `f` on a new thread and settle a promise with its result.
    fn in_background<'e>(
        &self,
        env: &'e Env,
        f: impl FnOnce(&Limiter) -> Completion + Send + 'static,
    ) -> Result<Object<'e>> {
        let (deferred, promise): (Deferred, Object<'e>) = env.create_deferred()?;
        let inner = self.inner.clone();
        std::thread::Builder::new()
            .name("quotalease-node".into())
            .spawn(move || settle(deferred, f(&inner)))
            .map_err(|e| napi::Error::from_reason(format!("cannot start a thread: {e}")))?;
        Ok(promise)
    }
}

#[napi]
impl NativeLimiter {
    /// `names[i]` is an option (as in `LimiterOptions`, or snake_case) and
    /// `values[i]` its value. `scratch`: a `Float64Array` of at least 20
    /// elements the wrapper reads decisions from. `onEvent(kind, message)` is
    /// called on backend transitions.
    #[napi(constructor)]
    pub fn new(
        names: Vec<String>,
        #[napi(ts_arg_type = "Array<number | string | boolean | undefined | null>")] values: Vec<NativeValue>,
        scratch: Float64Array,
        on_event: Option<Function<'_, FnArgs<(String, String)>, ()>>,
    ) -> Result<Self, String> {
        if scratch.len() < SCRATCH_LEN {
            return Err(bad(
                ErrorKind::Config,
                format!("scratch must hold at least {SCRATCH_LEN} numbers"),
            ));
        }
        let opts = options_from(names, values)?;
        let inner = Arc::new(Limiter::from_options(opts).map_err(js_err)?);
        // Node has no bridge from the engine's `tracing` logs: one stderr
        // line per backend transition, unless QUOTALEASE_STDERR_LOG=0.
        // Registered first, so the line is written before the event is
        // queued for JavaScript.
        inner.log_events_to_stderr();
        let events: Arc<Mutex<Option<EventFn>>> = Arc::new(Mutex::new(None));
        if let Some(f) = on_event {
            let tsfn: EventFn = f
                .build_threadsafe_function::<FnArgs<(String, String)>>()
                .callee_handled::<false>()
                .weak::<true>()
                .build()
                .map_err(|e| bad(ErrorKind::Config, e.reason.clone()))?;
            *events.lock().unwrap_or_else(|p| p.into_inner()) = Some(tsfn);
            let slot = events.clone();
            inner.on_event(move |ev: &Event| {
                if let Some(t) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    t.call(
                        FnArgs::from((ev.kind.as_str().to_string(), ev.message.clone())),
                        ThreadsafeFunctionCallMode::NonBlocking,
                    );
                }
            });
        }
        let shared = Arc::new(fast::Shared::new(inner.clone(), scratch));
        Ok(NativeLimiter { inner, shared, events })
    }

    /// `{ acquire, tryAcquire, acquireAsync, reserve, reserveAsync }`: the
    /// per-request calls as raw N-API functions bound to this limiter (see
    /// `fast.rs`). Each takes `(key: string, cost?: number, tier?: string)`
    /// (cost 1 when omitted or `undefined`; no tier when omitted,
    /// `undefined` or `null`). The acquires write the decision into the
    /// scratch array and return `undefined`; `acquireAsync` returns a
    /// Promise of `[code, limit, remaining, retryAfterMs, resetAfterMs,
    /// windowMs, rule, rule count, each rule's limit, windowMs and calendar
    /// code]` (or an
    /// Error) instead when it must wait for the backend. `reserve` returns a
    /// `NativeReservation` (the cost is its estimate); `reserveAsync` too, or
    /// a Promise of one (or an Error) when it must wait for the backend.
    #[napi(
        ts_return_type = "{ acquire(key: string, cost?: number, tier?: string | null): void; tryAcquire(key: string, cost?: number, tier?: string | null): void; acquireAsync(key: string, cost?: number, tier?: string | null): undefined | Promise<number[] | Error>; reserve(key: string, estimate: number, tier?: string | null): NativeReservation; reserveAsync(key: string, estimate: number, tier?: string | null): NativeReservation | Promise<NativeReservation | Error> }"
    )]
    pub fn hot_path<'e>(&self, env: &'e Env) -> Result<Unknown<'e>> {
        let v = fast::functions(env, &self.shared)?;
        // SAFETY: `v` is a live object created in this callback's scope.
        Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), v) })
    }

    /// Override the limit of one key.
    #[napi]
    pub fn set_limit(&self, key: String, limit: f64, window_ms: f64) -> Result<(), String> {
        let limit = whole(limit, ErrorKind::Config, "limit")?;
        let window_ms = whole(window_ms, ErrorKind::Config, "windowMs")?;
        self.inner.set_limit(&key, limit, window_ms).map_err(js_err)
    }

    /// Every metric by its name in docs/design.md (snake_case, as in Prometheus).
    #[napi(ts_return_type = "Record<string, number>")]
    pub fn metrics<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let mut o = Object::new(env)?;
        for (name, _, _, v) in self.inner.metrics().fields() {
            o.set(name, v as f64)?;
        }
        Ok(o)
    }

    /// The metrics in Prometheus text format, prefixed `quotalease_`, with
    /// the labels `names[i]` = `values[i]` on every sample.
    #[napi]
    pub fn metrics_prometheus(&self, names: Vec<String>, values: Vec<String>) -> Result<String, String> {
        let labels = label_pairs(&names, &values)?;
        self.inner.metrics_prometheus_with(&labels).map_err(js_err)
    }

    /// Connect to the backend now and run a read-only probe (`check()` of
    /// every binding), blocking the calling thread.
    #[napi]
    pub fn check_sync(&self) -> Result<(), String> {
        self.inner.check().map_err(js_err)
    }

    /// `check` on a background thread: a Promise of `undefined` or an Error.
    #[napi(ts_return_type = "Promise<undefined | Error>")]
    pub fn check<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.in_background(env, |l| Completion::Done(l.check()))
    }

    /// Give every leased token back (blocks until the backend took them).
    #[napi]
    pub fn flush_sync(&self) -> Result<(), String> {
        self.inner.flush().map_err(js_err)
    }

    /// `flush` on a background thread: a Promise of `undefined` or an Error.
    #[napi(ts_return_type = "Promise<undefined | Error>")]
    pub fn flush<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.in_background(env, |l| Completion::Done(l.flush()))
    }

    /// Flush, stop the broker, release the event callback. Idempotent.
    #[napi]
    pub fn close_sync(&self) -> Result<(), String> {
        let r = self.inner.close().map_err(js_err);
        self.drop_events();
        r
    }

    /// `close` on a background thread: a Promise of `undefined` or an Error.
    #[napi(ts_return_type = "Promise<undefined | Error>")]
    pub fn close<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let events = self.events.clone();
        self.in_background(env, move |l| {
            let r = l.close();
            let taken = events.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(taken);
            Completion::Done(r)
        })
    }

    /// Tests with a manual clock: move the clock forward.
    #[napi]
    pub fn advance_clock(&self, ms: f64) -> Result<(), String> {
        let ms = whole(ms, ErrorKind::Config, "ms")?;
        self.inner.advance_clock(ms).map_err(js_err)
    }

    /// Tests: run lease-TTL maintenance, then wait until no backend request
    /// is in flight (at most 10 s). Blocks the calling thread.
    #[napi]
    pub fn settle(&self) -> Result<(), String> {
        self.inner.settle().map_err(js_err)
    }

    /// What the limiter and the authority know about `key`.
    #[napi(ts_return_type = "Record<string, number | boolean | string | null>")]
    pub fn inspect<'e>(&self, env: &'e Env, key: String) -> Result<Object<'e>, String> {
        let i = self.inner.inspect(&key).map_err(js_err)?;
        let napi = |e: napi::Error| bad(ErrorKind::Backend, e.reason.clone());
        let mut o = Object::new(env).map_err(napi)?;
        let n = |v: Option<u64>| v.map(|x| x as f64);
        o.set("limit", i.limit as f64).map_err(napi)?;
        o.set("windowMs", i.window_ms as f64).map_err(napi)?;
        o.set("authorityTokens", n(i.authority_tokens)).map_err(napi)?;
        o.set("authorityRefilledAtMs", n(i.authority_refilled_at_ms))
            .map_err(napi)?;
        o.set("authorityTtlMs", n(i.authority_ttl_ms)).map_err(napi)?;
        o.set("localTokens", i.local_tokens as f64).map_err(napi)?;
        o.set("leaseInFlight", i.lease_in_flight).map_err(napi)?;
        o.set("exhaustedForMs", i.exhausted_for_ms as f64).map_err(napi)?;
        o.set("admitted", i.admitted as f64).map_err(napi)?;
        o.set("denied", i.denied as f64).map_err(napi)?;
        o.set("ratePerWindow", i.rate_per_window as f64).map_err(napi)?;
        o.set("holders", i.holders as f64).map_err(napi)?;
        o.set("fallbackPerWindow", i.fallback_per_window as f64).map_err(napi)?;
        o.set("demandPerS", i.demand_per_s as f64).map_err(napi)?;
        o.set("rules", i.rules).map_err(napi)?;
        o.set("tier", i.tier).map_err(napi)?;
        o.set("policySource", i.policy_source).map_err(napi)?;
        Ok(o)
    }

    /// The rules `key` is held to on a call naming `tier` (none: `null`),
    /// and why: `{ rules: [{ limit, windowMs }], tier, assignedBy,
    /// definedBy, source }`. Reads what this limiter knows (no backend call).
    #[napi(
        ts_return_type = "{ rules: Array<{ limit: number; windowMs: number }>; tier: string | null; assignedBy: string; definedBy: string; source: string }"
    )]
    pub fn policy<'e>(&self, env: &'e Env, key: String, tier: Option<String>) -> Result<Object<'e>, String> {
        let (rules, src) = self.inner.policy(&key, tier.as_deref()).map_err(js_err)?;
        policy_value(env, &rules, &src).map_err(|e| bad(ErrorKind::Backend, e.reason.clone()))
    }

    /// Every tier this limiter knows now, by name: `[{ name, rules, definedBy }]`.
    #[napi(
        ts_return_type = "Array<{ name: string; rules: Array<{ limit: number; windowMs: number }>; definedBy: string }>"
    )]
    pub fn tiers<'e>(&self, env: &'e Env) -> Result<Array<'e>> {
        let list = self.inner.tiers();
        let mut a = env.create_array(list.len() as u32)?;
        for (i, (name, rules, origin)) in list.iter().enumerate() {
            let mut o = Object::new(env)?;
            o.set("name", name.as_str())?;
            o.set("rules", rules_value(env, rules)?)?;
            o.set("definedBy", origin.as_str())?;
            a.set(i as u32, o)?;
        }
        Ok(a)
    }

    /// `policy_set_tier` on a background thread: a Promise of the store's
    /// version or an Error.
    #[napi(ts_return_type = "Promise<number | Error>")]
    pub fn policy_set_tier<'e>(&self, env: &'e Env, name: String, rules: String) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Version(l.policy_set_tier(&name, &rules)))
    }

    /// `policy_delete_tier` on a background thread: a Promise of the store's
    /// version or an Error.
    #[napi(ts_return_type = "Promise<number | Error>")]
    pub fn policy_delete_tier<'e>(&self, env: &'e Env, name: String) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Version(l.policy_delete_tier(&name)))
    }

    /// `acquire` waiting up to `waitMs` for the tokens (`acquire_wait`): a
    /// Promise of the decision's numbers or an Error, settled from the
    /// broker thread; the event loop never blocks.
    #[napi(ts_return_type = "Promise<Array<number> | Error>")]
    pub fn acquire_wait<'e>(
        &self,
        env: &'e Env,
        key: String,
        cost: f64,
        tier: Option<String>,
        wait_ms: f64,
    ) -> Result<Object<'e>, String> {
        let cost = whole(cost, ErrorKind::InvalidCost, "cost")?;
        let wait_ms = whole(wait_ms, ErrorKind::Config, "waitMs")?;
        let wait = std::time::Duration::from_millis(wait_ms);
        promise_of(env, |mut n: Notifier<Decision>| {
            self.inner
                .acquire_wait_or_notify(&key, cost, tier.as_deref(), wait, move |r| n.fire(r))
        })
    }

    /// Take a permit for one request of `key` in flight (the limiter's
    /// `concurrency`), blocking the calling thread for a lease call when
    /// the key has no local lease of permits (at most `backendTimeoutMs`).
    #[napi]
    pub fn acquire_concurrent_sync(&self, key: String, tier: Option<String>) -> Result<NativePermit, String> {
        self.inner
            .acquire_concurrent(&key, tier.as_deref())
            .map(|p| NativePermit { inner: p })
            .map_err(js_err)
    }

    /// `acquire_concurrent_sync` without blocking (`acquire_concurrent_or_notify`):
    /// a Promise of a `NativePermit` or an Error, settled at once when
    /// decided without waiting, else from the broker thread.
    #[napi(ts_return_type = "Promise<NativePermit | Error>")]
    pub fn acquire_concurrent<'e>(
        &self,
        env: &'e Env,
        key: String,
        tier: Option<String>,
    ) -> Result<Object<'e>, String> {
        promise_of(env, |mut n: Notifier<Permit>| {
            self.inner
                .acquire_concurrent_or_notify(&key, tier.as_deref(), move |r| n.fire(r))
        })
    }

    /// How many requests of `key` wait in `acquire_wait` in this process now.
    #[napi]
    pub fn waiters(&self, key: String) -> u32 {
        self.inner.waiters(&key) as u32
    }

    /// `policy_assign` on a background thread: a Promise of the store's
    /// version or an Error.
    #[napi(ts_return_type = "Promise<number | Error>")]
    pub fn policy_assign<'e>(&self, env: &'e Env, key: String, assignment: String) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Version(l.policy_assign(&key, &assignment)))
    }

    /// `policy_unassign` on a background thread: a Promise of the store's
    /// version or an Error.
    #[napi(ts_return_type = "Promise<number | Error>")]
    pub fn policy_unassign<'e>(&self, env: &'e Env, key: String) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Version(l.policy_unassign(&key)))
    }

    /// `policy_get` on a background thread: a Promise of the key's stored
    /// entry (`null`: none) or an Error.
    #[napi(ts_return_type = "Promise<string | null | Error>")]
    pub fn policy_get<'e>(&self, env: &'e Env, key: String) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Entry(l.policy_get(&key)))
    }

    /// `policy_list` on a background thread: a Promise of `{ version, tiers:
    /// [{ name, rules }], keys: [{ key, assignment }] }` or an Error.
    #[napi(
        ts_return_type = "Promise<{ version: number; tiers: Array<{ name: string; rules: string }>; keys: Array<{ key: string; assignment: string }> } | Error>"
    )]
    pub fn policy_list<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Listing(l.policy_list()))
    }

    /// `refresh_policies` on a background thread: a Promise of `undefined`
    /// or an Error.
    #[napi(ts_return_type = "Promise<undefined | Error>")]
    pub fn refresh_policies<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.in_background(env, move |l| Completion::Done(l.refresh_policies()))
    }

    /// Tokens per lease request, after defaults.
    #[napi(getter)]
    pub fn lease_size(&self) -> f64 {
        self.inner.lease_size() as f64
    }

    /// What `util.inspect` and `toString` show: the main options, with the
    /// URL's credentials replaced by `***` (the core's rule).
    #[napi(ts_return_type = "{ url: string; limit: number; windowMs: number; leaseSize: number; mode: string }")]
    pub fn summary<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let c = self.inner.config();
        let mut o = Object::new(env)?;
        o.set("url", quotalease::redact_url(&c.url))?;
        o.set("limit", c.limit as f64)?;
        o.set("windowMs", c.window_ms as f64)?;
        o.set("leaseSize", self.inner.lease_size() as f64)?;
        o.set("mode", c.mode.as_str())?;
        Ok(o)
    }
}

/// The engine's `Reservation`: a request admitted (or denied) at an
/// estimate of its cost, to be settled once at its actual cost. Made by
/// `reserve` / `reserveAsync` of `hotPath()`, never by `new`. Collected
/// unsettled, it keeps its estimate (the engine's `Drop`).
#[napi]
pub struct NativeReservation {
    inner: Reservation,
}

#[napi]
impl NativeReservation {
    /// The decision on the estimate as numbers: `[code, limit, remaining,
    /// retryAfterMs, resetAfterMs, windowMs, rule, rule count, each rule's
    /// limit, windowMs and calendar code]`.
    #[napi]
    pub fn decision(&self) -> Vec<f64> {
        decision_numbers(&self.inner.decision())
    }

    /// The key reserved on.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.inner.key().to_owned()
    }

    /// The tokens reserved.
    #[napi(getter)]
    pub fn estimate(&self) -> f64 {
        self.inner.estimate() as f64
    }

    /// Whether `settle` was called (successfully or not).
    #[napi(getter)]
    pub fn settled(&self) -> bool {
        self.inner.is_settled()
    }

    /// Settle at `actual` tokens (the wrapper checked it is a number). A
    /// number that is not a whole number of tokens, 0 or more, throws a
    /// `RangeError` with the engine's message (`Reservation::negative_actual`
    /// for a negative integer) and leaves the reservation unsettled; the
    /// engine's errors (settled already, denied, closed) are thrown with
    /// their codes.
    #[napi]
    pub fn settle(&self, env: &Env, actual: f64) -> Result<(), String> {
        if actual.is_finite() && (0.0..=MAX_SAFE).contains(&actual) && actual.fract() == 0.0 {
            return self.inner.settle(actual as u64).map_err(js_err);
        }
        let e = if (-MAX_SAFE..0.0).contains(&actual) && actual.fract() == 0.0 {
            Reservation::negative_actual(actual as i128)
        } else {
            // As JavaScript prints it: `Infinity`, not Rust's `inf`.
            let shown = match actual {
                f64::INFINITY => "Infinity".to_string(),
                f64::NEG_INFINITY => "-Infinity".to_string(),
                v => v.to_string(),
            };
            QlError::Reservation(format!("actual must be a whole number of tokens, 0 or more (got {shown})").into())
        };
        env.throw_range_error(&e.to_string(), Some(code_str(e.kind())))
            .map_err(|t| bad(ErrorKind::Backend, t.reason.clone()))
    }
}

/// The engine's `Permit`: one of a key's requests in flight, admitted (or
/// denied) under the limiter's `concurrency`. Made by `acquireConcurrent` /
/// `acquireConcurrentSync`, never by `new`. Collected unreleased, an
/// admitted permit is released (the engine's `Drop`).
#[napi]
pub struct NativePermit {
    inner: Permit,
}

#[napi]
impl NativePermit {
    /// The decision as numbers, as `NativeReservation.decision` gives them
    /// (`limit` is the concurrency, `remaining` the permits left).
    #[napi]
    pub fn decision(&self) -> Vec<f64> {
        decision_numbers(&self.inner.decision())
    }

    /// The key the permit is for.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.inner.key().to_owned()
    }

    /// Whether `release` was called.
    #[napi(getter)]
    pub fn released(&self) -> bool {
        self.inner.is_released()
    }

    /// Release the permit, once: the engine's errors (released already,
    /// denied, closed) are thrown with their codes.
    #[napi]
    pub fn release(&self) -> Result<(), String> {
        self.inner.release().map_err(js_err)
    }
}

/// HTTP headers for a decision (IETF RateLimit / RateLimit-Policy, plus
/// Retry-After when denied), computed by the engine. `rules`: every rule's
/// limit and windowMs in turn (none: the one rule `limit` per `windowMs`);
/// `rule`: the binding rule's index in them (default 0); `reason`: the
/// decision's reason by name (none or an unknown name: `lease`);
/// `calendars`: each rule's calendar as a rule writes it after its `/`
/// (`'month@Europe/Berlin'`; `''` for a token bucket), so a calendar quota
/// among several is named by its period (`"1month"`).
#[napi(ts_return_type = "Record<string, string>")]
#[allow(clippy::too_many_arguments)]
pub fn decision_headers<'e>(
    env: &'e Env,
    allowed: bool,
    limit: f64,
    remaining: f64,
    retry_after_ms: f64,
    reset_after_ms: f64,
    window_ms: f64,
    rule: Option<f64>,
    rules: Option<Vec<f64>>,
    reason: Option<String>,
    calendars: Option<Vec<String>>,
) -> Result<Object<'e>, String> {
    let n = |v: f64, what: &str| whole(v, ErrorKind::Config, what);
    let reason = Reason::ALL
        .into_iter()
        .find(|r| Some(r.as_str()) == reason.as_deref())
        .unwrap_or(Reason::Lease);
    let d = Decision::single(
        allowed,
        n(limit, "limit")?,
        n(remaining, "remaining")?,
        n(retry_after_ms, "retryAfterMs")?,
        n(reset_after_ms, "resetAfterMs")?,
        n(window_ms, "windowMs")?,
        reason,
    );
    let rules = if let Some(flat) = rules {
        if flat.len() % 2 != 0 {
            return Err(bad(ErrorKind::Config, "rules must be pairs of limit and windowMs"));
        }
        let calendars = calendars.unwrap_or_default();
        if !calendars.is_empty() && calendars.len() != flat.len() / 2 {
            return Err(bad(ErrorKind::Config, "calendars: one for each rule"));
        }
        let mut list = Vec::with_capacity(flat.len() / 2);
        for (i, pair) in flat.chunks(2).enumerate() {
            let (limit, window_ms) = (n(pair[0], "rules[].limit")?, n(pair[1], "rules[].windowMs")?);
            list.push(match calendars.get(i).filter(|c| !c.is_empty()) {
                None => Quota::new(limit, window_ms),
                Some(c) => {
                    let q = quotalease::parse_quota(&format!("{limit}/{c}")).map_err(js_err)?;
                    if q.calendar.spec().is_none() || q.window_ms != window_ms {
                        return Err(bad(
                            ErrorKind::Config,
                            format!("rules[{i}]: calendar {c:?} is not a calendar period of windowMs {window_ms}"),
                        ));
                    }
                    q
                }
            });
        }
        Rules::new(&list, "rules").map_err(js_err)?
    } else {
        d.rules()
    };
    let r = match rule {
        Some(r) => n(r, "rule")?,
        None => 0,
    };
    if r as usize >= rules.len() {
        return Err(bad(
            ErrorKind::Config,
            format!("`rule` is {r}, but the decision has {} rule(s)", rules.len()),
        ));
    }
    let d = d.with_rules(&rules, r as u8);
    let napi = |e: napi::Error| bad(ErrorKind::Config, e.reason.clone());
    let mut o = Object::new(env).map_err(napi)?;
    for (name, value) in d.headers() {
        o.set(name, value).map_err(napi)?;
    }
    Ok(o)
}

/// Label pairs from parallel name and value arrays.
fn label_pairs<'a>(names: &'a [String], values: &'a [String]) -> JsResult<Vec<(&'a str, &'a str)>> {
    if names.len() != values.len() {
        return Err(bad(ErrorKind::Config, "labels: as many names as values"));
    }
    Ok(names
        .iter()
        .map(String::as_str)
        .zip(values.iter().map(String::as_str))
        .collect())
}

/// Several limiters' metrics in ONE Prometheus exposition (each family's
/// HELP and TYPE once): limiter `i` with the labels `names[i][j]` =
/// `values[i][j]`.
#[napi]
pub fn metrics_prometheus_many(
    limiters: Vec<ClassInstance<'_, NativeLimiter>>,
    names: Vec<Vec<String>>,
    values: Vec<Vec<String>>,
) -> Result<String, String> {
    if names.len() != limiters.len() || values.len() != limiters.len() {
        return Err(bad(ErrorKind::Config, "labels: one label set per limiter"));
    }
    let mut sets = Vec::with_capacity(limiters.len());
    for (n, v) in names.iter().zip(&values) {
        sets.push(label_pairs(n, v)?);
    }
    let pairs: Vec<(&Limiter, &[(&str, &str)])> = limiters
        .iter()
        .zip(&sets)
        .map(|(l, s)| (&*l.inner, s.as_slice()))
        .collect();
    quotalease::metrics_prometheus(&pairs).map_err(js_err)
}

/// `[limit, windowMs]` from a rate such as `"600/min"`.
#[napi]
pub fn parse_rate(rate: String) -> Result<Vec<f64>, String> {
    let (limit, window_ms) = quotalease::parse_rate(&rate).map_err(js_err)?;
    Ok(vec![limit as f64, window_ms as f64])
}

/// The JS type option `name` takes, `'number'`, `'string'` or `'boolean'`
/// (asked of the core); an unknown name throws the core's error with its
/// suggestion.
#[napi(ts_return_type = "'number' | 'string' | 'boolean'")]
pub fn option_type(name: String) -> Result<&'static str, String> {
    if Options::new().set(&name, OptionValue::Bool(false)).is_ok() {
        return Ok("boolean");
    }
    match Options::new().set(&name, OptionValue::Int(0)) {
        Ok(_) => Ok("number"),
        Err(e @ QlError::UnknownOption { .. }) => Err(js_err(e)),
        Err(_) => Ok("string"),
    }
}

/// Every reason's name, indexed by its code (`Reason as u8`).
#[napi]
pub fn reasons() -> Vec<&'static str> {
    Reason::ALL.iter().map(Reason::as_str).collect()
}

/// `{ CONFIG: 'ERR_QUOTALEASE_CONFIG', ... }`: the `code` of every error
/// kind, keyed by the kind's name in capitals.
#[napi(ts_return_type = "Record<string, string>")]
pub fn error_codes(env: &Env) -> Result<Object<'_>> {
    let mut o = Object::new(env)?;
    for kind in ErrorKind::ALL {
        o.set(kind.as_str().to_ascii_uppercase(), code_str(kind))?;
    }
    Ok(o)
}

/// The limiter key an HTTP middleware uses for `raw` (a header, an
/// address): `raw` when it fits in 512 UTF-8 bytes, else `"sha256:"` and the
/// 64 hex digits of its SHA-256, so an over-long key is limited, never an
/// error (the core's rule, the same in every language).
#[napi]
pub fn http_key(raw: String) -> String {
    match quotalease::http_key(&raw) {
        std::borrow::Cow::Borrowed(_) => raw,
        std::borrow::Cow::Owned(hashed) => hashed,
    }
}

/// `url` as the engine prints it everywhere: user name and password (and
/// any other part that can hold a secret) replaced by `***`, hosts, ports
/// and the database kept (the core's rule, the same in every language).
#[napi]
pub fn redact_url(url: String) -> String {
    quotalease::redact_url(&url)
}

/// The engine's version (Cargo.toml).
#[napi]
pub fn engine_version() -> &'static str {
    quotalease::VERSION
}
