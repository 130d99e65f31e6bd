//! The engine behind one [`crate::Limiter`]: its key table, circuit,
//! counters and clock, and the paths a request takes through them.
//!
//! - `admit.rs`: the hot path (local tokens, one atomic update) and decisions.
//! - `cold.rs`: the cold path, one state machine (`step`) driven by a
//!   blocking and an async waiter.
//! - `exact.rs`: mode `exact` (one authority call per request).
//! - `fallback.rs`: the failure policy, circuit transitions and events.
//! - `grants.rs`: lease and give-back calls to the authority, and their results.
//! - `table.rs`: the key table, eviction, idle sweep, lease-TTL expiry, flush.
//!
//! See docs/design.md for how data flows through these parts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::authority::{Authority, Call, MemoryAuthority, Reply};
use crate::broker::{Broker, Target, Tick};
use crate::circuit::Circuit;
use crate::clock::Clock;
use crate::config::{validate_key, BackendSpec, Config, Mode, Resolved};
use crate::error::{Error, Result};
use crate::events::Listener;
use crate::fork;
use crate::inspection::Inspection;
use crate::metrics::{Counters, Metrics};
use entry::Entry;

mod admit;
mod cold;
pub(crate) mod entry;
mod exact;
mod fallback;
mod grants;
pub(crate) mod policies;
mod settle;
mod table;
mod wait;

pub(crate) use admit::Kept;
pub(crate) use cold::Waiting;
use table::Table;

/// Wakes callers waiting for an authority call to complete.
#[derive(Default)]
struct Signal {
    gen: Mutex<u64>,
    cv: Condvar,
    notify: tokio::sync::Notify,
}

pub(crate) struct Engine {
    me: Weak<Engine>,
    pub(crate) r: Resolved,
    pub(crate) clock: Clock,
    /// Fork generation this limiter's state belongs to; `u64::MAX` once closed.
    gen: AtomicU64,
    closed: AtomicBool,
    table: Table,
    overrides: Mutex<HashMap<String, crate::bucket::Quota>>,
    /// Tiers, the policy store's and file's entries (`policies.rs`).
    pub(crate) policies: policies::Policies,
    authority: Authority,
    /// Static-share buckets while the backend is down.
    fallback: MemoryAuthority,
    circuit: Circuit,
    counters: Counters,
    /// Authority calls sent and not yet answered.
    pending: AtomicU64,
    signal: Signal,
    listeners: Mutex<Vec<Listener>>,
    /// Fork generation of the broker this engine's ticker is registered with.
    ticking: AtomicU64,
    /// Clock reading of the last maintenance pass.
    last_sweep: AtomicU64,
    /// This instance's holder id at the authority (adaptive leasing); a new
    /// one after a fork, since the child holds nothing.
    holder: AtomicU64,
    /// Moving average of the authority's round trip (ms).
    rtt_ms: AtomicU64,
    /// Why the backend refuses this limiter's configuration, from its last
    /// answer (`None`: it did not; see [`Engine::misconfigured`]).
    misconfig: ArcSwapOption<String>,
    /// Requests waiting for tokens (`acquire_wait`), per key.
    waits: wait::Waits,
}

/// A holder id no other instance will pick: random bits from the standard
/// library's per-process hasher keys, the process id and the time.
fn new_holder_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

/// The key `check()` reads (under the limiter's prefix, so the ACL key
/// pattern applies to it as to every bucket).
const CHECK_KEY: &str = "quotalease:check";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    pub fn new(cfg: Config) -> Result<Arc<Engine>> {
        let r = cfg.resolve()?;
        let authority = match (&r.backend, r.cfg.mode) {
            (_, Mode::Local) => Authority::Memory(MemoryAuthority::open(None)),
            (BackendSpec::Memory(name), _) => Authority::Memory(MemoryAuthority::open(name.as_deref())),
            (spec, _) => Authority::remote(
                Target {
                    spec: spec.clone(),
                    timeout_ms: r.cfg.backend_timeout_ms,
                    lane: crate::broker::Lane::Leases,
                },
                &r.cfg.key_prefix,
            ),
        };
        Ok(Arc::new_cyclic(|me| Engine {
            me: me.clone(),
            clock: Clock::new(r.cfg.clock),
            gen: AtomicU64::new(fork::generation()),
            closed: AtomicBool::new(false),
            table: Table::new(r.cfg.max_keys),
            overrides: Mutex::new(HashMap::new()),
            policies: policies::Policies::new(&r.cfg, r.file.clone()),
            authority,
            fallback: MemoryAuthority::default(),
            circuit: Circuit::new(r.cfg.backend_timeout_ms),
            counters: Counters::default(),
            pending: AtomicU64::new(0),
            signal: Signal::default(),
            listeners: Mutex::new(Vec::new()),
            ticking: AtomicU64::new(0),
            last_sweep: AtomicU64::new(0),
            holder: AtomicU64::new(new_holder_id()),
            rtt_ms: AtomicU64::new(0),
            misconfig: ArcSwapOption::empty(),
            waits: Default::default(),
            r,
        }))
    }

    /// Whether the authority answers inline (memory) rather than through the broker.
    pub fn is_inline(&self) -> bool {
        self.authority.is_inline()
    }

    /// The broker for a Redis authority, with this engine's ticker registered.
    pub fn broker(&self) -> Result<Arc<Broker>> {
        let b = self.authority.broker().unwrap_or_else(crate::broker::get)?;
        let gen = fork::current();
        if !self.clock.is_manual() && self.ticking.swap(gen, AcqRel) != gen {
            if let Some(me) = self.me.upgrade() {
                b.register(Arc::downgrade(&me) as Weak<dyn Tick>);
            }
        }
        Ok(b)
    }

    pub fn on_event(&self, l: Listener) {
        lock(&self.listeners).push(l);
    }

    /// After a fork the child must not spend the parent's leased tokens nor
    /// wait for the parent's calls (the broker's threads do not exist here).
    #[inline]
    pub fn check_fork(&self) -> bool {
        let g = fork::current();
        let mine = self.gen.load(Relaxed);
        if g == mine {
            return true;
        }
        if mine == u64::MAX {
            return false; // closed
        }
        if self.gen.compare_exchange(mine, g, AcqRel, Relaxed).is_ok() {
            self.holder.store(new_holder_id(), Relaxed);
            let dropped = self.table.forget_leases();
            Counters::add(&self.counters.tokens_expired, dropped);
            self.pending.store(0, Release);
            // A parent's waiter may hold a key's queue: its task is not here.
            self.waits.forget();
            tracing::info!(
                dropped,
                "quotalease: fork detected; the child dropped the parent's leased tokens"
            );
        }
        true
    }

    pub fn check_open(&self) -> Result<()> {
        if self.check_fork() {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    /// Refuse new calls, give every leased token back. Idempotent.
    pub fn close(&self) -> Result<()> {
        if self.closed.load(Acquire) {
            return Ok(());
        }
        self.check_fork();
        // Refuse new calls first, so nothing is leased while we give back.
        self.gen.store(u64::MAX, Release);
        self.closed.store(true, Release);
        let flushed = self.flush();
        self.wake_all();
        flushed
    }

    pub fn set_policy(&self, key: &str, p: crate::bucket::Quota) {
        lock(&self.overrides).insert(key.to_owned(), p);
        if let Some(e) = self.table.get(key) {
            if let Ok(r) = self.resolve(key, None) {
                self.apply_rules(&e, key, &r);
            }
        }
    }

    /// Hold one bucket's entry to `p` (a no-op when it already is): under a
    /// lowered limit its tokens go back (`leave_policy`); the authority
    /// clamps its own.
    pub(crate) fn set_entry_policy(&self, e: &Entry, p: crate::bucket::Quota) {
        if e.policy() == p {
            return;
        }
        let old = e.repolicy(p);
        e.period_end.store(0, Relaxed);
        // The authority's last "empty" was under the old policy.
        e.exhausted_until.store(0, Relaxed);
        if !self.r.adaptive {
            e.threshold.store(self.lease_params(p).1, Relaxed);
        }
        self.leave_policy(e, old);
    }

    /// What `e` holds under the policy `old` it has left (`set_entry_policy`,
    /// or an answer to a call sent under it that lands after the change).
    /// Its rate, which would run on at the old limit for up to a longest
    /// period (5 s at 60/s after a tier raised the key to 240/s: 0.894 of
    /// the new allowance in the 9 s after), ends: the next request renews
    /// it under the new policy (ending a rate early only accrues less than
    /// the authority counted). Under a lower limit every local token goes
    /// back too, and the rate ends at the authority as well: holders each
    /// keeping up to the new limit spent several times the new capacity at
    /// once (`ledger_bound`'s random `set_limit`: 5 holders, 41 per 100 ms
    /// lowered to 1), and the authority, which converts what it is given
    /// back, holds its credit to the new capacity less what is out.
    pub(super) fn leave_policy(&self, e: &Entry, old: crate::bucket::Quota) {
        let p = e.policy();
        if p.limit < old.limit {
            let back = e.tokens.swap(0, AcqRel);
            self.give_back(e, p, back);
        } else if e.rate.load(Acquire) > 0 {
            e.rate_until.fetch_min(self.clock.precise(), AcqRel);
        }
    }

    fn wake_all(&self) {
        *lock(&self.signal.gen) += 1;
        self.signal.cv.notify_all();
        self.signal.notify.notify_waiters();
    }

    /// Block until `done()` holds or `deadline` passes (false then).
    fn wait_blocking(&self, done: impl Fn() -> bool, deadline: Instant) -> bool {
        let mut g = lock(&self.signal.gen);
        loop {
            if done() {
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

    /// Await until `done()` holds or `deadline` passes (false then).
    async fn wait_async(&self, done: impl Fn() -> bool, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.signal.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done();
            }
        }
    }

    /// Wait until no authority call is in flight (at most `bound`).
    fn wait_idle(&self, bound: Duration) -> Result<()> {
        if self.wait_blocking(|| self.pending.load(Acquire) == 0, Instant::now() + bound) {
            return Ok(());
        }
        Err(Error::Backend(format!(
            "{} backend requests still in flight after {} ms",
            self.pending.load(Acquire),
            bound.as_millis()
        )))
    }

    /// For deterministic tests: maintenance now, then wait for quiet.
    pub fn settle(&self) -> Result<()> {
        self.check_open()?;
        let now = self.clock.precise();
        self.maintain_at(now);
        self.refresh_policies(now, true);
        self.wait_idle(Duration::from_secs(10))
    }

    /// The bucket of `key`'s permits in flight (its limit: the key's rules'
    /// `"N concurrent"`, else the limiter's `concurrency`; a key with
    /// neither is refused by its resolution, [`Error::Config`]).
    pub(crate) fn in_flight_key(&self, key: &str) -> Result<String> {
        validate_key(key)?;
        Ok(format!("{key}{}", policies::IN_FLIGHT_SUFFIX))
    }

    /// What this limiter and the authority know about `key`.
    pub fn inspect(&self, key: &str) -> Result<Inspection> {
        self.check_open()?;
        validate_key(key)?;
        let now = self.clock.precise();
        let entry = self.table.get(key);
        // The rules in force: the entry's, chosen for the tier its calls name.
        let tier = entry.as_ref().and_then(|e| {
            let mark = e.mark.load(Relaxed);
            let map = self.policies.tiers.load();
            map.get_by_id(mark).map(str::to_string)
        });
        let res = self.resolve(key, tier.as_deref())?;
        let policy = res.rules.first();
        let mut out = Inspection {
            limit: policy.limit,
            window_ms: policy.window_ms,
            rules: res.rules.to_string(),
            tier: res.source.tier.clone(),
            policy_source: res.source.to_string(),
            ..Inspection::default()
        };
        if let Some(e) = self.table.get(key) {
            out.local_tokens = e.tokens.load(Relaxed);
            out.lease_in_flight = e.in_flight.load(Relaxed);
            out.exhausted_for_ms = e.exhausted_until.load(Relaxed).saturating_sub(now);
            out.admitted = e.admitted.load(Relaxed);
            out.denied = e.denied.load(Relaxed);
            // A rate of r credit units per ms is r tokens per window.
            if e.rate_until.load(Relaxed) > now {
                out.rate_per_window = e.rate.load(Relaxed);
            }
            out.holders = e.holders.load(Relaxed);
            out.fallback_per_window = e.fallback.load(Relaxed);
            out.demand_per_s = e.demand.load(Relaxed) / 1_000;
        }
        if !self.is_inline() {
            self.broker()?;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let call = Call::Inspect {
            key: key.to_owned(),
            policy: self.authority_policy(policy),
            now: self.now(),
        };
        self.authority.call(
            call,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        let bound = Duration::from_millis(self.r.cfg.backend_timeout_ms.max(1_000) * 5);
        let stored = match rx.recv_timeout(bound) {
            Ok(Ok(Reply::Stored(s))) => s,
            Ok(Ok(other)) => return Err(Error::Backend(format!("unexpected answer to inspect: {other:?}"))),
            Ok(Err(e)) => return Err(Error::of_backend(&e, &self.r.cfg.url)),
            Err(_) => return Err(Error::Backend("inspect timed out".into())),
        };
        out.authority_tokens = stored.tokens;
        out.authority_refilled_at_ms = stored.refilled_at_ms;
        out.authority_ttl_ms = stored.ttl_ms;
        Ok(out)
    }

    /// `Err(Error::Misconfigured)` while the backend's last answer refused
    /// this limiter's configuration. The cold path asks it where the failure
    /// policy would decide: a misconfiguration is not an outage.
    pub(crate) fn misconfigured(&self) -> Result<()> {
        match self.misconfig.load().as_deref() {
            None => Ok(()),
            Some(reason) => Err(Error::Misconfigured {
                backend: crate::redact::redact_url(&self.r.cfg.url).into(),
                reason: reason.as_str().into(),
            }),
        }
    }

    /// Note what an answer says of the configuration: a refusal sets the
    /// reason, any success clears it. A new reason is logged once: by the
    /// circuit's `degraded` transition when this failure opens it, here when
    /// the circuit was open already (an outage, or another refusal, before).
    fn note_misconfig(&self, r: std::result::Result<(), &str>) {
        match r.err().and_then(crate::wire::misconfiguration) {
            Some(reason) => {
                let old = self.misconfig.swap(Some(Arc::new(reason.to_string())));
                if old.as_deref().map(String::as_str) != Some(reason) && self.circuit.is_open() {
                    tracing::error!(
                        url = %crate::RedactedUrl(&self.r.cfg.url),
                        "quotalease misconfigured: {reason}; acquire returns a configuration error until it is fixed"
                    );
                }
            }
            None if r.is_ok() && self.misconfig.load().is_some() => self.misconfig.store(None),
            None => {}
        }
    }

    /// Connect to the backend and run a probe that reads (never writes) one
    /// key through the script path leases take: `Ok` when a lease could be
    /// taken now, [`Error::Misconfigured`] when the backend refuses the
    /// configuration, [`Error::Backend`] when it cannot be reached in time.
    /// Each step is bounded by `backend_timeout_ms` (connecting, then the
    /// server's silence). Leaves the circuit and the failure policy alone.
    pub fn check(&self) -> Result<()> {
        self.check_open()?;
        if !self.is_inline() {
            self.broker()?;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.authority.call(
            Call::Check { key: CHECK_KEY.into() },
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        // The connection bounds each step; this only guards against a lost reply.
        let bound = Duration::from_millis(self.r.cfg.backend_timeout_ms * 4 + 1_000);
        match rx.recv_timeout(bound) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::of_backend(&e, &self.r.cfg.url)),
            Err(_) => Err(Error::Backend(format!(
                "check: no answer within {} ms",
                bound.as_millis()
            ))),
        }
    }

    pub fn metrics(&self) -> Metrics {
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
            shadow_denied: self.counters.shadow_denied.load(Relaxed),
            tokens_debited: self.counters.tokens_debited.load(Relaxed),
            ..Metrics::default()
        };
        self.table.sum_into(&mut m);
        m
    }
}

impl Tick for Engine {
    fn tick(&self) {
        if self.closed.load(Acquire) || fork::current() != self.gen.load(Relaxed) {
            return;
        }
        let now = self.clock.precise();
        let every = self.r.cfg.tuning.sweep_ms(self.r.cfg.lease_ttl_ms);
        if now.saturating_sub(self.last_sweep.load(Relaxed)) >= every {
            self.last_sweep.store(now, Relaxed);
            self.maintain_at(now);
        }
        self.refresh_policies(now, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClockKind;
    use crate::decision::Reason;

    fn engine(limit: u64, lease: u64, max_keys: usize) -> Arc<Engine> {
        Engine::new(Config {
            limit,
            window_ms: 1_000,
            lease_size: Some(lease),
            max_keys,
            clock: ClockKind::Manual { start_ms: 1_000 },
            ..Config::defaults()
        })
        .unwrap()
    }

    fn acquire(e: &Engine, key: &str) -> crate::Decision {
        match e.admit_local(key, 1, None).unwrap() {
            Some(d) => d,
            None => e.acquire_slow(key, 1, Waiting::Yes, None).unwrap(),
        }
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used_sixteenth() {
        let e = engine(100, 5, 32);
        for i in 0..32 {
            acquire(&e, &format!("k{i}"));
            e.clock.advance(1);
        }
        // k0 and k1 were the oldest; k0 is used again, so k1 and k2 are now.
        acquire(&e, "k0");
        e.clock.advance(1);
        acquire(&e, "new");
        let keys: Vec<String> = e.table.map.pin().keys().map(|k| k.to_string()).collect();
        assert_eq!(keys.len(), 31, "32 - 32/16 + 1");
        for gone in ["k1", "k2"] {
            assert!(!keys.iter().any(|k| k == gone), "{gone} evicted");
        }
        for kept in ["k0", "k3", "k31", "new"] {
            assert!(keys.iter().any(|k| k == kept), "{kept} kept");
        }
        // Their leased tokens went back (4 each: 5 leased, 1 spent).
        let m = e.metrics();
        assert_eq!(m.tokens_expired, 8);
        assert_eq!(m.tokens_returned, 8);
        assert_eq!(m.admitted, 34, "counts of evicted keys are kept");
    }

    #[test]
    fn an_exhausted_key_denies_locally_until_the_hint() {
        let e = engine(10, 5, 100);
        for _ in 0..10 {
            assert!(acquire(&e, "k").allowed);
        }
        // The prefetch that got 0 set the hint; denials until then cost no call.
        assert!(e.table.get("k").unwrap().exhausted_until.load(Relaxed) > e.clock.coarse());
        let calls_after_first = e.metrics().backend_calls;
        let mut d = acquire(&e, "k");
        for _ in 0..5 {
            d = acquire(&e, "k");
            assert_eq!((d.allowed, d.reason), (false, Reason::Exhausted));
            assert!(d.retry_after_ms >= 100, "{d:?}");
        }
        assert_eq!(e.metrics().backend_calls, calls_after_first);
        // Past the hint a token has refilled (100 ms each at 10/s).
        let hint = d.retry_after_ms;
        e.clock.advance(hint);
        assert!(acquire(&e, "k").allowed);
    }

    /// A thread that finds a lease call in flight judges it by that call's
    /// own time: a fresh entry's first call, claimed a moment ago (its time
    /// not stored yet, `sent_at` 0), is not a lost one, however long the
    /// process has run (the clock counts from the process' first reading).
    #[test]
    fn a_call_claimed_a_moment_ago_is_not_taken_for_a_lost_one() {
        let e = Engine::new(Config {
            limit: 10,
            window_ms: 1_000,
            lease_size: Some(5),
            backend_timeout_ms: 1,
            ..Config::defaults()
        })
        .unwrap();
        // a call in flight this long would be lost
        let stale = 4 + 1_000;
        while e.clock.precise() <= stale {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let entry = e.entry_with("k", crate::bucket::Quota::new(10, 1_000), false);
        entry.in_flight.store(true, Release);
        assert!(
            !e.start_lease(&entry, 1, 1, 0),
            "another call sent beside the one claimed"
        );
        assert_eq!(e.metrics().backend_calls, 0);
        // once that call's time is stored, it is judged by it: lost when old
        entry.sent_at.store(1, Release);
        assert!(
            e.start_lease(&entry, 1, 1, 0),
            "a call in flight since the clock's first ms is lost"
        );
        assert_eq!(e.metrics().backend_calls, 1);
    }

    #[test]
    fn the_cold_path_on_memory_never_leaves_a_request_pending() {
        let e = engine(3, 3, 100);
        // try_acquire on an inline authority decides at once: lease or exhausted.
        let d = e.acquire_slow("k", 1, Waiting::No, None).unwrap();
        assert_eq!((d.allowed, d.reason), (true, Reason::Lease));
        assert!(!e.table.get("k").unwrap().in_flight.load(Relaxed));
        assert_eq!(e.pending.load(Relaxed), 0, "every inline call was finished");
        // A cost above what is left locally and in the authority: exhausted.
        let d = e.acquire_slow("k", 3, Waiting::No, None).unwrap();
        assert_eq!((d.allowed, d.reason), (false, Reason::Exhausted));
        assert_eq!(e.table.get("k").unwrap().tokens.load(Relaxed), 2, "local tokens kept");
    }
}
