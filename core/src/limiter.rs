//! [`Limiter`], the public type: a thin handle on its engine.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::decision::Decision;
use crate::engine::{Engine, Kept, Waiting};
use crate::error::{Error, Result};
use crate::events::Event;
pub use crate::inspection::Inspection;
use crate::keys::validate_key;
use crate::metrics::Metrics;
use crate::permit::Permit;
use crate::policy::{Assignment, Origin, PolicySource, Rules};
use crate::rate::validate_policy;
use crate::reservation::Reservation;

/// What the policy store holds ([`Limiter::policy_list`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyListing {
    /// The store's version (each change adds one).
    pub version: u64,
    /// Every stored tier: name and rules (`"6000/min, 1000000/day"`).
    pub tiers: Vec<(String, String)>,
    /// Every stored key entry: key and `"tier:NAME"` or rules.
    pub keys: Vec<(String, String)>,
}

/// A distributed rate limiter. Cheap to share (`Arc<Limiter>`): every method
/// takes `&self` and is safe to call from many threads at once.
pub struct Limiter {
    engine: Arc<Engine>,
}

impl Limiter {
    /// Build a limiter from a validated configuration: one that
    /// [`Options::into_config`](crate::Options::into_config) made, or another
    /// limiter's [`config`](Self::config) (a [`Config`] cannot be built any
    /// other way). Usually [`Limiter::builder`] or [`Limiter::from_options`]
    /// is simpler. Nothing starts until first use: no thread, no
    /// connection. Every limiter of a process shares one broker thread and,
    /// per Redis backend, one connection for leases and one for the policy
    /// store.
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
        // Not `acquire_with(.., None)`: this body is compiled with the tier
        // known to be none, which the admit path's tier check folds away.
        self.take(key, cost, None, Waiting::Yes)
    }

    /// The admit path, then the cold path when it cannot decide; the
    /// decision is written once, into the result (`Engine::admit_or`).
    #[inline(always)]
    fn take(&self, key: &str, cost: u64, tier: Option<&str>, how: Waiting) -> Result<Decision> {
        self.engine.admit_or(
            key,
            cost,
            tier,
            Kept::No,
            |d| d,
            || self.engine.acquire_slow(key, cost, how, tier),
        )
    }

    /// [`acquire`](Self::acquire) for a key in plan tier `tier` (`None`: the
    /// default tier, or `limit`/`window_ms`). A key with its own entry in
    /// the policy store or file keeps that entry whatever tier is named.
    /// A key with several rules is admitted only when every rule admits;
    /// tokens the others took are given back when one denies.
    #[inline]
    pub fn acquire_with(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Decision> {
        self.take(key, cost, tier, Waiting::Yes)
    }

    /// Like [`acquire`](Self::acquire) but never waits: with no local tokens
    /// and a lease request needed, it starts one and denies with reason `pending`.
    #[inline]
    pub fn try_acquire(&self, key: &str, cost: u64) -> Result<Decision> {
        self.take(key, cost, None, Waiting::No)
    }

    /// [`try_acquire`](Self::try_acquire) in plan tier `tier`.
    #[inline]
    pub fn try_acquire_with(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Decision> {
        self.take(key, cost, tier, Waiting::No)
    }

    /// For the bindings: decides as [`acquire_with`](Self::acquire_with)
    /// (`wait`) or [`try_acquire_with`](Self::try_acquire_with) would, and
    /// hands the decision to `f` by reference. Moved out of the admit
    /// path's `Result<Option<Decision>>`, a decision is copied with vector
    /// moves over fields just stored one by one, and each copy stalls on
    /// store forwarding: about 20 ns of a warm call through the C ABI or
    /// N-API (docs/benchmarks.md, "The decision read in place"). Read in
    /// place, it is not copied. `tier` `None` as a constant folds the
    /// admit path's tier check away, as in [`acquire`](Self::acquire).
    #[doc(hidden)]
    #[inline(always)]
    pub fn decide<R>(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        wait: bool,
        f: impl FnOnce(&Decision) -> R,
    ) -> Result<R> {
        match self.engine.admit_local(key, cost, tier) {
            Ok(Some(ref d)) => Ok(f(d)),
            Ok(None) => {
                let how = if wait { Waiting::Yes } else { Waiting::No };
                let d = self.engine.acquire_slow(key, cost, how, tier)?;
                Ok(f(&d))
            }
            Err(e) => Err(e),
        }
    }

    /// The hot path alone, for bindings that hold an interpreter lock
    /// (Python's GIL): `Ok(Some(decision))` when local tokens decided (no
    /// wait, no network), `Ok(None)` when the cold path is needed; the
    /// binding then releases its lock and calls [`acquire`](Self::acquire).
    #[inline]
    pub fn acquire_local(&self, key: &str, cost: u64) -> Result<Option<Decision>> {
        self.engine.admit_local(key, cost, None)
    }

    /// [`acquire_local`](Self::acquire_local) in plan tier `tier`.
    #[inline]
    pub fn acquire_local_with(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Option<Decision>> {
        self.engine.admit_local(key, cost, tier)
    }

    /// Like [`acquire`](Self::acquire), awaiting the lease request instead of
    /// blocking. Works from any executor: the wait runs on the broker's runtime.
    pub async fn acquire_async(&self, key: &str, cost: u64) -> Result<Decision> {
        self.acquire_async_with(key, cost, None).await
    }

    /// [`acquire_async`](Self::acquire_async) in plan tier `tier`.
    pub async fn acquire_async_with(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Decision> {
        if let Some(d) = self.engine.admit_local(key, cost, tier)? {
            return Ok(d);
        }
        if self.engine.is_inline() {
            return self.engine.acquire_slow(key, cost, Waiting::Yes, tier);
        }
        self.spawn_slow(key, cost, Waiting::Yes, tier, |_, _, _, d| d)?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// [`acquire_with`](Self::acquire_with), waiting up to `wait` for the
    /// tokens instead of denying: from the local lease, a rate grant or the
    /// bucket's refill, in arrival order among this process's waiters of
    /// the key (a newcomer queues behind them). A denial whose
    /// `retry_after_ms` falls past the deadline is returned at once;
    /// a deny entry (`blocked`) is never waited on. Each request counts
    /// once in metrics and demand, however often it was denied while
    /// waiting. Blocks this thread (the wait runs on the broker's runtime);
    /// from async code use [`acquire_wait_async`](Self::acquire_wait_async).
    pub fn acquire_wait(&self, key: &str, cost: u64, tier: Option<&str>, wait: Duration) -> Result<Decision> {
        if let Some(d) = self.engine.acquire_wait_now(key, cost, tier)? {
            return Ok(d);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.acquire_wait_or_notify(key, cost, tier, wait, move |r| {
            let _ = tx.send(r);
        })?
        .map_or_else(|| rx.recv().map_err(|_| Error::Closed)?, Ok)
    }

    /// [`acquire_wait`](Self::acquire_wait), awaiting instead of blocking.
    pub async fn acquire_wait_async(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        wait: Duration,
    ) -> Result<Decision> {
        if let Some(d) = self.engine.acquire_wait_now(key, cost, tier)? {
            return Ok(d);
        }
        self.spawn_wait(key, cost, tier, wait, |r| r)?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// The waiting path of `acquire_wait` on the broker's runtime, its
    /// outcome handed to `then`.
    fn spawn_wait<T: Send + 'static>(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        wait: Duration,
        then: impl FnOnce(Result<Decision>) -> T + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<T>> {
        let broker = self.engine.broker()?;
        let engine = self.engine.clone();
        let key = key.to_owned();
        let tier = tier.map(str::to_owned);
        Ok(broker
            .runtime()
            .spawn(async move { then(engine.acquire_wait(&key, cost, tier.as_deref(), wait).await) }))
    }

    /// Callback form of [`acquire_wait`](Self::acquire_wait) for bindings
    /// with their own event loop: `Ok(Some(decision))` when decided at once
    /// (local tokens and no waiters), else `Ok(None)` and `done` is called
    /// once, later, from the broker thread.
    pub fn acquire_wait_or_notify(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        wait: Duration,
        done: impl FnOnce(Result<Decision>) + Send + 'static,
    ) -> Result<Option<Decision>> {
        if let Some(d) = self.engine.acquire_wait_now(key, cost, tier)? {
            return Ok(Some(d));
        }
        self.spawn_wait(key, cost, tier, wait, done)?;
        Ok(None)
    }

    /// Take a permit for one request of `key` in flight: admitted while
    /// fewer than the key's concurrency limit (its rules' `"N concurrent"`:
    /// its policy entry's, else those of `tier` or of the tier the key is
    /// assigned, else the limiter's `concurrency`) of its requests are in
    /// flight across the fleet (permits leased to instances in chunks, as
    /// tokens are), denied otherwise (`retry_after_ms`: when to ask again).
    /// `tier` is chosen as in [`acquire_with`](Self::acquire_with).
    /// Release it with [`Permit::release`] when the request ends (or drop
    /// it). At most `concurrency` are in flight, plus the permits of
    /// instances that died holding them, until their commitments expire at
    /// the authority (docs/design.md, "Concurrency limits").
    /// [`Error::Config`] when the key has no concurrency limit;
    /// [`Error::UnknownTier`].
    pub fn acquire_concurrent(&self, key: &str, tier: Option<&str>) -> Result<Permit> {
        let bucket = self.engine.in_flight_key(key)?;
        let d = match self.engine.admit_local_kept(&bucket, 1, tier)? {
            Some(d) => d,
            None => self.engine.acquire_slow(&bucket, 1, Waiting::Permit, tier)?,
        };
        Permit::new(self.engine.clone(), key, &bucket, tier, d)
    }

    /// [`acquire_concurrent`](Self::acquire_concurrent), awaiting instead of blocking.
    pub async fn acquire_concurrent_async(&self, key: &str, tier: Option<&str>) -> Result<Permit> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(p) = self.acquire_concurrent_or_notify(key, tier, move |p| {
            let _ = tx.send(p);
        })? {
            return Ok(p);
        }
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Callback form of [`acquire_concurrent_async`](Self::acquire_concurrent_async),
    /// for bindings with their own event loop: `Ok(Some(permit))` when
    /// decided without waiting, else `Ok(None)` and `done` is called once,
    /// later, from the broker thread.
    pub fn acquire_concurrent_or_notify(
        &self,
        key: &str,
        tier: Option<&str>,
        done: impl FnOnce(Result<Permit>) + Send + 'static,
    ) -> Result<Option<Permit>> {
        let bucket = self.engine.in_flight_key(key)?;
        if let Some(d) = self.engine.admit_local_kept(&bucket, 1, tier)? {
            return Permit::new(self.engine.clone(), key, &bucket, tier, d).map(Some);
        }
        if self.engine.is_inline() {
            return self.acquire_concurrent(key, tier).map(Some);
        }
        let user_key: Box<str> = key.into();
        self.spawn_slow(&bucket, 1, Waiting::Permit, tier, move |engine, bucket, tier, d| {
            done(d.and_then(|d| Permit::new(engine, &user_key, bucket, tier, d)));
        })?;
        Ok(None)
    }

    /// Reserve `estimate` tokens of `key` for a request whose cost is known
    /// only after it ran (an LLM response's tokens, bytes streamed):
    /// admitted or denied as [`acquire_with`](Self::acquire_with) decides on
    /// `estimate`, then settled once with [`Reservation::settle`] at the
    /// actual cost.
    pub fn reserve(&self, key: &str, estimate: u64, tier: Option<&str>) -> Result<Reservation> {
        let d = match self.engine.admit_local_kept(key, estimate, tier)? {
            Some(d) => d,
            None => self.engine.acquire_slow(key, estimate, Waiting::Reserve, tier)?,
        };
        Reservation::new(self.engine.clone(), key, tier, estimate, d)
    }

    /// [`reserve`](Self::reserve), awaiting instead of blocking.
    pub async fn reserve_async(&self, key: &str, estimate: u64, tier: Option<&str>) -> Result<Reservation> {
        if let Some(d) = self.engine.admit_local_kept(key, estimate, tier)? {
            return Reservation::new(self.engine.clone(), key, tier, estimate, d);
        }
        if self.engine.is_inline() {
            return self.reserve(key, estimate, tier);
        }
        self.spawn_slow(key, estimate, Waiting::Reserve, tier, move |engine, key, tier, d| {
            Reservation::new(engine, key, tier, estimate, d?)
        })?
        .await
        .map_err(|_| Error::Closed)?
    }

    /// Callback form of [`reserve_async`](Self::reserve_async), for bindings
    /// with their own event loop: `Ok(Some(reservation))` when decided
    /// without waiting, else `Ok(None)` and `done` is called once, later,
    /// from the broker thread.
    pub fn reserve_or_notify(
        &self,
        key: &str,
        estimate: u64,
        tier: Option<&str>,
        done: impl FnOnce(Result<Reservation>) + Send + 'static,
    ) -> Result<Option<Reservation>> {
        if let Some(d) = self.engine.admit_local_kept(key, estimate, tier)? {
            return Reservation::new(self.engine.clone(), key, tier, estimate, d).map(Some);
        }
        if self.engine.is_inline() {
            return self.reserve(key, estimate, tier).map(Some);
        }
        self.spawn_slow(key, estimate, Waiting::Reserve, tier, move |engine, key, tier, d| {
            done(d.and_then(|d| Reservation::new(engine, key, tier, estimate, d)));
        })?;
        Ok(None)
    }

    /// Requests of `key` waiting in [`acquire_wait`](Self::acquire_wait) in
    /// this process now.
    pub fn waiters(&self, key: &str) -> usize {
        self.engine.waiters(key)
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
        self.acquire_or_notify_with(key, cost, None, done)
    }

    /// [`acquire_or_notify`](Self::acquire_or_notify) in plan tier `tier`.
    pub fn acquire_or_notify_with(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        done: impl FnOnce(Result<Decision>) + Send + 'static,
    ) -> Result<Option<Decision>> {
        if let Some(d) = self.engine.admit_local(key, cost, tier)? {
            return Ok(Some(d));
        }
        if self.engine.is_inline() {
            return self.engine.acquire_slow(key, cost, Waiting::Yes, tier).map(Some);
        }
        self.spawn_slow(key, cost, Waiting::Yes, tier, |_, _, _, d| done(d))?;
        Ok(None)
    }

    /// The cold path of `key` on the broker's runtime, its outcome handed
    /// to `then` with the engine, the key and the tier (what a reservation
    /// is made of).
    fn spawn_slow<T: Send + 'static>(
        &self,
        key: &str,
        cost: u64,
        waiting: Waiting,
        tier: Option<&str>,
        then: impl FnOnce(Arc<Engine>, &str, Option<&str>, Result<Decision>) -> T + Send + 'static,
    ) -> Result<tokio::task::JoinHandle<T>> {
        let broker = self.engine.broker()?;
        let engine = self.engine.clone();
        let key = key.to_owned();
        let tier = tier.map(str::to_owned);
        Ok(broker.runtime().spawn(async move {
            let d = engine.acquire_slow_async(&key, cost, waiting, tier.as_deref()).await;
            then(engine, &key, tier.as_deref(), d)
        }))
    }

    /// A startup probe: connect to the backend now and run a script that
    /// reads (never writes) one key under `key_prefix`, the path every lease
    /// takes. `Ok(())` when leases can be taken; [`Error::Misconfigured`]
    /// when the backend refuses this configuration (credentials, database,
    /// scheme, protocol, ACL permissions); [`Error::Backend`] when it cannot
    /// be reached (connecting, then the server's silence, are each bounded
    /// by `backend_timeout_ms`). Always `Ok` on `memory://` (unless a
    /// simulated outage is on). Construction never connects, so a limiter
    /// built while Redis is down still starts; call this where the service
    /// decides it is ready. It changes nothing: neither the circuit nor any
    /// key's tokens.
    pub fn check(&self) -> Result<()> {
        self.engine.check()
    }

    /// The rules `key` is held to on a call naming `tier`, and why. Like a
    /// key's first `acquire`, it waits (at most `backend_timeout_ms`) for the
    /// store's entry of a key this limiter has not seen.
    pub fn policy(&self, key: &str, tier: Option<&str>) -> Result<(Rules, PolicySource)> {
        self.engine.check_open()?;
        validate_key(key)?;
        self.engine
            .await_policy(key, std::time::Instant::now() + self.engine.wait_bound());
        let r = self.engine.resolve(key, tier)?;
        Ok((r.rules, r.source))
    }

    /// Every tier this limiter knows now (name, rules, where defined), by name.
    pub fn tiers(&self) -> Vec<(String, Rules, Origin)> {
        self.engine.policies.tier_list()
    }

    /// Define (or redefine) tier `name` in the shared policy store: every
    /// limiter on the store applies it within `policy_refresh_ms` (this one
    /// before returning). Keys in the tier keep their buckets' state:
    /// lowering clamps, raising refills at the new rate. Returns the
    /// store's version after the change.
    pub fn policy_set_tier(&self, name: &str, rules: &str) -> Result<u64> {
        crate::policy::validate_tier_name(name)?;
        let rules = Rules::parse(rules, "rules")?;
        self.engine.store_write(true, name, Some(rules.to_string()))
    }

    /// Remove tier `name` from the store (keys in it fall back to the
    /// configuration's or file's definition of the tier, if any).
    pub fn policy_delete_tier(&self, name: &str) -> Result<u64> {
        crate::policy::validate_tier_name(name)?;
        self.engine.store_write(true, name, None)
    }

    /// Give `key` its own entry in the store: `"tier:pro"` or rules
    /// (`"10/s, 1000/day"`). It wins over the tier callers name.
    pub fn policy_assign(&self, key: &str, assignment: &str) -> Result<u64> {
        validate_key(key)?;
        let a = Assignment::parse(assignment)?;
        self.engine.store_write(false, key, Some(a.to_string()))
    }

    /// Remove `key`'s entry from the store.
    pub fn policy_unassign(&self, key: &str) -> Result<u64> {
        validate_key(key)?;
        self.engine.store_write(false, key, None)
    }

    /// What the store holds: its version, every tier and every key entry
    /// (as stored text), sorted by name. Reads the whole store: an operator
    /// call, not one for the request path.
    pub fn policy_list(&self) -> Result<PolicyListing> {
        match self.engine.store_request(crate::authority::PolicyOp::List)? {
            crate::authority::PolicyReply::List { version, tiers, keys } => Ok(PolicyListing { version, tiers, keys }),
            other => Err(Error::Backend(format!(
                "unexpected answer from the policy store: {other:?}"
            ))),
        }
    }

    /// The store's entry for `key` as stored (`None`: it has none).
    pub fn policy_get(&self, key: &str) -> Result<Option<String>> {
        validate_key(key)?;
        match self.engine.store_request(crate::authority::PolicyOp::Get {
            keys: vec![key.to_string()],
        })? {
            crate::authority::PolicyReply::Values(mut v) if v.len() == 1 => Ok(v.pop().flatten()),
            other => Err(Error::Backend(format!(
                "unexpected answer from the policy store: {other:?}"
            ))),
        }
    }

    /// Check the policy store (and file) now and apply what changed before
    /// returning (the ticker does it every `policy_refresh_ms`).
    pub fn refresh_policies(&self) -> Result<()> {
        self.engine.refresh_now()
    }

    /// Override the policy of one key. Takes effect at once: under a lower
    /// limit the key's local tokens go back and the authority clamps its
    /// stored tokens to the new capacity.
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

    /// The counters in Prometheus text format, with `labels` on every sample
    /// (see [`Metrics::prometheus_with`]). Two limiters of one process go
    /// into one exposition through [`crate::metrics_prometheus`], not by
    /// concatenating their texts (Prometheus rejects a repeated family).
    pub fn metrics_prometheus_with(&self, labels: &[(&str, &str)]) -> Result<String> {
        self.metrics().prometheus_with(labels)
    }
}

/// Several limiters' counters in one Prometheus exposition, each limiter's
/// samples told apart by its labels: every family's `# HELP` and `# TYPE`
/// once, then one sample per limiter. What one `/metrics` endpoint of an
/// application with several limiters serves. Errors ([`Error::Config`],
/// field `labels`): an invalid or repeated label name, or two limiters with
/// the same labels.
pub fn metrics_prometheus(limiters: &[(&Limiter, &[(&str, &str)])]) -> Result<String> {
    let sources: Vec<(Metrics, &[(&str, &str)])> = limiters.iter().map(|(l, labels)| (l.metrics(), *labels)).collect();
    crate::metrics::prometheus_text(&sources)
}

impl Limiter {
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

    /// Print every backend transition (degraded / recovered) as one line on
    /// stderr, the URL redacted: `quotalease: degraded (redis://***@h:6379):
    /// backend misconfigured (...)`. For the bindings whose language has no
    /// bridge from `tracing` (C, Go, Node call it for every limiter they
    /// create; Rust and Python log through `tracing` / `logging`). Does
    /// nothing when the environment variable `QUOTALEASE_STDERR_LOG` is `0`,
    /// `off`, `false` or `no` when the limiter is created.
    pub fn log_events_to_stderr(&self) {
        let quiet = std::env::var("QUOTALEASE_STDERR_LOG")
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "off" | "false" | "no"));
        if quiet {
            return;
        }
        let url = crate::redact::redact_url(&self.engine.r.cfg.url);
        self.on_event(move |e| {
            use std::io::Write as _;
            // One write per line, so lines of several threads never interleave.
            let line = format!("quotalease: {} ({url}): {}\n", e.kind.as_str(), e.message);
            let _ = std::io::stderr().write_all(line.as_bytes());
        });
    }

    /// For deterministic tests with [`crate::ClockKind::Manual`]: move the clock forward.
    pub fn advance_clock(&self, ms: u64) -> Result<()> {
        if self.engine.clock.advance(ms) {
            Ok(())
        } else {
            Err(Error::config("clock", "advance_clock needs clock = manual"))
        }
    }

    /// `testing::jump_authority_clock`.
    #[cfg(feature = "test-util")]
    pub(crate) fn jump_authority_clock(&self, ms: i64) -> Result<()> {
        if self.engine.clock.jump_authority(ms) {
            Ok(())
        } else {
            Err(Error::config("clock", "jump_authority_clock needs clock = manual"))
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
