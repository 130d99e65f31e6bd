//! One key's local lease: the atomics the admit path touches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use crate::bucket::Policy;

/// Per-key state. Everything the admit path touches sits in the first cache
/// line; the map holding entries sees lookups, not writes.
#[repr(align(64))]
pub(crate) struct Entry {
    /// Leased tokens held locally, spent by compare-and-swap.
    pub tokens: AtomicU64,
    /// Coarse clock reading of the last admit (lease TTL, eviction).
    pub last_used: AtomicU64,
    /// Requests admitted / denied on this key (summed by `metrics()`).
    pub admitted: AtomicU64,
    pub denied: AtomicU64,
    /// A lease request for this key is in flight.
    pub in_flight: AtomicBool,
    /// Clock reading when the in-flight request started (stale-request guard).
    pub in_flight_since: AtomicU64,
    /// The entry left the table; tokens granted to it go straight back.
    pub retired: AtomicBool,
    /// Until this clock reading the authority said: empty (denials are local).
    pub exhausted_until: AtomicU64,
    /// ...for requests needing at least this many tokens from the authority.
    pub exhausted_need: AtomicU64,
    /// Tokens the authority had left after the last grant (for `remaining`).
    pub auth_remaining: AtomicU64,
    /// The key's policy (config default or `set_limit` override).
    pub limit: AtomicU64,
    pub window_ms: AtomicU64,
    pub key: Box<str>,
}

impl Entry {
    pub fn new(key: &str, policy: Policy, now: u64) -> Self {
        Entry {
            tokens: AtomicU64::new(0),
            last_used: AtomicU64::new(now),
            admitted: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            in_flight: AtomicBool::new(false),
            in_flight_since: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            exhausted_until: AtomicU64::new(0),
            exhausted_need: AtomicU64::new(1),
            auth_remaining: AtomicU64::new(policy.limit),
            limit: AtomicU64::new(policy.limit),
            window_ms: AtomicU64::new(policy.window_ms),
            key: key.into(),
        }
    }

    #[inline]
    pub fn policy(&self) -> Policy {
        Policy {
            limit: self.limit.load(Relaxed),
            window_ms: self.window_ms.load(Relaxed),
        }
    }

    /// Spend `cost` local tokens if there are that many. Returns what is left.
    #[inline]
    pub fn try_take(&self, cost: u64) -> Option<u64> {
        let mut cur = self.tokens.load(Relaxed);
        loop {
            if cur < cost {
                return None;
            }
            match self.tokens.compare_exchange_weak(cur, cur - cost, AcqRel, Relaxed) {
                Ok(_) => return Some(cur - cost),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Record use at `now` without writing the line when nothing changed.
    #[inline]
    pub fn touch(&self, now: u64) {
        if self.last_used.load(Relaxed) != now {
            self.last_used.store(now, Relaxed);
        }
    }
}
