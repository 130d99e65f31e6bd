//! The in-memory authority (`memory://`, `memory://NAME`): the embedded
//! default and the single-process authority. Same math as the Redis scripts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::{Call, Reply, Stored};
use crate::bucket::{BucketState, Grant, Policy};

/// Buckets kept before full ones are swept (a full bucket equals a missing one).
const SWEEP_EVERY: usize = 4096;

#[derive(Default)]
pub(crate) struct MemoryAuthority {
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    map: HashMap<String, (BucketState, Policy)>,
    sweep_at: usize,
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

    /// Answer one call inline.
    pub fn answer(&self, call: Call) -> Reply {
        match call {
            Call::Lease {
                key,
                policy,
                want,
                need,
                now,
            } => Reply::Grant(self.lease(&key, policy, want, need, now.ms)),
            Call::GiveBack {
                key,
                policy,
                tokens,
                now,
            } => {
                self.give_back(&key, policy, tokens, now.ms);
                Reply::Returned
            }
            Call::Inspect { key, policy, now } => Reply::Stored(match self.peek(&key, policy, now.ms) {
                Some((tokens, ts)) => Stored {
                    tokens: Some(tokens),
                    refilled_at_ms: Some(ts),
                    ttl_ms: None,
                },
                None => Stored::default(),
            }),
        }
    }

    pub fn lease(&self, key: &str, policy: Policy, want: u64, need: u64, now: u64) -> Grant {
        let mut b = lock(&self.buckets);
        let grant = match b.map.get_mut(key) {
            Some((s, p)) => {
                *p = policy;
                s.take(policy, want, need, now)
            }
            None => {
                let mut s = BucketState::full(policy, now);
                let g = s.take(policy, want, need, now);
                b.map.insert(key.to_string(), (s, policy));
                g
            }
        };
        if b.map.len() >= b.sweep_at {
            // A full bucket reads the same as a missing one: forget those.
            b.map.retain(|_, (s, p)| {
                let mut probe = *s;
                probe.refill(*p, now);
                probe.ms_until_full(*p) > 0
            });
            b.sweep_at = b.map.len() + SWEEP_EVERY;
        }
        grant
    }

    pub fn give_back(&self, key: &str, policy: Policy, tokens: u64, now: u64) -> u64 {
        let mut b = lock(&self.buckets);
        match b.map.get_mut(key) {
            Some((s, p)) => {
                *p = policy;
                s.give_back(policy, tokens, now)
            }
            None => policy.limit,
        }
    }

    /// The stored state of a key, for `inspect` and tests.
    pub fn peek(&self, key: &str, policy: Policy, now: u64) -> Option<(u64, u64)> {
        let b = lock(&self.buckets);
        b.map.get(key).map(|(s, _)| {
            let mut s = *s;
            s.refill(policy, now);
            (s.whole_tokens(policy), s.ts)
        })
    }
}
