//! Token-bucket math shared by every authority.
//!
//! The in-memory authority runs this code; the Redis scripts of fixed
//! leases (`authority/lua/`) implement the same arithmetic in Lua, and the
//! conformance vectors check that both give identical answers.
//!
//! Exactness: the bucket is kept in *credit units* of `1 / window_ms` token.
//! One elapsed millisecond adds exactly `limit` units, one whole token is
//! `window_ms` units, so refill and grants are integer arithmetic with no
//! rounding: no fractional token is ever lost or created. Capacity in units is
//! `limit * window_ms`, which config validation keeps at or below
//! [`MAX_CAPACITY_UNITS`] (2^52) so that Lua's doubles hold every value exactly.

use crate::calendar::Calendar;

/// Largest `limit * window_ms` accepted: every intermediate value stays an
/// exactly representable integer in an IEEE double (Redis' Lua numbers).
pub const MAX_CAPACITY_UNITS: u64 = 1 << 52;

/// A key's quota: `limit` tokens per `window_ms` (one rule; a key's rules
/// are [`crate::Rules`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Tokens per window; also the bucket's capacity.
    pub limit: u64,
    /// Window length in milliseconds (a calendar quota's nominal period).
    pub window_ms: u64,
    /// [`Calendar::NONE`] for a token bucket; else the quota resets to
    /// `limit` at each start of this calendar's periods (`"1000/month@UTC"`).
    pub calendar: Calendar,
}

impl Quota {
    /// A token bucket: `limit` tokens per `window_ms`.
    pub const fn new(limit: u64, window_ms: u64) -> Quota {
        Quota {
            limit,
            window_ms,
            calendar: Calendar::NONE,
        }
    }

    /// Bucket capacity in credit units.
    pub fn capacity_units(&self) -> u64 {
        self.limit * self.window_ms
    }

    /// Milliseconds for the bucket to refill `tokens` whole tokens (rounded up).
    pub fn ms_for_tokens(&self, tokens: u64) -> u64 {
        (tokens * self.window_ms).div_ceil(self.limit)
    }
}

/// What an authority answers to a lease request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Whole tokens granted (0 when fewer than `need` were available).
    pub granted: u64,
    /// Whole tokens left in the authoritative bucket after the grant.
    pub remaining: u64,
    /// When nothing was granted: milliseconds until `need` tokens are available.
    /// 0 when something was granted.
    pub wait_ms: u64,
}

/// The stored state of one authoritative bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// Credit in units of `1 / unit_window` token.
    pub credit: u64,
    /// Time (ms) up to which refill has been accounted.
    pub ts: u64,
    /// The window the credit units refer to (the policy's window when stored).
    pub unit_window: u64,
}

impl BucketState {
    /// A bucket seen for the first time is full.
    pub fn full(policy: Quota, now: u64) -> Self {
        BucketState {
            credit: policy.capacity_units(),
            ts: now,
            unit_window: policy.window_ms,
        }
    }

    /// Bring the bucket to `now` under `policy`: convert units if the window
    /// changed, clamp to capacity if the limit was lowered, add refill for the
    /// elapsed time. Time going backwards refills nothing and keeps `ts`.
    pub fn refill(&mut self, policy: Quota, now: u64) {
        if self.unit_window != policy.window_ms {
            // Convert whole tokens exactly; the fraction of one token is scaled
            // (rounding down loses less than one credit unit).
            let w = self.unit_window.max(1);
            let whole = self.credit / w;
            let frac = self.credit % w;
            let frac_new = ((frac as u128 * policy.window_ms as u128) / w as u128) as u64;
            self.credit = whole.saturating_mul(policy.window_ms).saturating_add(frac_new);
            self.unit_window = policy.window_ms;
        }
        let cap = policy.capacity_units();
        if now > self.ts {
            // After one full window the bucket is full whatever it held, so the
            // elapsed time is clamped to keep the product small.
            let elapsed = (now - self.ts).min(policy.window_ms);
            self.credit = self.credit.saturating_add(elapsed * policy.limit);
            self.ts = now;
        }
        self.credit = self.credit.min(cap);
    }

    /// Whole tokens in the bucket.
    pub fn whole_tokens(&self, policy: Quota) -> u64 {
        self.credit / policy.window_ms
    }

    /// Take up to `want` whole tokens, but only if at least `need` are there.
    pub fn take(&mut self, policy: Quota, want: u64, need: u64, now: u64) -> Grant {
        self.refill(policy, now);
        let need = need.max(1).min(policy.limit);
        let avail = self.whole_tokens(policy);
        let granted = if avail >= need { avail.min(want) } else { 0 };
        self.credit -= granted * policy.window_ms;
        let wait_ms = if granted == 0 {
            (need * policy.window_ms - self.credit).div_ceil(policy.limit) + self.ts.saturating_sub(now)
        } else {
            0
        };
        Grant {
            granted,
            remaining: self.whole_tokens(policy),
            wait_ms,
        }
    }

    /// Give `tokens` back, capped at capacity. Returns whole tokens remaining.
    pub fn give_back(&mut self, policy: Quota, tokens: u64, now: u64) -> u64 {
        self.refill(policy, now);
        let cap = policy.capacity_units();
        self.credit = self
            .credit
            .saturating_add(tokens.saturating_mul(policy.window_ms))
            .min(cap);
        self.whole_tokens(policy)
    }

    /// Milliseconds until this bucket is full again (then it can be forgotten:
    /// a missing bucket reads as full). Measured from `ts`, which a debt may
    /// have put in the future.
    pub fn ms_until_full(&self, policy: Quota) -> u64 {
        (policy.capacity_units().saturating_sub(self.credit)).div_ceil(policy.limit)
    }

    /// Take `tokens` away whatever the bucket holds (the failover guard
    /// re-debits grants the authority forgot): what the credit cannot pay
    /// becomes a debt, kept by moving `ts` forward (no refill until then),
    /// `load` (credit units per ms) is what rate grants running until
    /// `load_until` take of the refill (adaptive leasing): the debt is paid
    /// by the rest of it until then, and by the whole refill after.
    pub fn debit(&mut self, policy: Quota, tokens: u64, now: u64, load: u64, load_until: u64) {
        self.refill(policy, now);
        let units = tokens.saturating_mul(policy.window_ms);
        if units <= self.credit {
            self.credit -= units;
            return;
        }
        let mut deficit = units - self.credit;
        self.credit = 0;
        let base = self.ts.max(now);
        let free = policy.limit.saturating_sub(load);
        let busy = load_until.saturating_sub(base);
        let owed = if busy == 0 || load == 0 {
            deficit.div_ceil(policy.limit)
        } else if deficit <= free.saturating_mul(busy) {
            deficit.div_ceil(free.max(1))
        } else {
            deficit -= free * busy;
            busy + deficit.div_ceil(policy.limit)
        };
        self.ts = base + owed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: Quota = Quota::new(10, 1000);

    #[test]
    fn new_bucket_is_full_and_grants_whole_tokens() {
        let mut b = BucketState::full(P, 0);
        let g = b.take(P, 4, 1, 0);
        assert_eq!(
            g,
            Grant {
                granted: 4,
                remaining: 6,
                wait_ms: 0
            }
        );
        let g = b.take(P, 20, 1, 0);
        assert_eq!(g.granted, 6);
        let g = b.take(P, 1, 1, 0);
        assert_eq!(
            g,
            Grant {
                granted: 0,
                remaining: 0,
                wait_ms: 100
            }
        );
    }

    #[test]
    fn partial_refill_is_kept_not_lost() {
        let mut b = BucketState::full(P, 0);
        b.take(P, 10, 1, 0);
        // 150 ms = 1.5 tokens: one whole token, the half stays as credit.
        assert_eq!(b.take(P, 5, 1, 150).granted, 1);
        // 50 ms more completes the second token.
        assert_eq!(b.take(P, 5, 1, 200).granted, 1);
    }

    #[test]
    fn need_is_all_or_nothing_and_wait_counts_to_need() {
        let mut b = BucketState::full(P, 0);
        b.take(P, 8, 1, 0);
        let g = b.take(P, 5, 5, 0);
        assert_eq!(
            g,
            Grant {
                granted: 0,
                remaining: 2,
                wait_ms: 300
            }
        );
    }

    #[test]
    fn time_going_backwards_refills_nothing() {
        let mut b = BucketState::full(P, 1000);
        b.take(P, 10, 1, 1000);
        assert_eq!(b.take(P, 1, 1, 500).granted, 0);
        // ...and does not move the refill point back either.
        assert_eq!(b.take(P, 1, 1, 1050).granted, 0);
        assert_eq!(b.take(P, 1, 1, 1100).granted, 1);
    }

    #[test]
    fn lowering_the_limit_clamps_stored_tokens() {
        let mut b = BucketState::full(P, 0);
        let low = Quota::new(3, 1000);
        assert_eq!(b.take(low, 10, 1, 0).granted, 3);
    }

    #[test]
    fn changing_the_window_converts_whole_tokens_exactly() {
        let mut b = BucketState::full(P, 0);
        b.take(P, 3, 1, 0);
        let minute = Quota::new(10, 60_000);
        assert_eq!(b.take(minute, 100, 1, 0).granted, 7);
    }

    #[test]
    fn give_back_is_capped_at_capacity() {
        let mut b = BucketState::full(P, 0);
        b.take(P, 2, 1, 0);
        assert_eq!(b.give_back(P, 5, 0), 10);
        assert_eq!(b.ms_until_full(P), 0);
    }

    proptest! {
        /// Over any sequence of requests, total granted never exceeds the
        /// capacity plus the refill of the elapsed interval, and the credit
        /// accounting is exact: start + refill = granted + left (no loss).
        #[test]
        fn never_more_than_allowance_and_nothing_lost(
            limit in 1u64..500,
            window_ms in 1u64..120_000,
            steps in prop::collection::vec((0u64..5_000, 1u64..600, 0u64..3), 1..60),
        ) {
            let p = Quota::new(limit, window_ms);
            let mut b = BucketState::full(p, 0);
            let mut now = 0u64;
            let mut granted = 0u64;
            let mut added_units = 0u64;
            let mut given_back = 0u64;
            for (dt, want, gb) in steps {
                let before = b;
                now += dt;
                // What refill can add, for the exactness check below.
                let mut probe = before;
                probe.refill(p, now);
                added_units += probe.credit - before.credit;
                let g = b.take(p, want, 1, now);
                granted += g.granted;
                prop_assert!(g.granted <= want);
                if g.granted == 0 {
                    prop_assert!(g.wait_ms > 0);
                }
                let back = gb.min(g.granted);
                if back > 0 {
                    let mut probe2 = b;
                    probe2.give_back(p, back, now);
                    given_back += (probe2.credit - b.credit) / window_ms;
                    b = probe2;
                }
            }
            let allowance = limit + (now * limit) / window_ms;
            prop_assert!(granted - given_back <= allowance,
                "granted {granted} - back {given_back} > allowance {allowance}");
            // Exact credit accounting.
            prop_assert_eq!(
                p.capacity_units() + added_units + given_back * window_ms,
                granted * window_ms + b.credit
            );
        }
    }
}
