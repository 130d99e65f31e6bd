//! [`Limiter`], the public type: a thin handle on its engine.

use std::sync::Arc;

use crate::builder::Builder;
use crate::config::{validate_key, validate_policy, Config};
use crate::decision::Decision;
use crate::engine::{Engine, Waiting};
use crate::error::{Error, Result};
use crate::events::Event;
use crate::metrics::Metrics;

/// A distributed rate limiter. Cheap to share (`Arc<Limiter>`): every method
/// takes `&self` and is safe to call from many threads at once.
pub struct Limiter {
    engine: Arc<Engine>,
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
    /// Adaptive leasing: the rate this instance spends on the key, in tokens
    /// per window (0: no rate grant; it leases chunks).
    pub rate_per_window: u64,
    /// Adaptive leasing: live holders of the key at the last answer.
    pub holders: u64,
    /// Adaptive leasing: this instance's fallback rate (tokens per window) at
    /// the last answer; 0 before any.
    pub fallback_per_window: u64,
    /// Adaptive leasing: the key's offered load here (admitted + denied per
    /// second, moving average).
    pub demand_per_s: u64,
}

impl Limiter {
    /// A builder with every default.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Validate `cfg` and build a limiter. Nothing starts until first use:
    /// no thread, no connection. Every limiter of a process shares one
    /// broker thread and one connection per Redis backend.
    pub fn new(cfg: Config) -> Result<Limiter> {
        Ok(Limiter {
            engine: Engine::new(cfg)?,
        })
    }

    /// Take `cost` tokens for `key`. With local tokens this is a map lookup
    /// and an atomic update; otherwise it waits for a lease request (at most
    /// `backend_timeout_ms`) or applies the failure policy.
    #[inline]
    pub fn acquire(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.engine.admit_local(key, cost)? {
            return Ok(d);
        }
        self.engine.acquire_slow(key, cost, Waiting::Yes)
    }

    /// Like [`acquire`](Self::acquire) but never waits: with no local tokens
    /// and a lease request needed, it starts one and denies with reason `pending`.
    #[inline]
    pub fn try_acquire(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.engine.admit_local(key, cost)? {
            return Ok(d);
        }
        self.engine.acquire_slow(key, cost, Waiting::No)
    }

    /// The hot path alone, for bindings that hold an interpreter lock
    /// (Python's GIL): `Ok(Some(decision))` when local tokens decided (no
    /// wait, no network), `Ok(None)` when the cold path is needed; the
    /// binding then releases its lock and calls [`acquire`](Self::acquire).
    #[inline]
    pub fn acquire_local(&self, key: &str, cost: u64) -> Result<Option<Decision>> {
        self.engine.admit_local(key, cost)
    }

    /// Like [`acquire`](Self::acquire), awaiting the lease request instead of
    /// blocking. Works from any executor: the wait runs on the broker's runtime.
    pub async fn acquire_async(&self, key: &str, cost: u64) -> Result<Decision> {
        if let Some(d) = self.engine.admit_local(key, cost)? {
            return Ok(d);
        }
        if self.engine.is_inline() {
            return self.engine.acquire_slow(key, cost, Waiting::Yes);
        }
        let broker = self.engine.broker()?;
        let engine = self.engine.clone();
        let key = key.to_owned();
        broker
            .runtime()
            .spawn(async move { engine.acquire_slow_async(&key, cost).await })
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
        if let Some(d) = self.engine.admit_local(key, cost)? {
            return Ok(Some(d));
        }
        if self.engine.is_inline() {
            return self.engine.acquire_slow(key, cost, Waiting::Yes).map(Some);
        }
        let broker = self.engine.broker()?;
        let engine = self.engine.clone();
        let key = key.to_owned();
        broker
            .runtime()
            .spawn(async move { done(engine.acquire_slow_async(&key, cost).await) });
        Ok(None)
    }

    /// Override the policy of one key. Takes effect at the next lease; the
    /// authority clamps stored tokens to a lowered limit.
    pub fn set_limit(&self, key: &str, limit: u64, window_ms: u64) -> Result<()> {
        self.engine.check_open()?;
        validate_key(key)?;
        let p = validate_policy(limit, window_ms)?;
        self.engine.set_policy(key, p);
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        self.engine.metrics()
    }

    /// The counters in Prometheus text format.
    pub fn metrics_prometheus(&self) -> String {
        self.metrics().prometheus()
    }

    /// Give every leased token back now and wait for the authority to take
    /// them (graceful shutdown). Never rely on it alone: SIGKILL exists; the
    /// lease TTL gives idle tokens back anyway.
    pub fn flush(&self) -> Result<()> {
        self.engine.check_open()?;
        self.engine.flush()
    }

    /// Flush; every later call returns [`Error::Closed`]. Idempotent.
    pub fn close(&self) -> Result<()> {
        self.engine.close()
    }

    /// Call `f` on every backend transition (degraded / recovered), from the
    /// broker thread. Transitions are also logged through `tracing`.
    pub fn on_event(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        self.engine.on_event(Arc::new(f));
    }

    /// For deterministic tests with [`crate::ClockKind::Manual`]: move the clock forward.
    pub fn advance_clock(&self, ms: u64) -> Result<()> {
        if self.engine.clock.advance(ms) {
            Ok(())
        } else {
            Err(Error::config("clock", "advance_clock needs clock = manual"))
        }
    }

    /// For deterministic tests: run lease-TTL maintenance now, then wait until
    /// no lease or give-back request is in flight (at most 10 s).
    pub fn settle(&self) -> Result<()> {
        self.engine.settle()
    }

    /// What the limiter and the authority know about `key` (for "why was
    /// this denied?"). Reads the authority without changing it.
    pub fn inspect(&self, key: &str) -> Result<Inspection> {
        self.engine.inspect(key)
    }

    /// The resolved lease size (tokens per lease request).
    pub fn lease_size(&self) -> u64 {
        self.engine.r.lease_size
    }

    /// The configuration this limiter was built from.
    pub fn config(&self) -> &Config {
        &self.engine.r.cfg
    }
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.engine.r;
        f.debug_struct("Limiter")
            .field("url", &crate::RedactedUrl(&r.cfg.url))
            .field("limit", &r.cfg.limit)
            .field("window_ms", &r.cfg.window_ms)
            .field("lease_size", &r.lease_size)
            .field("mode", &r.cfg.mode)
            .finish()
    }
}
