//! The in-memory authority (`memory://`, `memory://NAME`): the embedded
//! default and the single-process authority. Same math as the Redis scripts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::embedded::Host;
use super::{Call, PolicyOp, PolicyReply, Reply, Stored};
use crate::bucket::{BucketState, Grant, Quota};
use crate::guard::{Guard, Seen, Stamp};
use crate::ledger;
use crate::wire::{Back, Now};

/// A fixed-lease (or fallback) bucket and its failover stamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyState {
    pub bucket: BucketState,
    pub stamp: Stamp,
}

impl KeyState {
    fn new(policy: Quota, now: u64) -> Self {
        KeyState {
            bucket: BucketState::full(policy, now),
            stamp: Stamp::new(now),
        }
    }

    fn refill(&mut self, p: Quota, now: u64) {
        self.bucket.refill(p, now);
    }

    /// The failover guard of fixed leases: a lost state re-debits the
    /// holder's recent grants (see `guard.rs`).
    fn guard(&mut self, p: Quota, g: &Guard, now: u64) -> bool {
        if !self.stamp.lost(g) {
            return false;
        }
        self.refill(p, now);
        self.bucket.debit(p, g.recent.min(p.limit), now, 0, 0);
        true
    }

    fn alive_ms(&self, p: Quota, now: u64) -> u64 {
        self.bucket.ms_until_full(p) + self.bucket.ts.saturating_sub(now)
    }

    fn is_idle(&self, p: Quota, now: u64) -> bool {
        let mut probe = self.clone();
        probe.refill(p, now);
        probe.bucket.ms_until_full(p) == 0
    }
}

/// What a fixed-lease call on a key held by the ledger answers (the same
/// text as the Redis scripts' error).
const MIXED: &str = "QL_MIXED fixed leases (lease_size) on a key that limiters without lease_size hold with \
                     adaptive leasing: every limiter of a key must agree on lease_size";

/// Keys kept before idle ones are swept (an idle key equals a missing one).
const SWEEP_EVERY: usize = 4096;

pub(crate) struct MemoryAuthority {
    buckets: Mutex<Buckets>,
    /// Adaptive keys: the ledger script in the embedded Lua.
    ledger: Mutex<Host>,
    /// The policy store of this authority (`memory://NAME`: shared by the
    /// process's limiters with that NAME), the same as Redis' `{prefix:policy}`.
    policies: Mutex<PolicyStore>,
    /// A simulated outage ([`crate::testing::memory_outage`]): every call fails.
    down: std::sync::atomic::AtomicBool,
    /// Simulated lost replies ([`crate::testing::memory_lose_replies`]):
    /// every call is carried out and its caller hears nothing.
    mute: std::sync::atomic::AtomicBool,
}

/// Every key's state of a memory authority at one moment (for tests of the
/// failover guard: [`crate::testing::memory_snapshot`]).
#[cfg(feature = "test-util")]
#[derive(Clone, Debug)]
pub struct Snapshot(HashMap<String, (KeyState, Quota)>, super::embedded::Store);

impl Default for MemoryAuthority {
    fn default() -> Self {
        MemoryAuthority {
            buckets: Mutex::default(),
            ledger: Mutex::new(Host::new(ledger::SCRIPT)),
            policies: Mutex::default(),
            down: Default::default(),
            mute: Default::default(),
        }
    }
}

/// The two keys the ledger keeps for `key`: its state and its expiries.
pub(crate) fn ledger_keys(key: &str) -> Vec<String> {
    ledger::keys(key)
}

#[derive(Default)]
struct Buckets {
    map: HashMap<String, (KeyState, Quota)>,
    sweep_at: usize,
    ledger_sweep_at: usize,
}

/// The in-process policy store: what the Redis store's four keys hold.
#[derive(Default)]
struct PolicyStore {
    tiers: std::collections::BTreeMap<String, String>,
    keys: std::collections::BTreeMap<String, String>,
    version: u64,
    /// The newest [`super::POLICY_LOG_LEN`] changes, newest first.
    log: std::collections::VecDeque<String>,
}

impl PolicyStore {
    fn answer(&mut self, op: PolicyOp) -> PolicyReply {
        let all = |m: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        match op {
            PolicyOp::Poll { since } => {
                let keys = self.keys.len() as u64;
                if since == self.version {
                    return PolicyReply::Poll {
                        version: self.version,
                        keys,
                        tiers: None,
                        changed: Some(Vec::new()),
                    };
                }
                let d = self.version.wrapping_sub(since);
                let changed = (since != 0 && since < self.version && d <= self.log.len() as u64).then(|| {
                    let log: Vec<String> = self.log.iter().take(d as usize).cloned().collect();
                    PolicyReply::changed_keys(&log)
                });
                PolicyReply::Poll {
                    version: self.version,
                    keys,
                    tiers: Some(all(&self.tiers)),
                    changed,
                }
            }
            PolicyOp::Get { keys } => PolicyReply::Values(keys.iter().map(|k| self.keys.get(k).cloned()).collect()),
            PolicyOp::Set { tier, name, value } => {
                let map = if tier { &mut self.tiers } else { &mut self.keys };
                match value {
                    Some(v) => map.insert(name.clone(), v),
                    None => map.remove(&name),
                };
                self.version += 1;
                self.log.push_front(format!("{} {name}", if tier { 't' } else { 'k' }));
                self.log.truncate(super::POLICY_LOG_LEN as usize);
                PolicyReply::Version(self.version)
            }
            PolicyOp::List => PolicyReply::List {
                version: self.version,
                tiers: all(&self.tiers),
                keys: all(&self.keys),
            },
        }
    }
}

fn registry() -> &'static Mutex<HashMap<String, Weak<MemoryAuthority>>> {
    static REG: OnceLock<Mutex<HashMap<String, Weak<MemoryAuthority>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a bucket half-written (every
    // update is a plain copy), so a poisoned lock is safe to keep using.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryAuthority {
    /// A private authority, or the process-wide one registered under `name`.
    pub fn open(name: Option<&str>) -> Arc<Self> {
        let Some(name) = name else {
            return Arc::new(Self::default());
        };
        let mut reg = lock(registry());
        if let Some(a) = reg.get(name).and_then(Weak::upgrade) {
            return a;
        }
        reg.retain(|_, w| w.strong_count() > 0);
        let a = Arc::new(Self::default());
        reg.insert(name.to_string(), Arc::downgrade(&a));
        a
    }

    /// Answer one call inline (an error only during a simulated outage).
    pub fn answer(&self, call: Call) -> Result<Reply, String> {
        if self.down.load(std::sync::atomic::Ordering::Acquire) {
            return Err(crate::wire::unsent(
                "the memory authority is unreachable (simulated outage)".into(),
            ));
        }
        if self.mute.load(std::sync::atomic::Ordering::Acquire) {
            let _ = self.answer_up(call);
            return Err(crate::wire::silence(format_args!(
                "no reply from the memory authority (simulated: replies lost)"
            )));
        }
        self.answer_up(call)
    }

    /// Whether the ledger holds `key` (adaptive leasing).
    fn is_ledger(&self, key: &str, now: u64) -> bool {
        lock(&lock(&self.ledger).store).hash(key, now).is_some()
    }

    /// Drop expired ledger states now and then (Redis' active expiry).
    fn sweep_ledger(&self, host: &Host, now: u64) {
        let mut st = host.store.lock().unwrap_or_else(|p| p.into_inner());
        if st.len() >= lock(&self.buckets).ledger_sweep_at {
            st.sweep(now);
            lock(&self.buckets).ledger_sweep_at = st.len() + SWEEP_EVERY;
        }
    }

    fn answer_up(&self, call: Call) -> Result<Reply, String> {
        Ok(match call {
            Call::Policy { op, .. } => Reply::Policy(lock(&self.policies).answer(op)),
            Call::Check { .. } => Reply::Checked,
            Call::Lease {
                key,
                policy,
                want,
                need,
                now,
                adaptive: Some(ask),
                guard,
            } => {
                let argv = ledger::args(
                    "l",
                    policy,
                    Now { explicit: true, ..now }.parts(),
                    &ask,
                    want,
                    need,
                    (guard.epoch, guard.version, guard.alive_ms),
                );
                // A fixed-lease bucket of the key is taken over, as Redis'
                // script does with the string it finds.
                lock(&self.buckets).map.remove(&key);
                let host = lock(&self.ledger);
                let r = host.eval(&ledger_keys(&key), &argv, now.ms)?;
                self.sweep_ledger(&host, now.ms);
                return super::ledger_reply(&r);
            }
            Call::Lease {
                key,
                policy,
                want,
                need,
                now,
                adaptive: None,
                guard,
            } => {
                if self.is_ledger(&key, now.ms) {
                    return Err(MIXED.into());
                }
                let mut b = lock(&self.buckets);
                let (grant, seen) = b.with_key(&key, policy, now.ms, |st| {
                    let lost = st.guard(policy, &guard, now.ms);
                    st.refill(policy, now.ms);
                    let grant = st.bucket.take(policy, want, need, now.ms);
                    st.stamp.version += 1;
                    let seen = Seen {
                        epoch: st.stamp.epoch,
                        version: st.stamp.version,
                        alive_ms: st.alive_ms(policy, now.ms),
                        lost,
                    };
                    (grant, seen)
                });
                Reply::Grant(grant, None, seen)
            }
            Call::GiveBack {
                key,
                policy,
                tokens,
                now,
                holder,
                adaptive: true,
                leaving,
                seen,
                what,
                tuning,
            } => {
                let ask = ledger::Ask {
                    holder,
                    held: tokens,
                    applied: seen,
                    tuning,
                    ..Default::default()
                };
                let op = what.ledger_op(leaving);
                let argv = ledger::args(op, policy, Now { explicit: true, ..now }.parts(), &ask, 0, 0, (0, 0, 0));
                // A fixed-lease bucket of the key is taken over, as Redis'
                // script does with the string it finds.
                lock(&self.buckets).map.remove(&key);
                let host = lock(&self.ledger);
                host.eval(&ledger_keys(&key), &argv, now.ms)?;
                Reply::Returned
            }
            Call::GiveBack {
                key,
                policy,
                tokens,
                now,
                what,
                ..
            } => {
                let mut b = lock(&self.buckets);
                if what == Back::Debit {
                    // a missing key is a full bucket: the debit creates it
                    b.with_key(&key, policy, now.ms, |st| {
                        st.bucket.debit(policy, tokens, now.ms, 0, 0);
                        st.stamp.version += 1;
                    });
                } else if b.map.contains_key(&key) {
                    b.with_key(&key, policy, now.ms, |st| {
                        st.refill(policy, now.ms);
                        st.bucket.give_back(policy, tokens, now.ms);
                        st.stamp.version += 1;
                    });
                }
                Reply::Returned
            }
            Call::Inspect { key, policy, now } => {
                let fields = lock(&self.ledger)
                    .store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .hash(&key, now.ms);
                // the ledger's hash, read with the one codec of the stored format
                if let Some(st) = fields.and_then(|h| crate::stored::Stored::from_hash(h.into_iter().collect())) {
                    return Ok(Reply::Stored(Stored {
                        tokens: Some(st.bucket.tokens().unwrap_or(0).min(policy.limit)),
                        refilled_at_ms: st.bucket.refilled_at,
                        ttl_ms: None,
                    }));
                }
                let b = lock(&self.buckets);
                Reply::Stored(match b.map.get(&key) {
                    Some((st, _)) => {
                        let mut st = st.clone();
                        st.refill(policy, now.ms);
                        Stored {
                            tokens: Some(st.bucket.whole_tokens(policy)),
                            refilled_at_ms: Some(st.bucket.ts),
                            ttl_ms: None,
                        }
                    }
                    None => Stored::default(),
                })
            }
        })
    }

    #[cfg(feature = "test-util")]
    /// Start or end a simulated outage of the authority registered under `name`.
    /// False when no such authority is open.
    pub fn set_down(name: &str, down: bool) -> bool {
        Self::with_named(name, |a| a.down.store(down, std::sync::atomic::Ordering::Release))
    }

    #[cfg(feature = "test-util")]
    /// Run `f` on the authority registered under `name`; false when no such
    /// authority is open.
    fn with_named(name: &str, f: impl FnOnce(&MemoryAuthority)) -> bool {
        let a = lock(registry()).get(name).and_then(Weak::upgrade);
        a.map(|a| f(&a)).is_some()
    }

    #[cfg(feature = "test-util")]
    /// Start or end simulated lost replies of the authority registered under
    /// `name`. False when no such authority is open.
    pub fn set_mute(name: &str, mute: bool) -> bool {
        Self::with_named(name, |a| a.mute.store(mute, std::sync::atomic::Ordering::Release))
    }

    #[cfg(feature = "test-util")]
    /// Forget every key of the authority registered under `name`, as a
    /// Redis restarted empty would. False when no such authority is open.
    pub fn reset(name: &str) -> bool {
        Self::with_named(name, |a| {
            lock(&a.buckets).map.clear();
            lock(&lock(&a.ledger).store).clear();
        })
    }

    #[cfg(feature = "test-util")]
    /// A copy of every key's state of the authority under `name`, to put
    /// back with [`MemoryAuthority::restore`] (a replica that missed the
    /// writes since, promoted).
    pub fn snapshot(name: &str) -> Option<Snapshot> {
        let a = lock(registry()).get(name).and_then(Weak::upgrade)?;
        let map = lock(&a.buckets).map.clone();
        let store = lock(&lock(&a.ledger).store).clone();
        Some(Snapshot(map, store))
    }

    #[cfg(feature = "test-util")]
    /// Put back a [`MemoryAuthority::snapshot`]. False when no such authority is open.
    pub fn restore(name: &str, snap: &Snapshot) -> bool {
        Self::with_named(name, |a| {
            lock(&a.buckets).map = snap.0.clone();
            *lock(&lock(&a.ledger).store) = snap.1.clone();
        })
    }

    /// A plain lease (no holder), for the static-share fallback buckets.
    pub fn lease(&self, key: &str, policy: Quota, want: u64, need: u64, now: u64) -> Grant {
        let mut b = lock(&self.buckets);
        b.with_key(key, policy, now, |st| {
            st.refill(policy, now);
            st.bucket.take(policy, want, need, now)
        })
    }

    /// Hold `key`'s bucket (made full if missing) to at most `tokens`, after
    /// its refill up to `now`: the failure policy's bucket never holds more
    /// than the instance's part of what the authority last said the key
    /// held. Only ever lowers it, so a circuit that opens again and again
    /// (a Redis Cluster with one master down) never refills it.
    pub fn cap(&self, key: &str, policy: Quota, tokens: u64, now: u64) {
        let mut b = lock(&self.buckets);
        b.with_key(key, policy, now, |st| {
            st.refill(policy, now);
            let most = tokens.min(policy.limit) * policy.window_ms;
            if st.bucket.credit > most {
                st.bucket.credit = most;
            }
        });
    }
}

impl Buckets {
    /// Run `f` on the key's state (created full if missing), then sweep idle
    /// keys now and then.
    fn with_key<R>(&mut self, key: &str, policy: Quota, now: u64, f: impl FnOnce(&mut KeyState) -> R) -> R {
        let r = match self.map.get_mut(key) {
            Some((st, p)) => {
                *p = policy;
                f(st)
            }
            None => {
                let mut st = KeyState::new(policy, now);
                let r = f(&mut st);
                self.map.insert(key.to_string(), (st, policy));
                r
            }
        };
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, (st, p)| !st.is_idle(*p, now));
            self.sweep_at = self.map.len() + SWEEP_EVERY;
        }
        r
    }
}
