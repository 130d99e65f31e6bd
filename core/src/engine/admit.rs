//! The admit path: a key with local tokens costs a map lookup and one atomic
//! update (no lock, no allocation, no syscall). Also how every decision is
//! built and counted.

use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use super::entry::Entry;
use super::Engine;
use crate::bucket::Policy;
use crate::config::{validate_key, Mode};
use crate::decision::{Decision, Reason};
use crate::error::{Error, Result};
use crate::fork;

impl Engine {
    /// Tokens to ask for when `need` more are needed now and `local` are held:
    /// fixed leases top up to `lease_size`; adaptive ones ask for what the
    /// key's demand spends in one period and a round trip.
    pub(super) fn want(&self, e: &Entry, p: Policy, need: u64, local: u64) -> u64 {
        if self.r.adaptive {
            let d = self.sample_demand(e, self.clock.precise()) as u128;
            let span = (crate::adaptive::PERIOD_MS + self.rtt_ms.load(Relaxed)) as u128;
            need + (d * span).div_ceil(1_000_000) as u64
        } else {
            let (lease, _) = self.lease_params(p);
            lease.saturating_sub(local).max(need)
        }
    }

    /// `(lease size, prefetch threshold)` for a key's policy.
    #[inline(always)]
    pub(super) fn lease_params(&self, p: Policy) -> (u64, u64) {
        let lease = self.r.lease_size.min(p.limit);
        (lease, self.r.refill_threshold.min(lease))
    }

    /// The admit path: `Ok(Some)` when local tokens decided, `Ok(None)` for the cold path.
    #[inline(always)]
    pub fn admit_local(&self, key: &str, cost: u64) -> Result<Option<Decision>> {
        if fork::current() != self.gen.load(Relaxed) {
            self.check_open()?;
        }
        validate_key(key)?;
        if self.r.cfg.mode == Mode::Exact {
            return Ok(None);
        }
        let guard = self.table.map.pin();
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
        let threshold = e.threshold.load(Relaxed);
        let mut left = left;
        if left < threshold && !e.in_flight.load(Relaxed) {
            self.prefetch(e);
            left = e.tokens.load(Relaxed);
        }
        Ok(Some(self.decision(e, p, true, left, 0, self.admit_reason())))
    }

    #[inline(always)]
    pub(super) fn admit_reason(&self) -> Reason {
        if self.r.cfg.mode == Mode::Local {
            Reason::Local
        } else {
            Reason::Lease
        }
    }

    #[inline(always)]
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

    pub(super) fn deny(&self, e: &Entry, p: Policy, local: u64, reason: Reason, retry_after_ms: u64) -> Decision {
        e.denied.fetch_add(1, Relaxed);
        self.decision(e, p, false, local, retry_after_ms.max(1), reason)
    }

    /// Count an admission; a leased admit that left few tokens prefetches.
    pub(super) fn admit(&self, e: &Arc<Entry>, p: Policy, left: u64, reason: Reason, now: u64) -> Decision {
        e.touch(now);
        e.admitted.fetch_add(1, Relaxed);
        let threshold = e.threshold.load(Relaxed);
        let mut left = left;
        if (reason == Reason::Lease || reason == Reason::Local) && left < threshold && !e.in_flight.load(Relaxed) {
            self.prefetch(e);
            left = e.tokens.load(Relaxed);
        }
        self.decision(e, p, true, left, 0, reason)
    }

    /// Start one asynchronous lease request for `e` unless one is in flight.
    #[cold]
    fn prefetch(&self, e: &Arc<Entry>) {
        if self.circuit.is_open() || e.rate.load(Relaxed) > 0 {
            return;
        }
        let local = e.tokens.load(Relaxed);
        let want = self.want(e, e.policy(), 1, local);
        self.start_lease(e, want, 1);
    }
}
