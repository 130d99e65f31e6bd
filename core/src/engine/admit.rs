//! The admit path: a key with local tokens costs a map lookup and one atomic
//! update (no lock, no allocation, no syscall). Also how every decision is
//! built and counted.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

use super::entry::{Entry, MORE_CALENDAR};
use super::Engine;
use crate::bucket::Quota;
use crate::config::{Budget, Mode};
use crate::decision::{Decision, Reason};
use crate::error::{Error, Result};
use crate::fork;
use crate::keys::validate_bucket_len;
use crate::metrics::Counters;
use crate::policy::{RuleSet, MAX_RULES};

/// Whether an admission's tokens stay held after it ([`Engine::admit_or`]):
/// a reservation's and a permit's do, until settled; a request's are spent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kept {
    No,
    Yes,
}

impl Engine {
    /// Tokens to ask for when `need` more are needed now and `local` are held:
    /// fixed leases top up to `lease_size`; adaptive ones ask for what the
    /// key's demand spends in one period and a round trip.
    pub(super) fn want(&self, e: &Entry, p: Quota, need: u64, local: u64) -> u64 {
        if self.r.adaptive {
            let d = self.sample_demand(e, self.clock.precise()) as u128;
            if self.single(p) {
                return need;
            }
            let span = (self.r.cfg.tuning.target_ms + self.rtt_ms.load(Relaxed)) as u128;
            // what it leases ahead: the whole requests a period of demand
            // expects (a fraction of one would mostly go back unused, a
            // give-back call), at most the overshoot budget (what one
            // instance may hold unspent: it trades calls for false denials;
            // the ledger's bound holds either way); under the default
            // budget, or when more, an equal part of `fleet_ahead_pct` of
            // what the key refills over the same span (at most its
            // capacity) among the holders the last answer counted: a few
            // busy instances of a large key (a long window's capacity is
            // many spans of its refill: leased ahead, a burst's estimate
            // would hold a part of the hour's tokens at one instance)
            // Before the first estimate (`demand_first_ms` or
            // `demand_first_requests`), as many as the key has seen here:
            // leases of 1, 2, 4, ... on a busy key instead of a call per
            // request (158 calls in the first 100 ms of 100 uneven holders
            // at 1.5x), and a single request's lease on a cold key.
            let ahead = if d == 0 {
                e.admitted.load(Relaxed) + e.denied.load(Relaxed)
            } else {
                (d * span / 1_000_000) as u64
            };
            let budget = self.r.cfg.overshoot_budget;
            let part = match budget {
                Budget::Auto => {
                    let t = &self.r.cfg.tuning;
                    let refill =
                        (p.limit as u128 * t.target_ms as u128 / p.window_ms.max(1) as u128).min(p.limit as u128);
                    let fleet = (refill * t.fleet_ahead_pct as u128 / 100) as u64;
                    fleet.checked_div(e.holders.load(Relaxed)).unwrap_or(0)
                }
                _ => 0,
            };
            need + ahead.min(budget.tokens(p.limit).max(part))
        } else {
            let (lease, _) = self.lease_params(p);
            lease.saturating_sub(local).max(need)
        }
    }

    /// `(lease size, prefetch threshold)` for a key's policy.
    #[inline(always)]
    pub(super) fn lease_params(&self, p: Quota) -> (u64, u64) {
        let lease = self.r.lease_size.min(p.limit);
        (lease, self.r.refill_threshold.min(lease))
    }

    /// Count a request on `e` (`counter`: its `admitted` or `denied`). An
    /// entry retired meanwhile has had its counts moved to the retired
    /// totals (`retire`: `retired` set, then each counter swapped to 0).
    /// The increment and retire's swap are read-modify-writes of the same
    /// counter, so one comes first: an increment before the swap is moved
    /// by it; one after it reads the swap's value (acquire), so it sees
    /// `retired` set before the swap and moves its count itself. Never
    /// lost, never counted twice. (On x86 the increment is the same locked
    /// add as a relaxed one; the check is one load and a branch.)
    #[inline(always)]
    pub(super) fn count(&self, e: &Entry, counter: &AtomicU64) {
        counter.fetch_add(1, AcqRel);
        if e.retired.load(Relaxed) {
            self.count_retired(e);
        }
    }

    #[cold]
    #[inline(never)]
    fn count_retired(&self, e: &Entry) {
        if !e.sub {
            Counters::add(&self.counters.admitted_retired, e.admitted.swap(0, SeqCst));
            Counters::add(&self.counters.denied_retired, e.denied.swap(0, SeqCst));
        }
    }

    /// The admit path: `Ok(Some)` when local tokens decided, `Ok(None)` for
    /// the cold path (no local tokens, a key not seen yet, or rules chosen
    /// for another tier than `tier`).
    #[inline(always)]
    pub fn admit_local(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Option<Decision>> {
        self.admit_or(key, cost, tier, Kept::No, Some, || Ok(None))
    }

    /// [`Self::admit_local`] for a reservation or a permit, whose tokens
    /// stay held until it is settled: no prefetch leaves before they are
    /// counted ([`Self::reservation_entries`] sends it then).
    pub fn admit_local_kept(&self, key: &str, cost: u64, tier: Option<&str>) -> Result<Option<Decision>> {
        self.admit_or(key, cost, tier, Kept::Yes, Some, || Ok(None))
    }

    /// The admit path with its two outcomes as continuations: `hit` takes
    /// the decision local tokens made, `miss` runs when the cold path is
    /// needed (after the table's guard is dropped). Each caller's result is
    /// then written once, where the caller wants it: `acquire` returns the
    /// decision without moving it out of an `Option` first (26 of the warm
    /// admit's 262 instructions, callgrind; docs/benchmarks.md). `kept`:
    /// whether the tokens stay held (a constant at each caller).
    #[inline(always)]
    pub fn admit_or<R>(
        &self,
        key: &str,
        cost: u64,
        tier: Option<&str>,
        kept: Kept,
        hit: impl FnOnce(Decision) -> R,
        miss: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if fork::current() != self.gen.load(Relaxed) {
            self.check_open()?;
        }
        validate_bucket_len(key)?;
        // Every miss leaves this block (dropping the table's guard before
        // the cold path runs), saying whether `tier` was checked on the way.
        let tier_checked = 'miss: {
            if self.r.cfg.mode == Mode::Exact {
                break 'miss false;
            }
            let guard = self.table.map.pin();
            let Some(e) = guard.get(&super::table::Lookup(key)) else {
                break 'miss false;
            };
            if !self.rules_fit(e, tier)? {
                break 'miss true;
            }
            if e.more.load(Acquire) != 0 {
                match self.admit_local_rules(e, cost, kept)? {
                    Some(d) => return Ok(hit(d)),
                    None => break 'miss true,
                }
            }
            let p = e.bucket_policy();
            if cost == 0 || cost > p.limit {
                return Err(Error::InvalidCost { cost, limit: p.limit });
            }
            let Some(left) = e.try_take(cost) else {
                break 'miss true;
            };
            e.touch(self.clock.coarse());
            self.count(e, &e.admitted);
            // (`prefetch_if_low` inline, by hand: called here it cost 1
            // instruction more on one key and 12 on 100 000, callgrind)
            let threshold = e.threshold.load(Relaxed);
            let mut left = left;
            if kept == Kept::No && left < threshold && !e.in_flight.load(Relaxed) {
                self.prefetch(e);
                left = e.tokens.load(Relaxed);
            }
            return Ok(hit(self.decision(e, p, true, left, 0, self.admit_reason())));
        };
        // (an unknown tier is refused here too, as the cold path would)
        if let (false, Some(t)) = (tier_checked, tier) {
            self.tier_id(t)?;
        }
        miss()
    }

    /// The admit path of a key with several rules: every rule's bucket
    /// spends `cost` local tokens, or none does (what was taken goes back)
    /// and the cold path decides. The further rules' entries are reached
    /// through the key's own entry (`Entry::subs`): no lookup, no allocation.
    /// (A key whose one rule is a calendar quota comes here too.)
    #[inline(never)]
    fn admit_local_rules(&self, e: &Arc<Entry>, cost: u64, kept: Kept) -> Result<Option<Decision>> {
        if e.more.load(Acquire) == MORE_CALENDAR {
            return self.admit_calendar(e, cost, kept);
        }
        let more = e.further();
        let mut subs: [Option<arc_swap::Guard<Option<Arc<Entry>>>>; MAX_RULES - 1] = [None, None, None];
        for (j, g) in subs.iter_mut().enumerate().take(more) {
            *g = Some(e.subs[j].load());
        }
        let mut all: [Option<&Arc<Entry>>; MAX_RULES] = [None; MAX_RULES];
        all[0] = Some(e);
        for j in 0..more {
            match subs[j].as_ref().and_then(|g| g.as_ref()) {
                Some(s) if !s.retired.load(Acquire) => all[j + 1] = Some(s),
                _ => return Ok(None),
            }
        }
        let entries = &all[..=more];
        for s in entries.iter().flatten() {
            let limit = s.limit.load(Relaxed);
            if cost == 0 || cost > limit {
                return Err(Error::InvalidCost { cost, limit });
            }
        }
        let mut left = [0u64; MAX_RULES];
        for (i, s) in entries.iter().flatten().enumerate() {
            match s.try_take(cost) {
                Some(l) => left[i] = l,
                None => {
                    for t in entries[..i].iter().flatten() {
                        self.put_back(t, cost);
                    }
                    return Ok(None);
                }
            }
        }
        let now = self.clock.coarse();
        self.count(e, &e.admitted);
        let mut best: Option<Decision> = None;
        for (i, s) in entries.iter().flatten().enumerate() {
            s.touch(now);
            if kept == Kept::No {
                left[i] = self.prefetch_if_low(s, left[i]);
            }
            let p = s.policy();
            let d = self.decision(s, p, true, left[i], 0, self.admit_reason());
            if best.is_none_or(|b| d.remaining < b.remaining) {
                best = Some(Decision { rule: i as u8, ..d });
            }
        }
        let rule_set = RuleSet(e.rule_set.load(Relaxed));
        Ok(best.map(|d| Decision { rule_set, ..d }))
    }

    /// The local admit of a key whose one rule is a calendar quota: the
    /// plain path's, with the calendar in the policy (its decision's reset
    /// is the period's end).
    #[inline(never)]
    fn admit_calendar(&self, e: &Arc<Entry>, cost: u64, kept: Kept) -> Result<Option<Decision>> {
        let p = e.policy();
        if cost == 0 || cost > p.limit {
            return Err(Error::InvalidCost { cost, limit: p.limit });
        }
        let Some(left) = e.try_take(cost) else {
            return Ok(None);
        };
        Ok(Some(self.admit(
            e,
            p,
            left,
            self.admit_reason(),
            self.clock.coarse(),
            kept,
        )))
    }

    #[inline(always)]
    pub(super) fn admit_reason(&self) -> Reason {
        self.r.admit_reason
    }

    #[inline(always)]
    pub(super) fn decision(
        &self,
        e: &Entry,
        p: Quota,
        allowed: bool,
        local: u64,
        retry_after_ms: u64,
        reason: Reason,
    ) -> Decision {
        // A denial says what the caller can have now: what this instance
        // holds (the authority's last figure is not the caller's to take).
        let remaining = if allowed {
            (local + e.auth_remaining.load(Relaxed)).min(p.limit)
        } else {
            local.min(p.limit)
        };
        Decision {
            allowed,
            limit: p.limit,
            remaining,
            retry_after_ms,
            // (the plain admit path's policy has no calendar: this folds away)
            reset_after_ms: if p.calendar.is_some() {
                self.period_left(e, p)
            } else {
                p.ms_for_tokens(p.limit - remaining)
            },
            window_ms: p.window_ms,
            reason,
            rule: 0,
            // (a calendar rule is in the rule-set table even alone)
            rule_set: if p.calendar.is_some() {
                RuleSet(e.rule_set.load(Relaxed))
            } else {
                RuleSet(0)
            },
        }
    }

    /// A calendar key: ms until its period ends (when the whole quota
    /// comes back), on this process's clock.
    #[cold]
    #[inline(never)]
    pub(super) fn period_left(&self, e: &Entry, p: Quota) -> u64 {
        // `period_end` is on this clock (the time of day only finds it)
        let now = self.clock.coarse();
        let mut end = e.period_end.load(Relaxed);
        if now >= end || end - now > 2 * p.window_ms {
            let wall = self.clock.wall();
            end = p
                .calendar
                .bounds(wall)
                .map_or(now, |b| (b.end + now).saturating_sub(wall));
            e.period_end.store(end, Relaxed);
        }
        end.saturating_sub(now)
    }

    pub(super) fn deny(&self, e: &Entry, p: Quota, local: u64, reason: Reason, retry_after_ms: u64) -> Decision {
        self.count(e, &e.denied);
        self.decision(e, p, false, local, retry_after_ms.max(1), reason)
    }

    /// Count an admission; a leased admit that left few tokens prefetches
    /// (unless they are `kept`: the caller prefetches once it counted them).
    pub(super) fn admit(&self, e: &Arc<Entry>, p: Quota, left: u64, reason: Reason, now: u64, kept: Kept) -> Decision {
        e.touch(now);
        self.count(e, &e.admitted);
        let leased = reason == Reason::Lease || reason == Reason::Local;
        let left = if leased && kept == Kept::No {
            self.prefetch_if_low(e, left)
        } else {
            left
        };
        self.decision(e, p, true, left, 0, reason)
    }

    /// `left` local tokens remain: below the prefetch threshold, start a
    /// lease request unless one is in flight. Returns the tokens held then.
    #[inline(always)]
    pub(super) fn prefetch_if_low(&self, e: &Arc<Entry>, left: u64) -> u64 {
        if left < e.threshold.load(Relaxed) && !e.in_flight.load(Relaxed) {
            self.prefetch(e);
            return e.tokens.load(Relaxed);
        }
        left
    }

    /// Start one asynchronous lease request for `e` unless one is in flight.
    #[cold]
    fn prefetch(&self, e: &Arc<Entry>) {
        if self.circuit.is_open() || e.rate.load(Relaxed) > 0 {
            return;
        }
        let local = e.tokens.load(Relaxed);
        let want = self.want(e, e.policy(), 1, local);
        self.start_lease(e, want, 1, 0);
    }
}
