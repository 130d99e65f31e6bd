//! The native half of the npm package `quotalease`: a thin napi-rs
//! translation of the Rust engine. The JavaScript wrapper (`index.js`) owns
//! argument checking, option names and the `Decision` objects; this crate
//! turns JS values into engine calls and engine results into JS values.
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
#![deny(clippy::all)]

mod fast;

use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use quotalease::{ClockKind, Config, Decision, Error as QlError, ErrorKind, Event, Limiter, Reason};

/// Errors thrown to JavaScript carry one of these as `code`.
fn code_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Config => "ERR_QUOTALEASE_CONFIG",
        ErrorKind::InvalidKey => "ERR_QUOTALEASE_INVALID_KEY",
        ErrorKind::InvalidCost => "ERR_QUOTALEASE_INVALID_COST",
        ErrorKind::Closed => "ERR_QUOTALEASE_CLOSED",
        ErrorKind::Backend => "ERR_QUOTALEASE_BACKEND",
    }
}

type JsResult<T> = std::result::Result<T, napi::Error<String>>;

fn js_err(e: QlError) -> napi::Error<String> {
    napi::Error::new(code_of(e.kind()).to_string(), e.to_string())
}

fn bad(code: &str, msg: impl Into<String>) -> napi::Error<String> {
    napi::Error::new(code.to_string(), msg.into())
}

/// Largest integer a JS number holds exactly.
pub(crate) const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

/// A JS number that must be a whole number in 0..=2^53-1.
fn whole(v: f64, code: &str, what: &str) -> JsResult<u64> {
    if v.is_finite() && (0.0..=MAX_SAFE).contains(&v) && v.fract() == 0.0 {
        Ok(v as u64)
    } else {
        Err(bad(code, format!("`{what}` must be a whole number >= 0 (got {v})")))
    }
}

/// Keys longer than this many UTF-8 bytes are rejected by the engine anyway;
/// the buffer leaves room to tell "too long" from "fits".
pub(crate) const KEY_BUF: usize = 1024;

/// Numbers in the scratch array: limit, remaining, retryAfterMs,
/// resetAfterMs, windowMs, and `reason | allowed << 3`.
pub(crate) const SCRATCH_LEN: usize = 6;

/// `reason | allowed << 3`: what the wrapper needs besides the numbers.
#[inline]
fn code_of_decision(d: &Decision) -> u32 {
    let reason = match d.reason {
        Reason::Lease => 0,
        Reason::Exhausted => 1,
        Reason::Fallback => 2,
        Reason::Pending => 3,
        Reason::Exact => 4,
        Reason::Local => 5,
    };
    reason | ((d.allowed as u32) << 3)
}

/// Options as the wrapper passes them: already type-checked, names in
/// camelCase, every number a whole JS number.
#[napi(object)]
pub struct NativeOptions {
    pub url: Option<String>,
    pub limit: Option<f64>,
    pub window_ms: Option<f64>,
    pub rate: Option<String>,
    pub lease_size: Option<f64>,
    pub refill_threshold: Option<f64>,
    pub lease_ttl_ms: Option<f64>,
    pub on_backend_failure: Option<String>,
    pub expected_replicas: Option<f64>,
    pub backend_timeout_ms: Option<f64>,
    pub key_prefix: Option<String>,
    pub max_keys: Option<f64>,
    pub mode: Option<String>,
    /// `None`: the system clock; `Some(start)`: a manual clock at `start` ms.
    pub manual_clock_start_ms: Option<f64>,
}

fn opt(v: Option<f64>, name: &str) -> JsResult<Option<u64>> {
    v.map(|x| whole(x, "ERR_QUOTALEASE_CONFIG", name)).transpose()
}

fn config_from(o: NativeOptions) -> JsResult<Config> {
    let mut c = Config::default();
    if let Some(u) = o.url {
        c.url = u;
    }
    if let Some(r) = o.rate.as_deref() {
        if o.limit.is_some() || o.window_ms.is_some() {
            return Err(bad(
                "ERR_QUOTALEASE_CONFIG",
                "invalid configuration: give either `rate` or `limit`/`windowMs`, not both",
            ));
        }
        let (limit, window_ms) = quotalease::parse_rate(r).map_err(js_err)?;
        c.limit = limit;
        c.window_ms = window_ms;
    }
    if let Some(v) = opt(o.limit, "limit")? {
        c.limit = v;
    }
    if let Some(v) = opt(o.window_ms, "windowMs")? {
        c.window_ms = v;
    }
    c.lease_size = opt(o.lease_size, "leaseSize")?;
    c.refill_threshold = opt(o.refill_threshold, "refillThreshold")?;
    if let Some(v) = opt(o.lease_ttl_ms, "leaseTtlMs")? {
        c.lease_ttl_ms = v;
    }
    if let Some(s) = o.on_backend_failure {
        c.on_backend_failure = s.parse().map_err(js_err)?;
    }
    if let Some(v) = opt(o.expected_replicas, "expectedReplicas")? {
        c.expected_replicas = v;
    }
    if let Some(v) = opt(o.backend_timeout_ms, "backendTimeoutMs")? {
        c.backend_timeout_ms = v;
    }
    if let Some(p) = o.key_prefix {
        c.key_prefix = p;
    }
    if let Some(v) = opt(o.max_keys, "maxKeys")? {
        c.max_keys = usize::try_from(v).unwrap_or(usize::MAX);
    }
    if let Some(m) = o.mode {
        c.mode = m.parse().map_err(js_err)?;
    }
    if let Some(start_ms) = opt(o.manual_clock_start_ms, "clock.manualStartMs")? {
        c.clock = ClockKind::Manual { start_ms };
    }
    Ok(c)
}

/// Events reach JS through a weak (unref'd) threadsafe function: it never
/// keeps the process alive. Taken out (released) by `close`.
type EventFn = ThreadsafeFunction<FnArgs<(String, String)>, (), FnArgs<(String, String)>, Status, false, true>;

/// The outcome of an asynchronous call, turned into a JS value on the JS
/// thread: a decision as `[code, limit, remaining, retryAfterMs,
/// resetAfterMs, windowMs]`, `undefined` for calls without a result, or an
/// `Error` with a `code` (resolved, not rejected, so it keeps its code; the
/// wrapper throws it).
enum Completion {
    Decided(std::result::Result<Decision, QlError>),
    Done(std::result::Result<(), QlError>),
}

impl ToNapiValue for Completion {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        let err = match val {
            Completion::Decided(Ok(d)) => {
                let v = vec![
                    code_of_decision(&d) as f64,
                    d.limit as f64,
                    d.remaining as f64,
                    d.retry_after_ms as f64,
                    d.reset_after_ms as f64,
                    d.window_ms as f64,
                ];
                return unsafe { Vec::<f64>::to_napi_value(env, v) };
            }
            Completion::Done(Ok(())) => return unsafe { <()>::to_napi_value(env, ()) },
            Completion::Decided(Err(e)) | Completion::Done(Err(e)) => e,
        };
        Ok(unsafe { JsError::from(js_err(err)).into_value(env) })
    }
}

type Resolver = Box<dyn FnOnce(Env) -> Result<Completion> + Send>;
type Deferred = napi::JsDeferred<Completion, Resolver>;

fn settle(d: Deferred, c: Completion) {
    d.resolve(Box::new(move |_| Ok(c)));
}

/// Meeting point of a JS thread that may create a promise and a broker
/// thread that may already have the answer: whoever comes second settles.
enum Meet {
    Empty,
    Waiting(Deferred),
    Ready(std::result::Result<Decision, QlError>),
}

/// Owned by the engine's completion callback. If the engine drops the
/// callback without calling it (the limiter closed while a lease request was
/// in flight), the promise still settles, with `ERR_QUOTALEASE_CLOSED`: an
/// unsettled deferred would keep the event loop alive forever.
struct Notifier {
    meet: Arc<Mutex<Meet>>,
    fired: bool,
}

impl Notifier {
    fn fire(&mut self, r: std::result::Result<Decision, QlError>) {
        self.fired = true;
        let mut g = self.meet.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *g, Meet::Empty) {
            Meet::Waiting(d) => {
                drop(g);
                settle(d, Completion::Decided(r));
            }
            _ => *g = Meet::Ready(r),
        }
    }
}

impl Drop for Notifier {
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
        f: impl FnOnce(&Limiter) -> std::result::Result<(), QlError> + Send + 'static,
    ) -> Result<Object<'e>> {
        let (deferred, promise): (Deferred, Object<'e>) = env.create_deferred()?;
        let inner = self.inner.clone();
        std::thread::Builder::new()
            .name("quotalease-node".into())
            .spawn(move || settle(deferred, Completion::Done(f(&inner))))
            .map_err(|e| napi::Error::from_reason(format!("cannot start a thread: {e}")))?;
        Ok(promise)
    }
}

#[napi]
impl NativeLimiter {
    /// `scratch`: a `Float64Array` of at least 6 elements the wrapper reads
    /// decisions from. `onEvent(kind, message)` is called on backend transitions.
    #[napi(constructor)]
    pub fn new(
        options: NativeOptions,
        scratch: Float64Array,
        on_event: Option<Function<'_, FnArgs<(String, String)>, ()>>,
    ) -> Result<Self, String> {
        if scratch.len() < SCRATCH_LEN {
            return Err(bad("ERR_QUOTALEASE_CONFIG", "scratch must hold at least 6 numbers"));
        }
        let cfg = config_from(options)?;
        let inner = Arc::new(Limiter::new(cfg).map_err(js_err)?);
        let events: Arc<Mutex<Option<EventFn>>> = Arc::new(Mutex::new(None));
        if let Some(f) = on_event {
            let tsfn: EventFn = f
                .build_threadsafe_function::<FnArgs<(String, String)>>()
                .callee_handled::<false>()
                .weak::<true>()
                .build()
                .map_err(|e| bad("ERR_QUOTALEASE_CONFIG", e.reason.clone()))?;
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

    /// `{ acquire, tryAcquire, acquireAsync }`: the per-request calls as raw
    /// N-API functions bound to this limiter (see `fast.rs`). Each takes
    /// `(key: string, cost?: number)` (cost 1 when omitted), writes the
    /// decision into the scratch array and returns `undefined`;
    /// `acquireAsync` returns a Promise of `[code, limit, remaining,
    /// retryAfterMs, resetAfterMs, windowMs]` (or an Error) instead when it
    /// must wait for the backend.
    #[napi(
        ts_return_type = "{ acquire(key: string, cost?: number): void; tryAcquire(key: string, cost?: number): void; acquireAsync(key: string, cost?: number): undefined | Promise<number[] | Error> }"
    )]
    pub fn hot_path<'e>(&self, env: &'e Env) -> Result<Unknown<'e>> {
        let v = fast::functions(env, &self.shared)?;
        // SAFETY: `v` is a live object created in this callback's scope.
        Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), v) })
    }

    /// Override the limit of one key.
    #[napi]
    pub fn set_limit(&self, key: String, limit: f64, window_ms: f64) -> Result<(), String> {
        let limit = whole(limit, "ERR_QUOTALEASE_CONFIG", "limit")?;
        let window_ms = whole(window_ms, "ERR_QUOTALEASE_CONFIG", "windowMs")?;
        self.inner.set_limit(&key, limit, window_ms).map_err(js_err)
    }

    /// Every metric by its DESIGN.md name (snake_case, as in Prometheus).
    #[napi(ts_return_type = "Record<string, number>")]
    pub fn metrics<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let mut o = Object::new(env)?;
        for (name, _, _, v) in self.inner.metrics().fields() {
            o.set(name, v as f64)?;
        }
        Ok(o)
    }

    /// The metrics in Prometheus text format, prefixed `quotalease_`.
    #[napi]
    pub fn metrics_prometheus(&self) -> String {
        self.inner.metrics_prometheus()
    }

    /// Give every leased token back (blocks until the backend took them).
    #[napi]
    pub fn flush_sync(&self) -> Result<(), String> {
        self.inner.flush().map_err(js_err)
    }

    /// `flush` on a background thread: a Promise of `undefined` or an Error.
    #[napi(ts_return_type = "Promise<undefined | Error>")]
    pub fn flush<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        self.in_background(env, |l| l.flush())
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
            r
        })
    }

    /// Tests with a manual clock: move the clock forward.
    #[napi]
    pub fn advance_clock(&self, ms: f64) -> Result<(), String> {
        let ms = whole(ms, "ERR_QUOTALEASE_CONFIG", "ms")?;
        self.inner.advance_clock(ms).map_err(js_err)
    }

    /// Tests: run lease-TTL maintenance, then wait until no backend request
    /// is in flight (at most 10 s). Blocks the calling thread.
    #[napi]
    pub fn settle(&self) -> Result<(), String> {
        self.inner.settle().map_err(js_err)
    }

    /// What the limiter and the authority know about `key`.
    #[napi(ts_return_type = "Record<string, number | boolean | null>")]
    pub fn inspect<'e>(&self, env: &'e Env, key: String) -> Result<Object<'e>, String> {
        let i = self.inner.inspect(&key).map_err(js_err)?;
        let napi = |e: napi::Error| bad("ERR_QUOTALEASE_BACKEND", e.reason.clone());
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
        Ok(o)
    }

    /// Tokens per lease request, after defaults.
    #[napi(getter)]
    pub fn lease_size(&self) -> f64 {
        self.inner.lease_size() as f64
    }
}

/// HTTP headers for a decision (IETF RateLimit / RateLimit-Policy, plus
/// Retry-After when denied), computed by the engine.
#[napi(ts_return_type = "Record<string, string>")]
pub fn decision_headers<'e>(
    env: &'e Env,
    allowed: bool,
    limit: f64,
    remaining: f64,
    retry_after_ms: f64,
    reset_after_ms: f64,
    window_ms: f64,
) -> Result<Object<'e>, String> {
    let n = |v: f64, what: &str| whole(v, "ERR_QUOTALEASE_CONFIG", what);
    let d = Decision {
        allowed,
        limit: n(limit, "limit")?,
        remaining: n(remaining, "remaining")?,
        retry_after_ms: n(retry_after_ms, "retryAfterMs")?,
        reset_after_ms: n(reset_after_ms, "resetAfterMs")?,
        window_ms: n(window_ms, "windowMs")?,
        reason: Reason::Lease,
    };
    let napi = |e: napi::Error| bad("ERR_QUOTALEASE_CONFIG", e.reason.clone());
    let mut o = Object::new(env).map_err(napi)?;
    for (name, value) in d.headers() {
        o.set(name, value).map_err(napi)?;
    }
    Ok(o)
}

/// `[limit, windowMs]` from a rate such as `"600/min"`.
#[napi]
pub fn parse_rate(rate: String) -> Result<Vec<f64>, String> {
    let (limit, window_ms) = quotalease::parse_rate(&rate).map_err(js_err)?;
    Ok(vec![limit as f64, window_ms as f64])
}

/// The engine's version (Cargo.toml).
#[napi]
pub fn engine_version() -> &'static str {
    quotalease::VERSION
}
