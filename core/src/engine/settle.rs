//! Settling a reservation (`Limiter::reserve`): the request was admitted at
//! its estimate; its actual cost is known now. Below the estimate the
//! difference goes back where the estimate came from; above it, the rest is
//! taken from the local lease and, what that cannot cover, from the
//! authority's bucket, into debt if need be (docs/design.md, "Reserve, then
//! settle").

use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use super::entry::Entry;
use super::Engine;
use crate::bucket::MAX_CAPACITY_UNITS;
use crate::calendar::Calendar;
use crate::decision::{Decision, Reason};
use crate::error::Result;
use crate::metrics::Counters;

impl Engine {
    /// The buckets a reservation of `key` (in tier `tier`), decided `d` at
    /// `estimate` tokens, is settled on: the key's rules' entries. With
    /// adaptive leasing, a reservation admitted from the lease is counted
    /// in each entry's `reserved`, so the ledger keeps its tokens committed
    /// until it is settled or dropped ([`Self::release_reservation`]); then
    /// an entry left low prefetches.
    pub(crate) fn reservation_entries(
        &self,
        key: &str,
        tier: Option<&str>,
        d: &Decision,
        estimate: u64,
    ) -> Result<Vec<Arc<Entry>>> {
        if !d.allowed || matches!(d.reason, Reason::Unlimited | Reason::Shadow) {
            return Ok(Vec::new());
        }
        let entries = self.rule_entries(&self.entry_for(key, tier)?);
        if let Some(n) = self.tracked(d, estimate) {
            for s in &entries {
                s.reserved.fetch_add(n, AcqRel);
                // (the request's tokens were taken before they are counted
                // here: held rose again)
                s.note_held();
            }
        }
        // The admission sent no prefetch (`Kept`): one leaving before the
        // tokens were counted reported them spent, and a settle below the
        // estimate could put none of them back (`Entry::refill`).
        if matches!(d.reason, Reason::Lease | Reason::Local) {
            for s in &entries {
                self.prefetch_if_low(s, s.tokens.load(Acquire));
            }
        }
        Ok(entries)
    }

    /// The tokens `reserved` counts for a reservation (`None`: not counted).
    fn tracked(&self, d: &Decision, estimate: u64) -> Option<u32> {
        (self.r.adaptive && d.reason == Reason::Lease)
            .then(|| u32::try_from(estimate).ok())
            .flatten()
    }

    /// The most tokens a reservation on `entries` may be settled above its
    /// estimate: what each rule's bucket can owe and still count exactly
    /// (credit units, tokens x window, within Lua's exact integers: the
    /// capacity's own ceiling, [`MAX_CAPACITY_UNITS`]).
    pub(crate) fn max_overage(&self, entries: &[Arc<Entry>]) -> u64 {
        entries
            .iter()
            .map(|s| {
                let p = s.policy();
                (MAX_CAPACITY_UNITS / p.window_ms.max(1)).saturating_sub(p.limit)
            })
            .min()
            .unwrap_or(u64::MAX)
    }

    /// A reservation is settled or dropped: its tokens are no longer out.
    pub(crate) fn release_reservation(&self, entries: &[Arc<Entry>], d: &Decision, estimate: u64) {
        if let Some(n) = self.tracked(d, estimate) {
            for s in entries {
                let _ = s.reserved.fetch_update(AcqRel, Acquire, |r| Some(r.saturating_sub(n)));
            }
        }
    }

    /// Settle a reservation on `entries` ([`Self::reservation_entries`]),
    /// decided `d` at `estimate` tokens, at `actual`: every bucket of the
    /// key's rules gets `estimate - actual` back or gives `actual -
    /// estimate` more.
    pub(crate) fn settle_reservation(
        &self,
        entries: &[Arc<Entry>],
        d: &Decision,
        estimate: u64,
        actual: u64,
    ) -> Result<()> {
        self.release_reservation(entries, d, estimate);
        self.check_open()?;
        if actual > estimate && !entries.is_empty() {
            Counters::add(&self.counters.tokens_debited, actual - estimate);
        }
        for s in entries {
            if actual < estimate {
                self.settle_back(s, d.reason, estimate - actual);
            } else if actual > estimate {
                self.settle_more(s, d.reason, actual - estimate);
            }
        }
        Ok(())
    }

    /// `n` tokens of an estimate went unused. They go back where they
    /// came from: to the authority (mode exact), to the failure policy's
    /// share, or into the local lease ([`Self::put_back`]).
    fn settle_back(&self, e: &Arc<Entry>, reason: Reason, n: u64) {
        match reason {
            Reason::Exact => self.give_back(e, e.policy(), n),
            Reason::Fallback => self.refund_fallback(e, n),
            _ => {
                self.put_back(e, n);
                if self.r.adaptive && Calendar(e.calendar.load(Relaxed)).is_in_flight() {
                    // A released permit goes back at once, where the first
                    // instance in the line gets it: kept idle here, this
                    // instance's next requests took it again and again while
                    // the others were denied (6 processes on 3 permits: 3 got
                    // none in 40 s).
                    let back = e.tokens.swap(0, AcqRel);
                    if back > 0 {
                        self.give_back(e, e.policy(), back);
                    }
                    // (a denial's memo is stale: a permit just came back)
                    e.exhausted_until.store(0, Relaxed);
                }
            }
        }
    }

    /// `n` tokens taken from `e`'s local lease and not spent go back into
    /// it. With adaptive leasing, only while the commitment they were part
    /// of is live and up to it, less the tokens held and out on other
    /// reservations, and no higher than a lease call in flight reported
    /// ([`Entry::refill`]; I2, I3: a holder never holds more than the
    /// authority counts, nor past its expiry); the rest is dropped. The
    /// ledger cannot take them: tokens of an expired commitment count as
    /// spent there, and its refill has filled their room since (returning
    /// them broke the bound by a token in `ledger_bound`). An entry evicted
    /// meanwhile drops them too: the key's new entry reports its own
    /// holdings, so the ledger no longer counts them (a give-back would
    /// take them off the new entry's commitment). When the limiter closed,
    /// or an allow or deny entry holds the key, they go straight on to the
    /// authority, as the entry's other tokens did.
    pub(super) fn put_back(&self, e: &Arc<Entry>, n: u64) {
        if n == 0 {
            return;
        }
        if e.retired.load(Acquire) {
            Counters::add(&self.counters.tokens_expired, n);
            return;
        }
        let commit = self.r.adaptive.then(|| {
            let until = e.lease_until.load(Acquire);
            let live = (until == 0 || self.clock.precise() < until) && !self.circuit.is_open();
            if live {
                e.commit.load(Relaxed)
            } else {
                0
            }
        });
        let local = e.refill(n, commit);
        Counters::add(&self.counters.tokens_expired, n - local);
        if e.retired.load(Acquire) {
            // evicted between the check and the add: whatever the eviction
            // did not take is dropped
            Counters::add(&self.counters.tokens_expired, e.tokens.swap(0, AcqRel));
        } else if self.closed.load(Acquire) || e.access.load(Acquire) != 0 {
            let back = e.tokens.swap(0, AcqRel);
            self.give_back(e, e.policy(), back);
        }
    }

    /// The request used `n` tokens more than its estimate: they are taken
    /// from the local lease, and what it does not hold from the authority's
    /// bucket (a debit, into debt if need be); while the failure policy is
    /// in force, they count as admitted under it (reported and debited with
    /// the next answer, I4).
    fn settle_more(&self, e: &Arc<Entry>, reason: Reason, n: u64) {
        let rest = match reason {
            Reason::Exact | Reason::Fallback => n,
            _ => n - e.take_up_to(n),
        };
        if rest == 0 {
            return;
        }
        if reason == Reason::Fallback || self.circuit.is_open() {
            e.fallback_used.fetch_add(rest, AcqRel);
        } else {
            self.debit(e, rest);
        }
    }
}
