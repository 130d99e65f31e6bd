//! The limiter: admit path, cold path, failure policy, maintenance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::broker::{Broker, Job, Reply};
use crate::bucket::{Grant, Policy};
use crate::circuit::{Circuit, Transition};
use crate::config::{validate_key, validate_policy, BackendSpec, ClockKind, Config, FailurePolicy, Mode, Resolved};
use crate::decision::{Decision, Reason};
use crate::entry::Entry;
use crate::error::{Error, Result};
use crate::events::{Event, EventKind, Listener};
use crate::memory::MemoryAuthority;
use crate::metrics::{Counters, Metrics};
use crate::redis_authority::{GiveBackCall, LeaseCall, RedisAuthority};
use crate::{clock::Clock, fork};

/// Entries idle this many lease TTLs (with no tokens) leave the table.
const IDLE_TTLS: u64 = 30;
/// Entries sampled to pick one to evict when the table is full.
const EVICTION_SAMPLE: usize = 16;

/// A distributed rate limiter. Cheap to share (`Arc<Limiter>`): every method
/// takes `&self` and is safe to call from many threads at once.
pub struct Limiter {
    inner: Arc<Inner>,
}

/// What [`Limiter::inspect`] reports for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inspection {
    /// The key's limit.
    pub limit: u64,
    /// The key's window (ms).
    pub window_ms: u64,
    /// Whole tokens stored in the authoritative bucket as of its last refill
    /// (`None`: no bucket stored, which reads as full).
    pub authority_tokens: Option<u64>,
    /// Clock reading (ms) of the bucket's last refill (Redis: Redis `TIME`).
    pub authority_refilled_at_ms: Option<u64>,
    /// Milliseconds until the stored bucket expires (Redis only).
    pub authority_ttl_ms: Option<u64>,
    /// Tokens this limiter holds for the key.
    pub local_tokens: u64,
    /// A lease request is in flight.
    pub lease_in_flight: bool,
    /// Denials stay local for this long (the authority said: empty).
    pub exhausted_for_ms: u64,
    /// Requests admitted / denied on this key by this limiter.
    pub admitted: u64,
    /// Requests denied on this key by this limiter.
    pub denied: u64,
}

/// Builds a [`Limiter`]. Every setter mirrors a [`Config`] field.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    cfg: Config,
    rate_error: Option<Error>,
}

macro_rules! setters {
    ($( $(#[$m:meta])* $name:ident : $ty:ty => |$c:ident, $v:ident| $body:expr ),+ $(,)?) => {
        $( $(#[$m])* pub fn $name(mut self, $v: $ty) -> Self { let $c = &mut self.cfg; $body; self } )+
    };
}

impl Builder {
    setters! {
        /// Backend URL (default `memory://`).
        url: impl Into<String> => |c, v| c.url = v.into(),
        /// Tokens per window (required).
        limit: u64 => |c, v| c.limit = v,
        /// Window in milliseconds (default 60 000).
        window_ms: u64 => |c, v| c.window_ms = v,
        /// Tokens per lease (default 2 % of limit, 1..=20).
        lease_size: u64 => |c, v| c.lease_size = Some(v),
        /// Prefetch below this many local tokens (default lease_size / 4, at least 1).
        refill_threshold: u64 => |c, v| c.refill_threshold = Some(v),
        /// Give back leased tokens unused this long (default 2 000 ms).
        lease_ttl_ms: u64 => |c, v| c.lease_ttl_ms = v,
        /// Failure policy (default static share).
        on_backend_failure: FailurePolicy => |c, v| c.on_backend_failure = v,
        /// Instances sharing a key, for the static share (default 1).
        expected_replicas: u64 => |c, v| c.expected_replicas = v,
        /// Backend round-trip bound (default 250 ms).
        backend_timeout_ms: u64 => |c, v| c.backend_timeout_ms = v,
        /// Redis key prefix (default `ql`).
        key_prefix: impl Into<String> => |c, v| c.key_prefix = v.into(),
        /// Most keys tracked locally (default 100 000).
        max_keys: usize => |c, v| c.max_keys = v,
        /// Coordination mode (default lease).
        mode: Mode => |c, v| c.mode = v,
        /// Clock (default system; manual for deterministic tests).
        clock: ClockKind => |c, v| c.clock = v,
    }

    /// Limit and window from a rate such as `"600/min"`.
    pub fn rate(mut self, rate: &str) -> Self {
        match crate::config::parse_rate(rate) {
            Ok((limit, window_ms)) => {
                self.cfg.limit = limit;
                self.cfg.window_ms = window_ms;
            }
            Err(e) => self.rate_error = Some(e),
        }
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<Limiter> {
        if let Some(e) = self.rate_error {
            return Err(e);
        }
        Limiter::new(self.cfg)
    }
}

enum Backend {
    Memory(Arc<MemoryAuthority>),
    Redis(BackendSpec),
}

/// Wakes callers waiting for a lease request to complete.
#[derive(Default)]
struct Signal {
    gen: Mutex<u64>,
    cv: Condvar,
    notify: tokio::sync::Notify,
}

pub(crate) struct Inner {
    me: std::sync::Weak<Inner>,
    pub(crate) r: Resolved,
    pub(crate) clock: Clock,
    /// Fork generation this limiter's state belongs to; `u64::MAX` once closed.
    gen: AtomicU64,
    closed: AtomicBool,
    table: papaya::HashMap<Box<str>, Arc<Entry>, foldhash::fast::RandomState>,
    overrides: Mutex<HashMap<String, Policy>>,
    backend: Backend,
    /// Static-share buckets while the backend is down.
    fallback: MemoryAuthority,
    circuit: Circuit,
    broker: ArcSwapOption<Broker>,
    counters: Counters,
    /// Jobs queued for the broker and not yet finished.
    pending_jobs: AtomicU64,
    signal: Signal,
    listeners: Mutex<Vec<Listener>>,
}

/// Outcome of one step of the cold path.
enum Step {
    Done(Decision),
    /// A lease request is in flight for this key: wait for it, then step again.
    Wait,
    /// The state changed under us (another thread spent fresh tokens): step again.
    Again,
}

/// How a cold-path caller may wait.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// `acquire` / `acquire_async`: may wait for a lease request.
    Yes,
    /// `try_acquire`: never waits.
    No,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Limiter {
    /// A builder with every default.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Validate `cfg` and build a limiter. Nothing starts until first use:
    /// no thread, no connection.
    pub fn new(cfg: Config) -> Result<Limiter> {
        let r = cfg.resolve()?;
        let backend = match (&r.backend, r.cfg.mode) {
            (_, Mode::Local) => Backend::Memory(MemoryAuthority::open(None)),
            (BackendSpec::Memory(name), _) => Backend::Memory(MemoryAuthority::open(name.as_deref())),
            (spec, _) => Backend::Redis(spec.clone()),
        };
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            clock: Clock::new(r.cfg.clock),
            gen: AtomicU64::new(fork::generation()),
            closed: AtomicBool::new(false),
            // Blocking resizes: an incremental resize left unfinished (no
            // further inserts) makes every later lookup search two tables.
            table: papaya::HashMap::builder()
                .hasher(foldhash::fast::RandomState::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            overrides: Mutex::new(HashMap::new()),
            backend,
            fallback: MemoryAuthority::default(),
            circuit: Circuit::default(),
            broker: ArcSwapOption::empty(),
            counters: Counters::default(),
            pending_jobs: AtomicU64::new(0),
            signal: Signal::default(),
            listeners: Mutex::new(Vec::new()),
            r,
        });
        Ok(Limiter { inner })
    }

    /// Take `cost` tokens for `key`. With local tokens this is a map lookup
    /// and an atomic update; otherwise it waits for a lease request (at most
    /// `backend_timeout_ms`) or applies the failure policy.
    #[inline]
    pub fn acquire(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.inner.admit_local(key, cost)? {
            return Ok(d);
        }
        self.inner.acquire_slow(key, cost, Waiting::Yes)
    }

    /// Like [`acquire`](Self::acquire) but never waits: with no local tokens
    /// and a lease request needed, it starts one and denies with reason `pending`.
    #[inline]
    pub fn try_acquire(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.inner.admit_local(key, cost)? {
            return Ok(d);
        }
        self.inner.acquire_slow(key, cost, Waiting::No)
    }

    /// The hot path alone, for bindings that hold an interpreter lock
    /// (Python's GIL): `Ok(Some(decision))` when local tokens decided (no
    /// wait, no network), `Ok(None)` when the cold path is needed; the
    /// binding then releases its lock and calls [`acquire`](Self::acquire).
    #[inline]
    pub fn acquire_local(&self, key: &str, cost: u64) -> Result<Option<Decision>> {
        self.inner.admit_local(key, cost)
    }

    /// Like [`acquire`](Self::acquire), awaiting the lease request instead of
    /// blocking. Works from any executor: the wait runs on the limiter's own runtime.
    pub async fn acquire_async(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.inner.admit_local(key, cost)? {
            return Ok(d);
        }
        if matches!(self.inner.backend, Backend::Memory(_)) {
            return self.inner.acquire_slow(key, cost, Waiting::Yes);
        }
        let broker = self.inner.broker()?;
        let inner = self.inner.clone();
        let key = key.to_owned();
        broker
            .runtime()
            .spawn(async move { inner.acquire_slow_async(&key, cost).await })
            .await
            .map_err(|_| Error::Closed)?
    }

    /// Callback form of [`acquire_async`](Self::acquire_async), for bindings
    /// with their own event loop (Python asyncio, ...): returns
    /// `Ok(Some(decision))` when decided without waiting (local tokens, the
    /// in-memory authority, a local denial); otherwise `Ok(None)` and `done`
    /// is called once, later, from the broker thread.
    pub fn acquire_or_notify(
        &self,
        key: &str,
        cost: u64,
        done: impl FnOnce(Result<Decision>) + Send + 'static,
    ) -> Result<Option<Decision>> {
        if let Some(d) = self.inner.admit_local(key, cost)? {
            return Ok(Some(d));
        }
        if matches!(self.inner.backend, Backend::Memory(_)) {
            return self.inner.acquire_slow(key, cost, Waiting::Yes).map(Some);
        }
        let broker = self.inner.broker()?;
        let inner = self.inner.clone();
        let key = key.to_owned();
        broker
            .runtime()
            .spawn(async move { done(inner.acquire_slow_async(&key, cost).await) });
        Ok(None)
    }

    /// Override the policy of one key. Takes effect at the next lease; the
    /// authority clamps stored tokens to a lowered limit.
    pub fn set_limit(&self, key: &str, limit: u64, window_ms: u64) -> Result<()> {
        self.inner.check_open()?;
        validate_key(key)?;
        let p = validate_policy(limit, window_ms)?;
        lock(&self.inner.overrides).insert(key.to_owned(), p);
        if let Some(e) = self.inner.table.pin().get(key) {
            e.limit.store(p.limit, Relaxed);
            e.window_ms.store(p.window_ms, Relaxed);
            // The authority's last "empty" was under the old policy.
            e.exhausted_until.store(0, Relaxed);
            // Local tokens above the new limit go back.
            let t = e.tokens.load(Relaxed);
            if t > p.limit {
                let extra = e.tokens.swap(p.limit, AcqRel).saturating_sub(p.limit);
                self.inner.give_back(&e.key, p, extra, false);
            }
        }
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        self.inner.metrics()
    }

    /// The counters in Prometheus text format.
    pub fn metrics_prometheus(&self) -> String {
        self.metrics().prometheus()
    }

    /// Give every leased token back now and wait for the authority to take
    /// them (graceful shutdown). Never rely on it alone: SIGKILL exists; the
    /// lease TTL gives idle tokens back anyway.
    pub fn flush(&self) -> Result<()> {
        self.inner.check_open()?;
        self.inner.flush()
    }

    /// Flush, then stop the broker. Every later call returns [`Error::Closed`].
    /// Idempotent.
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.load(Acquire) {
            return Ok(());
        }
        self.inner.check_fork();
        // Refuse new calls first, so nothing is leased while we give back.
        self.inner.gen.store(u64::MAX, Release);
        self.inner.closed.store(true, Release);
        let flushed = self.inner.flush();
        if let Some(b) = self.inner.broker.swap(None) {
            drop(b);
        }
        self.inner.wake_all();
        flushed
    }

    /// Call `f` on every backend transition (degraded / recovered), from the
    /// broker thread. Transitions are also logged through `tracing`.
    pub fn on_event(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        lock(&self.inner.listeners).push(Arc::new(f));
    }

    /// For deterministic tests with [`ClockKind::Manual`]: move the clock forward.
    pub fn advance_clock(&self, ms: u64) -> Result<()> {
        if self.inner.clock.advance(ms) {
            Ok(())
        } else {
            Err(Error::config("clock", "advance_clock needs clock = manual"))
        }
    }

    /// For deterministic tests: run lease-TTL maintenance now, then wait until
    /// no lease or give-back request is in flight (at most 10 s).
    pub fn settle(&self) -> Result<()> {
        self.inner.check_open()?;
        let now = self.inner.clock.precise();
        self.inner.maintain_at(now);
        self.inner.wait_idle(Duration::from_secs(10))
    }

    /// What the limiter and the authority know about `key` (for "why was
    /// this denied?"). Reads the authority without changing it.
    pub fn inspect(&self, key: &str) -> Result<Inspection> {
        self.inner.check_open()?;
        validate_key(key)?;
        let inner = &self.inner;
        let policy = lock(&inner.overrides)
            .get(key)
            .copied()
            .unwrap_or_else(|| inner.r.policy());
        let now = inner.clock.precise();
        let mut out = Inspection {
            limit: policy.limit,
            window_ms: policy.window_ms,
            ..Inspection::default()
        };
        if let Some(e) = inner.table.pin().get(key) {
            out.local_tokens = e.tokens.load(Relaxed);
            out.lease_in_flight = e.in_flight.load(Relaxed);
            out.exhausted_for_ms = e.exhausted_until.load(Relaxed).saturating_sub(now);
            out.admitted = e.admitted.load(Relaxed);
            out.denied = e.denied.load(Relaxed);
        }
        match &inner.backend {
            Backend::Memory(auth) => {
                if let Some((tokens, ts)) = auth.peek(key, inner.authority_policy(policy), now) {
                    out.authority_tokens = Some(tokens);
                    out.authority_refilled_at_ms = Some(ts);
                }
            }
            Backend::Redis(spec) => {
                let broker = inner.broker()?;
                let mut auth = RedisAuthority::new(
                    spec.clone(),
                    &inner.r.cfg.key_prefix,
                    Duration::from_millis(inner.r.cfg.backend_timeout_ms.max(1000)),
                );
                let key = key.to_owned();
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                broker.runtime().spawn(async move {
                    let _ = tx.send(auth.inspect(&key).await);
                });
                let (c, t, w, ttl) = rx
                    .recv_timeout(Duration::from_secs(5))
                    .map_err(|_| Error::Backend("inspect timed out".into()))?
                    .map_err(Error::Backend)?;
                if let (Some(c), Some(w)) = (c, w) {
                    out.authority_tokens = Some(c / w.max(1));
                }
                out.authority_refilled_at_ms = t;
                out.authority_ttl_ms = (ttl >= 0).then_some(ttl as u64);
            }
        }
        Ok(out)
    }

    /// The resolved lease size (tokens per lease request).
    pub fn lease_size(&self) -> u64 {
        self.inner.r.lease_size
    }

    /// The configuration this limiter was built from.
    pub fn config(&self) -> &Config {
        &self.inner.r.cfg
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        // Stop the runtime from the caller's thread; leased tokens are not
        // given back here (call `close()` for that): the authority refills.
        if let Some(b) = self.inner.broker.swap(None) {
            let g = self.inner.gen.load(Relaxed);
            if g != u64::MAX && g != fork::current() {
                // Inherited from the parent across fork(): its threads do not
                // exist here, so the runtime must be forgotten, not shut down.
                std::mem::forget(b);
            } else {
                drop(b);
            }
        }
    }
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("url", &self.inner.r.cfg.url)
            .field("limit", &self.inner.r.cfg.limit)
            .field("window_ms", &self.inner.r.cfg.window_ms)
            .field("lease_size", &self.inner.r.lease_size)
            .field("mode", &self.inner.r.cfg.mode)
            .finish()
    }
}

impl Inner {
    pub(crate) fn redis_spec(&self) -> Option<&BackendSpec> {
        match &self.backend {
            Backend::Redis(spec) => Some(spec),
            Backend::Memory(_) => None,
        }
    }

    pub(crate) fn sweep_every_ms(&self) -> u64 {
        (self.r.cfg.lease_ttl_ms / 4).clamp(5, 1_000)
    }

    /// After a fork the child must not spend the parent's leased tokens nor
    /// use its runtime (its threads do not exist here).
    #[inline]
    fn check_fork(&self) -> bool {
        let g = fork::current();
        let mine = self.gen.load(Relaxed);
        if g == mine {
            return true;
        }
        if mine == u64::MAX {
            return false; // closed
        }
        if self.gen.compare_exchange(mine, g, AcqRel, Relaxed).is_ok() {
            // The parent's runtime threads are gone: forget it, never drop it.
            if let Some(b) = self.broker.swap(None) {
                std::mem::forget(b);
            }
            let guard = self.table.pin();
            let mut dropped = 0;
            for (_, e) in guard.iter() {
                dropped += e.tokens.swap(0, AcqRel);
                e.in_flight.store(false, Release);
            }
            Counters::add(&self.counters.tokens_expired, dropped);
            self.pending_jobs.store(0, Release);
            tracing::info!(
                dropped,
                "quotalease: fork detected; the child dropped the parent's leased tokens"
            );
        }
        true
    }

    fn check_open(&self) -> Result<()> {
        if self.check_fork() {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    fn lease_params(&self, p: Policy) -> (u64, u64) {
        let lease = self.r.lease_size.min(p.limit);
        (lease, self.r.refill_threshold.min(lease))
    }

    /// The admit path: `Ok(Some)` when local tokens decided, `Ok(None)` for the cold path.
    #[inline(always)]
    fn admit_local(&self, key: &str, cost: u64) -> Result<Option<Decision>> {
        if fork::current() != self.gen.load(Relaxed) {
            self.check_open()?;
        }
        validate_key(key)?;
        if self.r.cfg.mode == Mode::Exact {
            return Ok(None);
        }
        let guard = self.table.pin();
        let Some(e) = guard.get(key) else {
            return Ok(None);
        };
        let p = e.policy();
        if cost == 0 || cost > p.limit {
            return Err(Error::InvalidCost { cost, limit: p.limit });
        }
        let Some(left) = e.try_take(cost) else {
            return Ok(None);
        };
        e.touch(self.clock.coarse());
        e.admitted.fetch_add(1, Relaxed);
        let (_, threshold) = self.lease_params(p);
        let mut left = left;
        if left < threshold && !e.in_flight.load(Relaxed) {
            self.prefetch(e);
            left = e.tokens.load(Relaxed);
        }
        Ok(Some(self.decision(e, p, true, left, 0, self.admit_reason())))
    }

    #[inline]
    fn admit_reason(&self) -> Reason {
        if self.r.cfg.mode == Mode::Local {
            Reason::Local
        } else {
            Reason::Lease
        }
    }

    #[inline]
    fn decision(
        &self,
        e: &Entry,
        p: Policy,
        allowed: bool,
        local: u64,
        retry_after_ms: u64,
        reason: Reason,
    ) -> Decision {
        let remaining = (local + e.auth_remaining.load(Relaxed)).min(p.limit);
        Decision {
            allowed,
            limit: p.limit,
            remaining,
            retry_after_ms,
            reset_after_ms: p.ms_for_tokens(p.limit - remaining),
            window_ms: p.window_ms,
            reason,
        }
    }

    /// Start one asynchronous lease request for `e` unless one is in flight.
    #[cold]
    fn prefetch(&self, e: &Arc<Entry>) {
        if self.circuit.is_open() {
            return;
        }
        let p = e.policy();
        let (lease, _) = self.lease_params(p);
        let local = e.tokens.load(Relaxed);
        self.start_lease(e, lease.saturating_sub(local).max(1), 1);
    }

    /// Send a lease request for `e` (want, need) unless one is in flight.
    /// Memory authorities answer inline. Returns false if one was in flight.
    fn start_lease(&self, e: &Arc<Entry>, want: u64, need: u64) -> bool {
        let now = self.clock.coarse();
        if e.in_flight.swap(true, AcqRel) {
            // Every request is bounded by the backend timeout; one in flight
            // for far longer was lost somewhere: do not let it block the key.
            let stale = self.r.cfg.backend_timeout_ms * 4 + 1_000;
            if now.saturating_sub(e.in_flight_since.load(Relaxed)) < stale || self.clock.is_manual() {
                return false;
            }
            tracing::warn!(key = %e.key, "quotalease: a lease request was lost; sending a new one");
        }
        e.in_flight_since.store(now, Relaxed);
        match &self.backend {
            Backend::Memory(auth) => {
                let p = self.authority_policy(e.policy());
                let now = self.clock.precise();
                let g = auth.lease(&e.key, p, want, need, now);
                Counters::add(&self.counters.backend_calls, 1);
                self.apply_grant(e, g, need, now);
                e.in_flight.store(false, Release);
            }
            Backend::Redis(_) => {
                let job = Job::Lease {
                    entry: e.clone(),
                    want,
                    need,
                    reply: None,
                };
                if self.send_job(job).is_err() {
                    e.in_flight.store(false, Release);
                }
            }
        }
        true
    }

    fn send_job(&self, job: Job) -> Result<()> {
        let broker = self.broker()?;
        self.pending_jobs.fetch_add(1, AcqRel);
        broker.send(job).map_err(|_| {
            self.pending_jobs.fetch_sub(1, AcqRel);
            Error::Closed
        })
    }

    /// The authority's view of a key's policy: local mode enforces the static share.
    fn authority_policy(&self, p: Policy) -> Policy {
        if self.r.cfg.mode == Mode::Local {
            self.share(p)
        } else {
            p
        }
    }

    fn share(&self, p: Policy) -> Policy {
        Policy {
            limit: (p.limit / self.r.cfg.expected_replicas).max(1),
            window_ms: p.window_ms,
        }
    }

    fn apply_grant(&self, e: &Entry, g: Grant, need: u64, now: u64) {
        Counters::add(&self.counters.tokens_leased, g.granted);
        e.auth_remaining.store(g.remaining, Relaxed);
        if g.granted == 0 {
            // Come back when half a lease has refilled, not at the first token:
            // at saturation, instances then lease chunks instead of racing
            // for single tokens (fewer Redis calls; the budget is still all
            // used, since the bucket keeps what accumulates meanwhile).
            let p = e.policy();
            let (lease, _) = self.lease_params(p);
            let settle = if self.r.cfg.mode == Mode::Lease {
                p.ms_for_tokens(lease / 2)
            } else {
                0
            };
            e.exhausted_need.store(need, Relaxed);
            e.exhausted_until.store(now + g.wait_ms.max(1) + settle, Relaxed);
        } else {
            e.exhausted_until.store(0, Relaxed);
            // Fresh tokens start their lease TTL now.
            e.touch(now);
            e.tokens.fetch_add(g.granted, AcqRel);
            if e.retired.load(Acquire) || self.closed.load(Acquire) {
                let back = e.tokens.swap(0, AcqRel);
                self.give_back(&e.key, e.policy(), back, false);
            }
        }
    }

    /// The broker, started on first use (and again in a forked child).
    fn broker(&self) -> Result<Arc<Broker>> {
        if let Some(b) = self.broker.load_full() {
            return Ok(b);
        }
        if self.closed.load(Acquire) {
            return Err(Error::Closed);
        }
        let arc = self.me.upgrade().ok_or(Error::Closed)?;
        let b = Arc::new(Broker::start(&arc)?);
        let prev = self.broker.compare_and_swap(&None::<Arc<Broker>>, Some(b.clone()));
        match &*prev {
            Some(existing) => Ok(existing.clone()), // lost the race; ours shuts down
            None => Ok(b),
        }
    }

    fn entry(&self, key: &str) -> Arc<Entry> {
        let guard = self.table.pin();
        if let Some(e) = guard.get(key) {
            return e.clone();
        }
        if guard.len() >= self.r.cfg.max_keys {
            self.evict_one();
        }
        let policy = lock(&self.overrides)
            .get(key)
            .copied()
            .unwrap_or_else(|| self.r.policy());
        let now = self.clock.precise();
        guard
            .get_or_insert_with(key.into(), || Arc::new(Entry::new(key, policy, now)))
            .clone()
    }

    fn evict_one(&self) {
        let guard = self.table.pin();
        let victim = guard
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, e)| (e.in_flight.load(Relaxed), e.last_used.load(Relaxed)))
            .map(|(k, _)| k.clone());
        if let Some(k) = victim {
            if let Some(e) = guard.remove(&k) {
                self.retire(e);
            }
        }
    }

    fn retire(&self, e: &Entry) {
        e.retired.store(true, Release);
        let t = e.tokens.swap(0, AcqRel);
        Counters::add(&self.counters.tokens_expired, t);
        self.give_back(&e.key, e.policy(), t, true);
        Counters::add(&self.counters.admitted_retired, e.admitted.load(Relaxed));
        Counters::add(&self.counters.denied_retired, e.denied.load(Relaxed));
    }

    /// Return `tokens` of `key` to the authority (memory inline, Redis queued).
    fn give_back(&self, key: &str, policy: Policy, tokens: u64, _expired: bool) {
        if tokens == 0 {
            return;
        }
        let policy = self.authority_policy(policy);
        match &self.backend {
            Backend::Memory(auth) => {
                auth.give_back(key, policy, tokens, self.clock.precise());
                Counters::add(&self.counters.backend_calls, 1);
                Counters::add(&self.counters.tokens_returned, tokens);
            }
            Backend::Redis(_) => {
                let _ = self.send_job(Job::GiveBack {
                    key: key.to_owned(),
                    policy,
                    tokens,
                });
            }
        }
    }

    fn acquire_slow(&self, key: &str, cost: u64, waiting: Waiting) -> Result<Decision> {
        let e = self.entry(key);
        self.validate_cost(&e, cost)?;
        let deadline = Instant::now() + self.wait_bound();
        loop {
            match self.step(&e, cost, waiting)? {
                Step::Done(d) => return Ok(d),
                Step::Again if Instant::now() < deadline => {}
                Step::Again => return Ok(self.after_timeout(&e, cost)),
                Step::Wait => {
                    if !self.wait_blocking(&e, deadline) {
                        return Ok(self.after_timeout(&e, cost));
                    }
                }
            }
        }
    }

    async fn acquire_slow_async(&self, key: &str, cost: u64) -> Result<Decision> {
        let e = self.entry(key);
        self.validate_cost(&e, cost)?;
        let deadline = tokio::time::Instant::now() + self.wait_bound();
        if self.r.cfg.mode == Mode::Exact {
            return self.exact_async(&e, cost).await;
        }
        loop {
            match self.step(&e, cost, Waiting::Yes)? {
                Step::Done(d) => return Ok(d),
                Step::Again if tokio::time::Instant::now() < deadline => {}
                Step::Again => return Ok(self.after_timeout(&e, cost)),
                Step::Wait => {
                    if !self.wait_async(&e, deadline).await {
                        return Ok(self.after_timeout(&e, cost));
                    }
                }
            }
        }
    }

    /// Exact mode on Redis, awaiting the answer instead of blocking a thread.
    async fn exact_async(&self, e: &Arc<Entry>, cost: u64) -> Result<Decision> {
        let now = self.clock.precise();
        let p = e.policy();
        if self.circuit.is_open() && !self.circuit.take_probe(now) {
            return Ok(self.fallback(e, cost, now));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send_job(Job::Lease {
            entry: e.clone(),
            want: cost,
            need: cost,
            reply: Some(Reply::Async(tx)),
        })?;
        let grant = match tokio::time::timeout(self.wait_bound(), rx).await {
            Ok(Ok(r)) => r,
            _ => Err("timed out".into()),
        };
        Ok(self.exact_decision(e, p, cost, grant, self.clock.precise()))
    }

    fn wait_bound(&self) -> Duration {
        // The broker's own round trip is bounded by the timeout; a little
        // slack lets its verdict (grant or circuit open) arrive first.
        Duration::from_millis(self.r.cfg.backend_timeout_ms + 20)
    }

    fn validate_cost(&self, e: &Entry, cost: u64) -> Result<()> {
        let limit = e.limit.load(Relaxed);
        if cost == 0 || cost > limit {
            return Err(Error::InvalidCost { cost, limit });
        }
        Ok(())
    }

    /// The waited-for request did not finish in time.
    fn after_timeout(&self, e: &Arc<Entry>, cost: u64) -> Decision {
        if self.circuit.is_open() {
            return self.fallback(e, cost, self.clock.precise());
        }
        self.deny(e, e.policy(), 0, Reason::Pending, 1)
    }

    fn deny(&self, e: &Entry, p: Policy, local: u64, reason: Reason, retry_after_ms: u64) -> Decision {
        e.denied.fetch_add(1, Relaxed);
        self.decision(e, p, false, local, retry_after_ms.max(1), reason)
    }

    fn admit(&self, e: &Arc<Entry>, p: Policy, left: u64, reason: Reason, now: u64) -> Decision {
        e.touch(now);
        e.admitted.fetch_add(1, Relaxed);
        let (_, threshold) = self.lease_params(p);
        let mut left = left;
        if (reason == Reason::Lease || reason == Reason::Local) && left < threshold && !e.in_flight.load(Relaxed) {
            self.prefetch(e);
            left = e.tokens.load(Relaxed);
        }
        self.decision(e, p, true, left, 0, reason)
    }

    /// One step of the cold path.
    fn step(&self, e: &Arc<Entry>, cost: u64, waiting: Waiting) -> Result<Step> {
        let now = self.clock.precise();
        let p = e.policy();
        self.expire_if_idle(e, p, now);
        if self.r.cfg.mode == Mode::Exact {
            return self.step_exact(e, p, cost, waiting, now);
        }
        let local = loop {
            if let Some(left) = e.try_take(cost) {
                return Ok(Step::Done(self.admit(e, p, left, self.admit_reason(), now)));
            }
            // A lease may land between the failed take and this read.
            let local = e.tokens.load(Relaxed);
            if local < cost {
                break local;
            }
        };
        if let Some(retry) = self.exhausted_for(e, p, cost - local, now) {
            return Ok(Step::Done(self.deny(e, p, local, Reason::Exhausted, retry)));
        }
        if self.circuit.is_open() {
            if self.circuit.take_probe(now) {
                let (lease, _) = self.lease_params(p);
                // If a request is already out, its answer serves as the probe.
                self.start_lease(e, lease.max(cost), cost.saturating_sub(local).max(1));
            }
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        let (lease, _) = self.lease_params(p);
        let need = cost - local;
        let want = lease.saturating_sub(local).max(need);
        match &self.backend {
            Backend::Memory(_) => {
                if !self.start_lease(e, want, need) {
                    // Another thread is leasing inline for this key: it takes
                    // microseconds, so wait for it rather than deny falsely.
                    while e.in_flight.load(Acquire) {
                        std::thread::yield_now();
                    }
                }
                // Answered inline: tokens arrived, or the key is now exhausted,
                // or other threads spent what arrived (then go round again).
                if let Some(left) = e.try_take(cost) {
                    return Ok(Step::Done(self.admit(e, p, left, self.admit_reason(), now)));
                }
                let local = e.tokens.load(Relaxed);
                match self.exhausted_for(e, p, cost.saturating_sub(local), now) {
                    Some(retry) => Ok(Step::Done(self.deny(e, p, local, Reason::Exhausted, retry))),
                    None => Ok(Step::Again),
                }
            }
            Backend::Redis(_) => {
                self.start_lease(e, want, need);
                if waiting == Waiting::No {
                    return Ok(Step::Done(self.deny(e, p, local, Reason::Pending, 1)));
                }
                Ok(Step::Wait)
            }
        }
    }

    /// `Some(retry_after_ms)` when the authority said it cannot give `need`
    /// tokens yet: the denial costs no network call.
    fn exhausted_for(&self, e: &Entry, p: Policy, need: u64, now: u64) -> Option<u64> {
        let until = e.exhausted_until.load(Relaxed);
        let known = e.exhausted_need.load(Relaxed);
        (until > now && need >= known).then(|| until - now + p.ms_for_tokens(need - known))
    }

    fn step_exact(&self, e: &Arc<Entry>, p: Policy, cost: u64, waiting: Waiting, now: u64) -> Result<Step> {
        if self.circuit.is_open() && !self.circuit.take_probe(now) {
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        let grant = match &self.backend {
            Backend::Memory(auth) => {
                Counters::add(&self.counters.backend_calls, 1);
                Ok(auth.lease(&e.key, p, cost, cost, now))
            }
            Backend::Redis(_) => {
                if waiting == Waiting::No {
                    return Ok(Step::Done(self.deny(e, p, 0, Reason::Pending, 1)));
                }
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                self.send_job(Job::Lease {
                    entry: e.clone(),
                    want: cost,
                    need: cost,
                    reply: Some(Reply::Sync(tx)),
                })?;
                match rx.recv_timeout(self.wait_bound()) {
                    Ok(r) => r,
                    Err(_) => Err("timed out".into()),
                }
            }
        };
        Ok(Step::Done(self.exact_decision(e, p, cost, grant, now)))
    }

    fn exact_decision(&self, e: &Arc<Entry>, p: Policy, cost: u64, grant: Result<Grant, String>, now: u64) -> Decision {
        match grant {
            Ok(g) => {
                Counters::add(&self.counters.tokens_leased, g.granted);
                e.auth_remaining.store(g.remaining, Relaxed);
                if g.granted >= cost {
                    self.admit(e, p, 0, Reason::Exact, now)
                } else {
                    self.deny(e, p, 0, Reason::Exact, g.wait_ms)
                }
            }
            Err(_) => self.after_timeout(e, cost),
        }
    }

    /// Lease TTL, applied lazily on the cold path as well as by the sweeper.
    fn expire_if_idle(&self, e: &Entry, p: Policy, now: u64) -> u64 {
        let last = e.last_used.load(Relaxed);
        if now.saturating_sub(last) < self.r.cfg.lease_ttl_ms || e.tokens.load(Relaxed) == 0 {
            return 0;
        }
        let t = e.tokens.swap(0, AcqRel);
        if t > 0 {
            Counters::add(&self.counters.tokens_expired, t);
            self.give_back(&e.key, p, t, true);
        }
        t
    }

    /// The failure policy, once local tokens are spent and the backend is down.
    fn fallback(&self, e: &Arc<Entry>, cost: u64, now: u64) -> Decision {
        let p = e.policy();
        match self.r.cfg.on_backend_failure {
            FailurePolicy::Allow => self.admit(e, p, 0, Reason::Fallback, now),
            FailurePolicy::Deny => {
                let retry = self.circuit.ms_to_probe(now);
                self.deny(e, p, 0, Reason::Fallback, retry)
            }
            FailurePolicy::StaticShare => {
                let share = self.share(p);
                let g = self.fallback.lease(&e.key, share, cost, cost, now);
                if g.granted >= cost {
                    self.admit(e, p, 0, Reason::Fallback, now)
                } else {
                    self.deny(e, p, 0, Reason::Fallback, g.wait_ms)
                }
            }
        }
    }

    fn wait_blocking(&self, e: &Entry, deadline: Instant) -> bool {
        let mut g = lock(&self.signal.gen);
        loop {
            if !e.in_flight.load(Acquire) || self.closed.load(Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .signal
                .cv
                .wait_timeout(g, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    async fn wait_async(&self, e: &Entry, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.signal.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !e.in_flight.load(Acquire) || self.closed.load(Acquire) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return !e.in_flight.load(Acquire);
            }
        }
    }

    fn wake_all(&self) {
        *lock(&self.signal.gen) += 1;
        self.signal.cv.notify_all();
        self.signal.notify.notify_waiters();
    }

    fn wait_idle(&self, bound: Duration) -> Result<()> {
        let deadline = Instant::now() + bound;
        let mut g = lock(&self.signal.gen);
        while self.pending_jobs.load(Acquire) > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Backend(format!(
                    "{} backend requests still in flight after {} ms",
                    self.pending_jobs.load(Acquire),
                    bound.as_millis()
                )));
            }
            g = self
                .signal
                .cv
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(50)))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        Ok(())
    }

    /// One pipelined round trip for a batch of jobs (runs on the broker).
    pub(crate) async fn run_batch(&self, auth: &mut RedisAuthority, jobs: Vec<Job>) {
        let n = jobs.len() as u64;
        let now = self.clock.explicit_now();
        let mut leases = Vec::new();
        let mut backs = Vec::new();
        for job in jobs {
            match job {
                Job::Lease {
                    entry,
                    want,
                    need,
                    reply,
                } => leases.push((entry, want, need, reply)),
                Job::GiveBack { key, policy, tokens } => backs.push(GiveBackCall { key, policy, tokens }),
            }
        }
        let mut failure: Option<String> = None;
        // Set when a whole round trip failed: then the leases of this batch
        // fail at once rather than wait out a second timeout.
        let mut transport_failed = false;
        // Give-backs first: tokens returned can serve the leases of the same batch.
        if !backs.is_empty() {
            Counters::add(&self.counters.backend_calls, backs.len() as u64);
            match auth.give_back_batch(&backs, now).await {
                Ok(results) => {
                    for (call, r) in backs.iter().zip(results) {
                        match r {
                            Ok(_) => Counters::add(&self.counters.tokens_returned, call.tokens),
                            Err(err) => {
                                Counters::add(&self.counters.backend_errors, 1);
                                failure = Some(err);
                            }
                        }
                    }
                }
                Err(err) => {
                    Counters::add(&self.counters.backend_errors, backs.len() as u64);
                    failure = Some(err);
                    transport_failed = true;
                }
            }
        }
        if !leases.is_empty() {
            let calls: Vec<LeaseCall> = leases
                .iter()
                .map(|(e, want, need, _)| LeaseCall {
                    key: e.key.to_string(),
                    policy: self.authority_policy(e.policy()),
                    want: *want,
                    need: *need,
                })
                .collect();
            let res = match (&failure, transport_failed) {
                (Some(err), true) => Err(err.clone()),
                _ => {
                    Counters::add(&self.counters.backend_calls, calls.len() as u64);
                    auth.lease_batch(&calls, now).await
                }
            };
            let t = self.clock.precise();
            // Per-call failures count one error each; a failed round trip
            // counts every call it carried (none when it was never sent).
            let (results, count_each): (Vec<Result<Grant, String>>, bool) = match res {
                Ok(results) => (results, true),
                Err(err) => {
                    if !transport_failed {
                        Counters::add(&self.counters.backend_errors, calls.len() as u64);
                    }
                    (vec![Err(err); calls.len()], false)
                }
            };
            for ((e, _, need, reply), r) in leases.into_iter().zip(results) {
                match (r, reply) {
                    (Ok(g), Some(reply)) => reply.send(Ok(g)),
                    (Ok(g), None) => self.apply_grant(&e, g, need, t),
                    (Err(err), reply) => {
                        if count_each {
                            Counters::add(&self.counters.backend_errors, 1);
                        }
                        if let Some(reply) = reply {
                            reply.send(Err(err.clone()));
                        }
                        failure = Some(err);
                    }
                }
                e.in_flight.store(false, Release);
            }
        }
        let t = self.clock.precise();
        match failure {
            None => {
                if self.circuit.on_success() == Some(Transition::Closed) {
                    self.transition(
                        EventKind::Recovered,
                        "the backend answers again; back to leasing".into(),
                    );
                }
            }
            Some(err) => {
                if self.circuit.on_failure(t) == Some(Transition::Opened) {
                    let policy = self.r.cfg.on_backend_failure.as_str();
                    self.transition(
                        EventKind::Degraded,
                        format!(
                            "backend unreachable ({err}); local leases are spent first, then policy {policy:?} applies"
                        ),
                    );
                }
            }
        }
        self.pending_jobs.fetch_sub(n, AcqRel);
        self.wake_all();
    }

    /// The broker gave up on a batch of `n` jobs: count it as a failure so
    /// callers apply the policy and probing goes on. Its keys' requests are
    /// replaced once stale (see `start_lease`).
    pub(crate) fn abandon_batch(&self, n: u64) {
        Counters::add(&self.counters.backend_errors, n);
        if self.circuit.on_failure(self.clock.precise()) == Some(Transition::Opened) {
            self.transition(EventKind::Degraded, "a backend batch never finished; abandoned".into());
        }
        let _ = self
            .pending_jobs
            .fetch_update(AcqRel, Acquire, |p| Some(p.saturating_sub(n)));
        self.wake_all();
    }

    fn transition(&self, kind: EventKind, message: String) {
        Counters::add(&self.counters.fallback_transitions, 1);
        match kind {
            EventKind::Degraded => tracing::error!(url = %self.r.cfg.url, "quotalease degraded: {message}"),
            EventKind::Recovered => tracing::warn!(url = %self.r.cfg.url, "quotalease recovered: {message}"),
        }
        let event = Event { kind, message };
        let listeners = lock(&self.listeners).clone();
        for l in listeners {
            // A listener's panic must not take the broker down.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l(&event)));
        }
    }

    /// Lease TTL and idle-entry sweep (broker ticker, or `settle()`).
    pub(crate) fn maintain_at(&self, now: u64) {
        if self.closed.load(Acquire) {
            return;
        }
        let idle_drop = self.r.cfg.lease_ttl_ms.saturating_mul(IDLE_TTLS).max(60_000);
        let guard = self.table.pin();
        let mut gone = Vec::new();
        for (k, e) in guard.iter() {
            self.expire_if_idle(e, e.policy(), now);
            let idle = now.saturating_sub(e.last_used.load(Relaxed));
            if idle >= idle_drop && e.tokens.load(Relaxed) == 0 && !e.in_flight.load(Relaxed) {
                gone.push(k.clone());
            }
        }
        for k in gone {
            if let Some(e) = guard.remove(&k) {
                self.retire(e);
            }
        }
    }

    fn flush(&self) -> Result<()> {
        let bound = Duration::from_millis(self.r.cfg.backend_timeout_ms * 4 + 100);
        if self.redis_spec().is_some() {
            // Leases in flight land first, so their tokens are given back too.
            self.wait_idle(bound)?;
        }
        let guard = self.table.pin();
        for (_, e) in guard.iter() {
            let t = e.tokens.swap(0, AcqRel);
            self.give_back(&e.key, e.policy(), t, false);
        }
        drop(guard);
        if self.redis_spec().is_some() {
            self.wait_idle(bound)?;
        }
        Ok(())
    }

    fn metrics(&self) -> Metrics {
        let guard = self.table.pin();
        let mut m = Metrics {
            admitted: self.counters.admitted_retired.load(Relaxed),
            denied: self.counters.denied_retired.load(Relaxed),
            backend_calls: self.counters.backend_calls.load(Relaxed),
            backend_errors: self.counters.backend_errors.load(Relaxed),
            tokens_leased: self.counters.tokens_leased.load(Relaxed),
            tokens_returned: self.counters.tokens_returned.load(Relaxed),
            tokens_expired: self.counters.tokens_expired.load(Relaxed),
            fallback_active: self.circuit.is_open() as u64,
            fallback_transitions: self.counters.fallback_transitions.load(Relaxed),
            keys_tracked: guard.len() as u64,
            overshoot_bound: 0,
        };
        for (_, e) in guard.iter() {
            m.admitted += e.admitted.load(Relaxed);
            m.denied += e.denied.load(Relaxed);
            m.overshoot_bound += e.tokens.load(Relaxed);
        }
        m
    }
}
