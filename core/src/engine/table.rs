//! The key table: one [`Entry`] per key this limiter has seen, its eviction
//! when more than `max_keys` are tracked, the idle sweep, lease-TTL expiry
//! (tokens unused for `lease_ttl_ms` go back to the authority) and flush.

use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::entry::Entry;
use super::{lock, Engine};
use crate::bucket::Quota;
use crate::calendar::Calendar;
use crate::error::Result;
use crate::metrics::{Counters, Metrics};

/// Entries idle this many lease TTLs (with no tokens) leave the table.
const IDLE_TTLS: u64 = 30;
/// When the table is full, this fraction of `max_keys` (the least recently
/// used) is evicted in one pass: the pass is O(keys), so its cost spread
/// over the inserts it makes room for is constant.
const EVICT_FRACTION: usize = 16;

/// Keyed by the entry's own name (one allocation of the key for both).
type Map = papaya::HashMap<Arc<str>, Arc<Entry>, foldhash::fast::RandomState>;

/// A key as the table looks it up: hashed as the `str` it is, compared
/// inline. `str`'s own equality calls libc's `memcmp`, which cost 26 of the
/// warm admit's 279 instructions on a 7-byte key (callgrind,
/// docs/benchmarks.md); two overlapping word compares cost a few.
#[derive(Clone, Copy)]
pub(super) struct Lookup<'a>(pub &'a str);

impl std::hash::Hash for Lookup<'_> {
    #[inline(always)]
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl papaya::Equivalent<Arc<str>> for Lookup<'_> {
    #[inline(always)]
    fn equivalent(&self, key: &Arc<str>) -> bool {
        same_bytes(self.0.as_bytes(), key.as_bytes())
    }
}

/// `a == b`, without libc for slices up to 16 bytes. Not inlined: in the
/// lookup's probe loop it made papaya's `get` too large to inline.
#[inline(never)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let w8 = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let w4 = |s: &[u8], i: usize| u32::from_ne_bytes(s[i..i + 4].try_into().expect("4 bytes"));
    match n {
        // the first and the last word overlap when n < 16
        8..=16 => w8(a, 0) == w8(b, 0) && w8(a, n - 8) == w8(b, n - 8),
        4..=7 => w4(a, 0) == w4(b, 0) && w4(a, n - 4) == w4(b, n - 4),
        0..=3 => a.iter().zip(b).all(|(x, y)| x == y),
        _ => a == b,
    }
}

pub(super) struct Table {
    pub(super) map: Map,
    max_keys: usize,
    /// One eviction pass at a time; a thread inserting into a full table
    /// waits for the pass under way (so the table grows past `max_keys` by
    /// at most the threads inserting at once, not by what they insert while
    /// a pass runs).
    evicting: Mutex<()>,
}

impl Table {
    pub fn new(max_keys: usize) -> Self {
        Table {
            // Blocking resizes: an incremental resize left unfinished (no
            // further inserts) makes every later lookup search two tables.
            map: papaya::HashMap::builder()
                .hasher(foldhash::fast::RandomState::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            max_keys,
            evicting: Mutex::new(()),
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Entry>> {
        self.map.pin().get(&Lookup(key)).cloned()
    }

    /// The keys to evict when the table is full: the least recently used
    /// `max_keys / 16` (at least one), keys with a request in flight last
    /// (a lease call, or tokens out on reservations and permits: an entry
    /// that leaves the table no longer reports them held).
    fn eviction_victims(&self) -> Vec<Arc<str>> {
        let guard = self.map.pin();
        let mut all: Vec<(bool, u64, &Arc<str>)> = guard
            .iter()
            .map(|(k, e)| {
                let busy = e.in_flight.load(Relaxed) || e.reserved.load(Relaxed) > 0;
                (busy, e.last_used.load(Relaxed), k)
            })
            .collect();
        let n = (self.max_keys / EVICT_FRACTION).max(1).min(all.len());
        if n == 0 {
            return Vec::new();
        }
        if n < all.len() {
            all.select_nth_unstable(n - 1);
        }
        all.truncate(n);
        all.into_iter().map(|(_, _, k)| k.clone()).collect()
    }

    /// Tokens held now and per-key counters, added into `m`.
    pub fn sum_into(&self, m: &mut Metrics) {
        let guard = self.map.pin();
        m.keys_tracked = guard.len() as u64;
        for (_, e) in guard.iter() {
            // A further rule's bucket: its requests are counted on the key's own entry.
            if !e.sub {
                m.admitted += e.admitted.load(Relaxed);
                m.denied += e.denied.load(Relaxed);
            }
            m.overshoot_bound += e.tokens.load(Relaxed);
        }
    }

    /// In a forked child: drop every leased token, rate grant and
    /// reservation count, forget calls in flight.
    pub fn forget_leases(&self) -> u64 {
        let guard = self.map.pin();
        let mut dropped = 0;
        for (_, e) in guard.iter() {
            dropped += e.tokens.swap(0, AcqRel);
            // the parent's reservations are not this process's to report
            e.reserved.store(0, Release);
            let _ = e.end_rate();
            e.in_flight.store(false, Release);
        }
        dropped
    }
}

impl Engine {
    /// The entry of one bucket (a key's own, or with `sub` a further
    /// rule's), created (after eviction when full) with `policy` if new.
    pub(super) fn entry_with(&self, key: &str, policy: Quota, sub: bool) -> Arc<Entry> {
        if let Some(e) = self.table.get(key) {
            return e;
        }
        // The ticker gives idle leases back (memory:// too); Redis limiters
        // also register on their first call.
        if !self.clock.is_manual() && self.ticking.load(Relaxed) != crate::fork::current() {
            let _ = self.broker();
        }
        if self.table.map.len() >= self.table.max_keys {
            self.evict();
        }
        let now = self.clock.precise();
        let (_, threshold) = self.lease_params(policy);
        // Adaptive: keep a token on hand for a remote authority (a round
        // trip away); an inline one answers at once, so no prefetch.
        let threshold = if self.r.adaptive {
            u64::from(!self.is_inline() && !self.single(policy))
        } else {
            threshold
        };
        let key: Arc<str> = key.into();
        self.table
            .map
            .pin()
            .get_or_insert_with(key.clone(), || Arc::new(Entry::with(key, policy, threshold, now, sub)))
            .clone()
    }

    /// Evict the least recently used sixteenth of `max_keys`.
    fn evict(&self) {
        let _pass = lock(&self.table.evicting);
        if self.table.map.len() < self.table.max_keys {
            return; // the pass this thread waited for made room
        }
        let victims = self.table.eviction_victims();
        let guard = self.table.map.pin();
        for k in victims {
            if let Some(e) = guard.remove(&k) {
                self.retire(e);
            }
        }
    }

    fn retire(&self, e: &Entry) {
        e.retired.store(true, SeqCst);
        let t = e.tokens.swap(0, AcqRel);
        Counters::add(&self.counters.tokens_expired, t);
        self.give_back(e, e.policy(), t);
        if !e.sub {
            // Swapped, so a request counted on it from here on is moved by
            // `Engine::count` instead (counted once either way).
            Counters::add(&self.counters.admitted_retired, e.admitted.swap(0, SeqCst));
            Counters::add(&self.counters.denied_retired, e.denied.swap(0, SeqCst));
        }
    }

    /// Lease TTL, applied lazily on the cold path as well as by the sweeper.
    pub(super) fn expire_if_idle(&self, e: &Entry, p: Quota, now: u64) -> u64 {
        let last = e.last_used.load(Relaxed);
        // The ledger's commitment ends at `lease_until` (I3): the tokens go
        // back before the authority forgets them.
        let until = e.lease_until.load(Acquire);
        let expired = until != 0 && now >= until;
        let idle = now.saturating_sub(last) >= self.r.cfg.lease_ttl_ms;
        if (!idle && !expired) || e.tokens.load(Relaxed) == 0 {
            if e.rate.load(Acquire) > 0 && now >= e.rate_until.load(Acquire) {
                // Take what it accrued up to its end first (within the
                // commitment, I3): the authority paid for all of it, and a
                // rate ended unseen lost up to a period's accrual.
                if !expired {
                    self.accrue(e, now, e.commit.load(Relaxed), 0);
                }
                e.rate_ran_out();
            } else if idle
                && e.rate.load(Acquire) > 0
                && now.saturating_sub(e.sent_at.load(Relaxed)) >= self.r.cfg.lease_ttl_ms
            {
                // A rate that admitted nothing since its call a lease TTL ago
                // would hold the key's refill until it ends: hand it back.
                self.give_back(e, p, 0);
            }
            return 0;
        }
        let t = e.tokens.swap(0, AcqRel);
        if t > 0 {
            Counters::add(&self.counters.tokens_expired, t);
            self.give_back(e, p, t);
        }
        t
    }

    /// A permit bucket with permits in use renews its commitment when half
    /// of it has run: the permits stay committed at the authority while
    /// their requests run, however long (a lease call reports them held).
    fn renew_permits(&self, e: &Arc<Entry>, now: u64) {
        if Calendar(e.calendar.load(Relaxed)).is_in_flight() && e.reserved.load(Acquire) > 0 {
            let until = e.lease_until.load(Acquire);
            if until != 0 && now + self.r.cfg.tuning.commit_ms / 2 >= until {
                // want 0: re-commit what it holds, take nothing more
                self.start_lease(e, 0, 1, 0);
            }
        }
    }

    /// Lease TTL and idle-entry sweep (broker ticker, or `settle()`).
    pub(super) fn maintain_at(&self, now: u64) {
        if self.closed.load(Acquire) {
            return;
        }
        let idle_drop = self.r.cfg.lease_ttl_ms.saturating_mul(IDLE_TTLS).max(60_000);
        let guard = self.table.map.pin();
        let mut gone = Vec::new();
        for (k, e) in guard.iter() {
            self.expire_if_idle(e, e.policy(), now);
            if e.rate.load(Acquire) > 0 && now < e.rate_until.load(Acquire) {
                // A running rate's accrual is taken at each sweep too: it
                // is bounded by the most held since it was last taken
                // (`Accrual::peak`), which a sweep brings down to what is
                // held now; when nothing was held since, there is nothing
                // to bring down and the next request takes it. Never past
                // the commitment's expiry (I3): the admit path would spend
                // what it took.
                let until = e.lease_until.load(Acquire);
                if (until == 0 || now < until) && !e.nothing_held_since_accrual() {
                    self.accrue(e, now, e.commit.load(Relaxed), 0);
                }
            }
            self.renew_permits(e, now);
            let idle = now.saturating_sub(e.last_used.load(Relaxed));
            if idle >= idle_drop
                && e.tokens.load(Relaxed) == 0
                && !e.in_flight.load(Relaxed)
                && e.reserved.load(Relaxed) == 0
            {
                gone.push(k.clone());
            }
        }
        for k in gone {
            if let Some(e) = guard.remove(&k) {
                self.retire(e);
            }
        }
    }

    /// Give every leased token back and wait for the authority to take them.
    pub(crate) fn flush(&self) -> Result<()> {
        let bound = Duration::from_millis(self.r.cfg.backend_timeout_ms * 4 + 100);
        // Leases in flight land first, so their tokens are given back too.
        self.wait_idle(bound)?;
        let guard = self.table.map.pin();
        for (_, e) in guard.iter() {
            let t = e.tokens.swap(0, AcqRel);
            self.give_back(e, e.policy(), t);
        }
        drop(guard);
        self.wait_idle(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn keys_compare_byte_for_byte_at_every_length() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(7).wrapping_add(1)).collect();
            assert!(same_bytes(&a, &a.clone()), "length {n}");
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x20;
                assert!(!same_bytes(&a, &b), "length {n}, byte {i} differs");
            }
            assert!(!same_bytes(&a, &a[..n.saturating_sub(1)]) || n == 0);
        }
    }
}
