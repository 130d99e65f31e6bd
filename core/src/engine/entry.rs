//! One key's local lease: the atomics the admit path touches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use crate::bucket::Policy;

/// Per-key state. `repr(C)` keeps the declared order, so everything the
/// admit path reads or writes (the first seven fields, 49 bytes) sits in the
/// first cache line of the 64-byte-aligned entry (a unit test checks it).
#[repr(C, align(64))]
pub(crate) struct Entry {
    /// Leased tokens held locally, spent by compare-and-swap.
    pub tokens: AtomicU64,
    /// Coarse clock reading of the last admit (lease TTL, eviction).
    pub last_used: AtomicU64,
    /// Requests admitted on this key (summed by `metrics()`).
    pub admitted: AtomicU64,
    /// The key's policy (config default or `set_limit` override).
    pub limit: AtomicU64,
    pub window_ms: AtomicU64,
    /// Tokens the authority had left after the last grant (for `remaining`).
    pub auth_remaining: AtomicU64,
    /// A lease request for this key is in flight.
    pub in_flight: AtomicBool,
    // --- the cold path's fields ---
    /// The entry left the table; tokens granted to it go straight back.
    pub retired: AtomicBool,
    /// Requests denied on this key.
    pub denied: AtomicU64,
    /// Clock reading when the in-flight request started (stale-request guard).
    pub in_flight_since: AtomicU64,
    /// Until this clock reading the authority said: empty (denials are local).
    pub exhausted_until: AtomicU64,
    /// ...for requests needing at least this many tokens from the authority.
    pub exhausted_need: AtomicU64,
    pub key: Box<str>,
}

impl Entry {
    pub fn new(key: &str, policy: Policy, now: u64) -> Self {
        Entry {
            tokens: AtomicU64::new(0),
            last_used: AtomicU64::new(now),
            admitted: AtomicU64::new(0),
            limit: AtomicU64::new(policy.limit),
            window_ms: AtomicU64::new(policy.window_ms),
            auth_remaining: AtomicU64::new(policy.limit),
            in_flight: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            denied: AtomicU64::new(0),
            in_flight_since: AtomicU64::new(0),
            exhausted_until: AtomicU64::new(0),
            exhausted_need: AtomicU64::new(1),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn the_admit_path_fields_share_the_first_cache_line() {
        assert_eq!(align_of::<Entry>(), 64);
        assert!(offset_of!(Entry, in_flight) + size_of::<AtomicBool>() <= 64);
        for off in [
            offset_of!(Entry, tokens),
            offset_of!(Entry, last_used),
            offset_of!(Entry, admitted),
            offset_of!(Entry, limit),
            offset_of!(Entry, window_ms),
            offset_of!(Entry, auth_remaining),
        ] {
            assert!(off + 8 <= 64, "offset {off}");
        }
    }

    #[test]
    fn try_take_spends_only_what_is_there() {
        let e = Entry::new(
            "k",
            Policy {
                limit: 10,
                window_ms: 1000,
            },
            0,
        );
        assert_eq!(e.try_take(1), None);
        e.tokens.store(3, Relaxed);
        assert_eq!(e.try_take(2), Some(1));
        assert_eq!(e.try_take(2), None);
        assert_eq!(e.try_take(1), Some(0));
    }
}
