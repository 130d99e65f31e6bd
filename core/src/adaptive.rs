//! Adaptive quota leasing, the authority's side: leases sized by each
//! holder's demand under one per-key overshoot budget, rate grants when the
//! bucket runs dry, and fallback rates from the live holders.
//!
//! Per key the authority keeps its bucket (as in [`crate::bucket`]) and one
//! record per live holder (a limiter instance): its demand, the tokens it may
//! still hold, when it expires, and its current rate grant. A lease call
//! carries the caller's demand, what it holds, and what it needs now:
//!
//! - **Chunk** (the bucket can serve the request): `need` tokens (spent at
//!   once, so they are never "held") plus an `extra` for the coming period,
//!   at most the holder's demand share of the budget `O` and never more than
//!   leaves all holders together holding `O`.
//! - **Rate** (the bucket cannot serve `need`): a rate in credit units per ms
//!   until `now + PERIOD_MS`, the holder's weighted max-min fair share of the
//!   key's refill rate given every live holder's demand, and never more than
//!   what the other holders' active rates leave of it. A rate is paid from
//!   the refill as time passes (the bucket refills by the key's rate less the
//!   holders' active rates), so credit never goes negative and the fleet can
//!   never be granted more than the bucket would have refilled.
//!
//! Every answer carries the holder's fallback rate (its share of the key's
//! rate among the live holders: the shares sum to the key's rate) and the
//! number of live holders, for the failure policy.
//!
//! Units: demand in milli-tokens per second; rates in credit units per ms
//! (one token is `window_ms` units; the key's refill rate is `limit` units/ms).

use std::collections::BTreeMap;

use crate::bucket::{BucketState, Grant, Policy};
use crate::guard::{Guard, Stamp};

/// The period a chunk is sized for, and the shortest rate grant.
pub const PERIOD_MS: u64 = 1_000;
/// A rate grant lasts long enough to deliver this many tokens (so renewals
/// cost about one call per this many admitted), within
/// [`PERIOD_MS`]..=[`MAX_PERIOD_MS`].
pub const GRANT_TOKENS: u64 = 40;
/// The longest rate grant (how long a joiner may wait for its share).
pub const MAX_PERIOD_MS: u64 = 5_000;
/// How long a rate grant runs on past its period (the holder renews at its
/// first request after the period). 0: measured with 1 s (`make
/// bench-adaptive`), holders in their grace crowded out renewals (their rate
/// still counts against the key's) and the fleet used less of the limit.
pub const GRACE_MS: u64 = 0;
/// In an outage, a holder keeps the fallback rate of its last answer this
/// long, then moves towards an equal share of the fleet it last saw...
pub const FALLBACK_HOLD_MS: u64 = 300_000;
/// ...halving the difference every this many ms (the last rates describe
/// the fleet and its traffic as they were; the longer the outage, the less
/// they say, and an equal share is what every instance can agree on blind).
pub const FALLBACK_HALF_LIFE_MS: u64 = 300_000;

/// The fallback rate `open_ms` into an outage: `last` (the authority's
/// last answer) for [`FALLBACK_HOLD_MS`], then halfway closer to `equal`
/// (the key's rate over its live holders) every [`FALLBACK_HALF_LIFE_MS`].
/// Every holder computes the same blend, so the rates still sum to the key's.
pub fn fallback_rate(last: u64, equal: u64, open_ms: u64) -> u64 {
    let Some(past) = open_ms.checked_sub(FALLBACK_HOLD_MS) else {
        return last;
    };
    let keep = 0.5f64.powf(past as f64 / FALLBACK_HALF_LIFE_MS as f64);
    (equal as f64 + (last as f64 - equal as f64) * keep).round() as u64
}

/// After the failover guard finds a key's state lost, the bucket pays no
/// bonus for this long: every holder that was on a rate calls within it
/// (its grant ends) and re-debits what it was granted. Until then what the
/// bucket holds may be theirs (a replica's stale copy can hold a whole
/// bucket that the fleet already spent). New rates wait for a fair share's
/// grant period ([`fair_period`]): the refill may be theirs too.
pub const QUARANTINE_MS: u64 = MAX_PERIOD_MS + PERIOD_MS;

/// How long a rate grant of a fair share among `holders` runs.
pub fn fair_period(p: Policy, holders: u64) -> u64 {
    let fair = (p.limit / holders.max(1)).max(1);
    (GRANT_TOKENS * p.window_ms)
        .div_ceil(fair)
        .clamp(PERIOD_MS, MAX_PERIOD_MS)
}

/// A holder not heard from for this long is forgotten.
pub const HOLDER_TTL_MS: u64 = 3 * PERIOD_MS;

/// One live holder of a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// Offered load (admitted + denied), milli-tokens per second.
    pub demand: u64,
    /// Tokens it may still hold from chunks (an overstatement: it spends them).
    pub held: u64,
    /// Clock reading after which it is forgotten.
    pub expires: u64,
    /// Its rate grant (credit units per ms; 0: none).
    pub rate: u64,
    /// When the rate grant started (refill paid to it from here).
    pub rate_from: u64,
    /// When the rate grant ends.
    pub rate_until: u64,
    /// The bucket's version after this holder's last call (the failover
    /// guard: older than what the holder saw means its writes were lost).
    pub version: u64,
}

/// What a holder asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The holder's id (one per limiter instance and process).
    pub holder: u64,
    /// Its offered load on the key, milli-tokens per second.
    pub demand: u64,
    /// Tokens it holds locally now.
    pub held: u64,
    /// Tokens it would like (need + what the coming period spends).
    pub want: u64,
    /// Tokens it needs now (0 grant below this).
    pub need: u64,
    /// Tokens of its rate grant that accrued beyond what it could hold
    /// (paid from the refill, never spent): credited back to the bucket.
    pub returned: u64,
    /// The key's overshoot budget `O` in tokens (at least 1).
    pub budget: u64,
    /// The key is decided one request at a time: its budget is a share of
    /// its limit under one token (2 % of a limit below 50), so a token held
    /// ahead would be more than the budget, stranded at one instance while
    /// the others' requests are denied. Grant `need` only, never a rate.
    pub single: bool,
}

/// The authority's answer beyond the chunk grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// A rate grant in credit units per ms (0: none), bonus included.
    pub rate: u64,
    /// The part of `rate` paid from the bucket up front (what the holder
    /// hands back, as `returned`, for the time it renews early).
    pub bonus: u64,
    /// How long the rate grant lasts, in ms from the answer, grace included
    /// (a duration: the holder's clock need not be the authority's, e.g.
    /// Redis `TIME`); the holder renews after `rate_ms - GRACE_MS`.
    pub rate_ms: u64,
    /// The rate grant starts this many ms after the answer (0 unless the
    /// bucket is in debt: [`crate::bucket::BucketState::debit`]).
    pub delay_ms: u64,
    /// This holder's fallback rate (credit units per ms).
    pub fallback: u64,
    /// Live holders of the key, this one included.
    pub holders: u64,
}

/// The authority's state of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The authoritative bucket.
    pub bucket: BucketState,
    /// Live holders by id.
    pub holders: BTreeMap<u64, Holder>,
    /// Epoch and version, for the failover guard ([`crate::guard`]).
    pub stamp: Stamp,
    /// Until this clock reading no bonus is paid from the bucket: it was
    /// found lost ([`QUARANTINE_MS`]).
    pub quarantine_until: u64,
    /// New rate grants start no earlier (found lost: grants of the lost
    /// state may still run).
    pub rates_from: u64,
    /// What the bucket may still grant in the quarantine (the budget).
    pub quarantine_left: u64,
}

/// Credit units per ms that `demand` (milli-tokens/s) amounts to.
pub fn demand_units(demand: u64, p: Policy) -> u64 {
    ((demand as u128 * p.window_ms as u128) / 1_000_000) as u64
}

/// Weighted max-min fair shares of `total` among `demands` (water-filling):
/// nobody gets more than it asks, and what the small ask leaves is split
/// evenly among the rest. When the demands sum to less than `total`, the
/// remainder is split evenly on top (so the shares always sum to `total`,
/// give or take integer rounding, which only ever rounds down).
pub fn water_fill(demands: &[u64], total: u64) -> Vec<u64> {
    let n = demands.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let sum: u128 = demands.iter().map(|&d| d as u128).sum();
    if sum <= total as u128 {
        let spare = total - sum as u64;
        return demands.iter().map(|&d| d + spare / n).collect();
    }
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| demands[i]);
    let mut out = vec![0; demands.len()];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (n - k as u64);
        let give = demands[i].min(fair);
        out[i] = give;
        left -= give;
    }
    out
}

/// The most rate a holder spending `demand` units per ms is granted: its
/// demand and a quarter (random arrivals), or an equal share of the key's
/// rate while its demand is not measured yet.
pub fn rate_cap(demand: u64, limit: u64, holders: u64) -> u64 {
    if demand == 0 {
        limit / holders.max(1)
    } else {
        demand.saturating_add(demand / 4)
    }
}

impl KeyState {
    /// A key seen for the first time: a full bucket, no holders.
    pub fn new(policy: Policy, now: u64) -> Self {
        KeyState {
            bucket: BucketState::full(policy, now),
            holders: BTreeMap::new(),
            stamp: Stamp::new(now),
            quarantine_until: 0,
            rates_from: 0,
            quarantine_left: 0,
        }
    }

    /// The failover guard's check before a lease: when the holder's view
    /// shows this state was lost, its recent grants (at most the limit) are
    /// debited again. True when it was.
    pub fn guard(&mut self, p: Policy, g: &Guard, holder: Option<u64>, now: u64) -> bool {
        // The holder's own record older than its last answer: its writes
        // were lost, even if others wrote since (the version went on).
        let rolled_back = g.epoch == self.stamp.epoch
            && holder
                .and_then(|id| self.holders.get(&id))
                .is_some_and(|h| h.version < g.version);
        if !self.stamp.lost(g) && !rolled_back {
            return false;
        }
        self.refill(p, now);
        // rates granted since the loss keep running: the debt is paid by
        // what they leave of the refill
        let running = self.holders.values().filter(|h| h.rate_until > now);
        let load = running.clone().map(|h| h.rate).fold(0u64, u64::saturating_add);
        let load_until = running.map(|h| h.rate_until).max().unwrap_or(0);
        self.bucket.debit(p, g.recent.min(p.limit), now, load, load_until);
        if now >= self.quarantine_until {
            self.quarantine_left = g.budget;
        }
        self.quarantine_until = self.quarantine_until.max(now + QUARANTINE_MS);
        // the fleet as the holder last saw it, or as this state knows it
        let n = g.holders.max(self.holders.len() as u64).max(1);
        self.rates_from = self.rates_from.max(now + fair_period(p, n));
        true
    }

    /// How long this state will be kept at least: until the bucket is full
    /// again, and while any holder's record (or the rate it is paid) runs.
    pub fn alive_ms(&self, p: Policy, now: u64) -> u64 {
        let full = self.bucket.ms_until_full(p) + self.bucket.ts.saturating_sub(now);
        let holders = self
            .holders
            .values()
            .map(|h| h.expires.max(h.rate_until).saturating_sub(now))
            .max()
            .unwrap_or(0);
        full.max(holders)
    }

    /// Rate units paid to holders over `(from, to]`.
    fn rates_paid(&self, from: u64, to: u64) -> u64 {
        self.holders
            .values()
            .map(|h| {
                let a = h.rate_from.max(from);
                let b = h.rate_until.min(to);
                h.rate.saturating_mul(b.saturating_sub(a))
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Bring the bucket to `now`: refill less what active rates were paid
    /// over the same time, then the capacity cap.
    pub fn refill(&mut self, p: Policy, now: u64) {
        let from = self.bucket.ts;
        // Window change and a lowered limit first, with no time elapsed.
        self.bucket.refill(p, from);
        if now > from {
            let gross = p.limit as u128 * (now - from) as u128;
            let net = gross.saturating_sub(self.rates_paid(from, now) as u128);
            let credit = (self.bucket.credit as u128 + net).min(p.capacity_units() as u128);
            self.bucket.credit = credit as u64;
            self.bucket.ts = now;
        }
    }

    /// Forget holders not heard from in time.
    fn reap(&mut self, now: u64) {
        self.holders.retain(|_, h| h.expires > now);
    }

    /// Answer one adaptive lease call.
    pub fn lease(&mut self, p: Policy, ask: Ask, now: u64) -> (Grant, Answer) {
        self.refill(p, now);
        self.reap(now);
        if ask.returned > 0 {
            self.bucket.credit = self
                .bucket
                .credit
                .saturating_add(ask.returned.saturating_mul(p.window_ms))
                .min(p.capacity_units());
        }
        let me = self.holders.entry(ask.holder).or_default();
        me.demand = ask.demand;
        me.held = ask.held;
        me.expires = now + HOLDER_TTL_MS;
        let ids: Vec<u64> = self.holders.keys().copied().collect();
        let demands: Vec<u64> = self.holders.values().map(|h| demand_units(h.demand, p)).collect();
        let shares = water_fill(&demands, p.limit);
        let mine = ids.iter().position(|&id| id == ask.holder).expect("just inserted");
        let answer_base = Answer {
            fallback: shares[mine],
            holders: ids.len() as u64,
            ..Answer::default()
        };
        let need = ask.need.max(1).min(p.limit);
        // In a quarantine (the state was found lost) the bucket may hold
        // what holders that have not re-debited yet already spent: at most
        // the budget of it goes out until the quarantine ends.
        let quarantined = now < self.quarantine_until;
        let avail = if quarantined {
            self.bucket.whole_tokens(p).min(self.quarantine_left)
        } else {
            self.bucket.whole_tokens(p)
        };
        // This holder's share of the budget, by demand.
        let total_demand: u128 = self.holders.values().map(|h| h.demand as u128).sum();
        let share = (ask.budget as u128 * ask.demand as u128)
            .checked_div(total_demand)
            .map_or(ask.budget, |s| s as u64)
            .max(1);
        let target = if ask.single {
            0
        } else {
            ask.want.saturating_sub(need).min(share.saturating_sub(ask.held))
        };
        let others: u64 = self
            .holders
            .iter()
            .filter(|(&id, _)| id != ask.holder)
            .map(|(_, h)| h.held)
            .sum();
        let room = ask.budget.saturating_sub(others).saturating_sub(ask.held);
        // What the bucket can give now: `need` (spent at once, never held)
        // plus the target as far as the budget has room.
        let granted = if avail >= need {
            need + target.min(room).min(avail - need)
        } else {
            0
        };
        self.bucket.credit -= granted * p.window_ms;
        if quarantined {
            self.quarantine_left -= granted;
        }
        let grant = Grant {
            granted,
            remaining: self.bucket.whole_tokens(p),
            wait_ms: if granted > 0 {
                0
            } else {
                (need * p.window_ms)
                    .saturating_sub(self.bucket.credit)
                    .div_ceil(p.limit)
                    + self.bucket.ts.saturating_sub(now)
            },
        };
        let others_active: u64 = self
            .holders
            .iter()
            .filter(|(&id, h)| id != ask.holder && h.rate_until > now)
            .map(|(_, h)| h.rate)
            .sum();
        // Chunks while the bucket can serve the request: a lone holder's
        // burst gets what the bucket holds, as from one exact bucket. The key
        // is saturated when the bucket holds less than the live holders spend
        // in a period, and either rates already run on it (and demand stays
        // near the refill) or several holders whose demand outruns the
        // refill share it and it is under three quarters full: then every
        // holder gets a rate, and renewals cost one call per grant whatever
        // the traffic.
        let period_demand = (total_demand * PERIOD_MS as u128 / 1_000_000) as u64;
        let rates_run = others_active > 0 || self.holders[&ask.holder].rate_until > now;
        // Rates need demand above the refill to start, and near it (a tenth
        // below, for noise in the estimates) to go on: a key offered less
        // than its refill is not saturated, whatever its bucket holds for a
        // moment, and is served by chunks (rates near each holder's demand
        // would deny its random bursts). Starting needs a draining bucket
        // too: young estimates are noisy, and rates started on a full bucket
        // hand it out as bonus to demand that is not there (measured: 100
        // instances at 0.8x on Redis denied 4 % that way).
        let sum_demand: u128 = demands.iter().map(|&d| d as u128).sum();
        let outrun = sum_demand > p.limit as u128;
        let sustained = sum_demand * 10 > p.limit as u128 * 9;
        let shared_and_draining = self.holders.len() > 1 && outrun && avail < p.limit - p.limit / 4;
        let saturated = avail <= period_demand && ((rates_run && sustained) || shared_and_draining);
        // A dry bucket (not a whole token) starts rates too; one that holds
        // tokens but fewer than a large request needs answers as a plain
        // bucket does: nothing now, and when to come back.
        let chunk = ask.single || (!saturated && (avail >= need || avail > 0));
        let me = self.holders.get_mut(&ask.holder).expect("present");
        me.held = ask.held + granted.saturating_sub(need);
        if chunk {
            // Chunk mode: served from the bucket; any rate ends.
            me.rate = 0;
            if me.rate_until > now {
                me.rate_until = now;
            }
            return (grant, answer_base);
        }
        // Rate mode: the fair share, within what other active rates leave,
        // and never far above what the holder spends (a quarter on top for
        // random arrivals): a share padded with spare refill would hold the
        // key's rate away from holders the authority has not heard from yet
        // (a fleet's first seconds) and only come back as dropped accrual.
        let fair = shares[mine].min(rate_cap(demands[mine], p.limit, ids.len() as u64));
        let rate = fair.min(p.limit.saturating_sub(others_active));
        // What the bucket holds (tokens handed back, refill no rate took) goes
        // out as a bonus on top of the rate, to the holders whose demand the
        // fair shares leave unmet, as far as they miss it, first come first
        // served: taken from the bucket now and delivered over the grant.
        // (Shared in proportion to everyone's unmet demand, each renewal took
        // a slice of what the last one left, and the rest sat in the bucket
        // until its cap threw the refill away.)
        let my_unmet = demands[mine].saturating_sub(rate);
        // A rate below the holder's fair share (cut short by other holders'
        // grants, or by a demand estimate that may still be rising: a new
        // holder's first measure) comes back after the shortest period for
        // the rest of its share; a full share is sized to deliver
        // GRANT_TOKENS.
        let period = if rate == 0 || rate < shares[mine] {
            PERIOD_MS
        } else {
            (GRANT_TOKENS * p.window_ms)
                .div_ceil(rate)
                .clamp(PERIOD_MS, MAX_PERIOD_MS)
        };
        // units per ms over the whole grant (grace included), paid in full now
        let span = period + GRACE_MS;
        let bonus = if now < self.quarantine_until {
            0
        } else {
            (self.bucket.credit / span).min(my_unmet)
        };
        self.bucket.credit -= bonus * span;
        let me = self.holders.get_mut(&ask.holder).expect("present");
        if rate + bonus == 0 {
            me.rate = 0;
            // Other holders' rates take the whole refill: nothing frees up
            // before the first of them ends (the bucket's own refill time
            // would send this holder back every few ms for nothing).
            let first_end = self
                .holders
                .iter()
                .filter(|(&id, h)| id != ask.holder && h.rate_until > now && h.rate > 0)
                .map(|(_, h)| h.rate_until - now)
                .min();
            let grant = match first_end {
                Some(w) if grant.granted == 0 => Grant {
                    wait_ms: w.max(grant.wait_ms),
                    ..grant
                },
                _ => grant,
            };
            return (grant, answer_base);
        }
        // The authority's record keeps the part paid from refill. A bucket
        // in debt (the failover guard debited again what a lost state had
        // granted) pays no rate before the debt is paid: the grant starts then.
        // So does a bucket found lost, for as long as a fair share's grant
        // runs: grants of the lost state may still run on holders that have
        // not called since, and they take the refill (the rates of all
        // holders sum to the key's rate); a rate granted now would be paid
        // twice.
        let start = self.bucket.ts.max(now).max(self.rates_from);
        me.rate = rate;
        me.rate_from = start;
        me.rate_until = start + period + GRACE_MS;
        me.expires = me.expires.max(start + period + GRACE_MS + PERIOD_MS);
        let answer = Answer {
            rate: rate + bonus,
            bonus,
            rate_ms: period + GRACE_MS,
            delay_ms: start - now,
            ..answer_base
        };
        let grant = Grant {
            remaining: self.bucket.whole_tokens(p),
            ..grant
        };
        (grant, answer)
    }

    /// A holder gives `tokens` back (lease TTL, flush, eviction).
    pub fn give_back(&mut self, p: Policy, holder: u64, tokens: u64, now: u64) {
        self.refill(p, now);
        self.bucket.credit = self
            .bucket
            .credit
            .saturating_add(tokens.saturating_mul(p.window_ms))
            .min(p.capacity_units());
        if let Some(h) = self.holders.get_mut(&holder) {
            h.held = h.held.saturating_sub(tokens);
        }
    }

    /// Whether the state can be forgotten (a missing key reads the same).
    pub fn is_idle(&self, p: Policy, now: u64) -> bool {
        let mut probe = self.clone();
        probe.refill(p, now);
        probe.reap(now);
        probe.holders.is_empty() && probe.bucket.ms_until_full(p) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy {
        limit: 1000,
        window_ms: 1000,
    };

    fn ask(holder: u64, demand_tps: u64, held: u64, want: u64, need: u64) -> Ask {
        Ask {
            holder,
            demand: demand_tps * 1000,
            held,
            want,
            need,
            budget: 20,
            returned: 0,
            single: false,
        }
    }

    #[test]
    fn water_filling_is_max_min_fair() {
        assert_eq!(water_fill(&[10, 10, 10], 30), vec![10, 10, 10]);
        // the small asks are met, the rest split evenly
        assert_eq!(water_fill(&[5, 100, 100], 105), vec![5, 50, 50]);
        assert_eq!(water_fill(&[1000, 10, 10, 10], 100), vec![70, 10, 10, 10]);
        // under-demand: the spare is split evenly on top
        assert_eq!(water_fill(&[10, 20], 100), vec![45, 55]);
        let s = water_fill(&[7, 300, 3, 90, 90], 333);
        assert!(s.iter().sum::<u64>() <= 333);
        assert_eq!(s[0], 7);
        assert_eq!(s[2], 3);
    }

    #[test]
    fn chunks_are_sized_by_demand_within_the_budget() {
        let mut k = KeyState::new(P, 0);
        // one holder at 100/s: the whole budget is its share
        let (g, a) = k.lease(P, ask(1, 100, 0, 200, 1), 0);
        assert_eq!(g.granted, 1 + 20, "need + the whole budget");
        assert_eq!(a.holders, 1);
        // a second holder with the same demand: room is what holder 1 does not hold
        let (g, a) = k.lease(P, ask(2, 100, 0, 200, 1), 0);
        assert_eq!(g.granted, 1, "holder 1 holds the whole budget");
        assert_eq!(a.holders, 2);
        // holder 1 spent its tokens: now each gets half the budget
        let (g, _) = k.lease(P, ask(1, 100, 0, 200, 1), 10);
        assert_eq!(g.granted, 1 + 10);
        let (g, _) = k.lease(P, ask(2, 100, 0, 200, 1), 10);
        assert_eq!(g.granted, 1 + 10);
        let held: u64 = k.holders.values().map(|h| h.held).sum();
        assert!(held <= 20);
    }

    #[test]
    fn an_empty_bucket_grants_fair_rates_paid_from_refill() {
        let mut k = KeyState::new(P, 0);
        k.bucket.credit = 0;
        // a heavy holder and a light one: max-min fair rates
        let (g, a) = k.lease(P, ask(1, 5000, 0, 5000, 1), 0);
        assert_eq!(g.granted, 0);
        assert_eq!(a.rate, 1000, "alone, it gets the whole refill");
        let (_, b) = k.lease(P, ask(2, 100, 0, 100, 1), 0);
        assert_eq!(b.rate, 0, "holder 1's active rate leaves nothing yet");
        assert_eq!(b.fallback, 100, "its fair share: all it asks");
        // the heavy one renews at its fair share, which frees room for the light one
        let (_, a) = k.lease(P, ask(1, 5000, 0, 5000, 1), 500);
        assert_eq!(a.rate, 900);
        let (_, b) = k.lease(P, ask(2, 100, 0, 100, 1), 500);
        assert_eq!(b.rate, 100);
        // rates are paid from refill: the bucket gets nothing while they run
        k.refill(P, 1000);
        assert_eq!(k.bucket.credit, 0, "refill 1000/ms, rates 900 + 100");
        // rates end when not renewed (after their period and any grace): the
        // refill flows back into the bucket
        let end = 500 + PERIOD_MS + GRACE_MS;
        k.refill(P, end + 100);
        assert_eq!(
            k.bucket.credit,
            1000 * 100,
            "both rates ran to {end}; then 100 ms at 1000/ms"
        );
    }

    #[test]
    fn a_rate_stays_near_the_holders_demand() {
        // Alone on a dry bucket, a holder spending 100/s gets its demand and
        // a quarter, not the key's whole 1000/s: the rest stays free for
        // holders the authority has not heard from yet.
        let mut k = KeyState::new(P, 0);
        k.bucket.credit = 0;
        let (_, a) = k.lease(P, ask(1, 100, 0, 100, 1), 0);
        assert_eq!(a.rate, 125);
        assert_eq!(a.fallback, 1000, "the fallback rate is its share of the whole key");
        // demand not measured yet: at most an equal share among the live
        // holders (500/s), here its fair share: 1000 less holder 1's 100,
        // halved
        let (_, b) = k.lease(P, ask(2, 0, 0, 1, 1), 0);
        assert_eq!(b.rate, 450);
        assert_eq!(rate_cap(0, 1000, 4), 250);
        assert_eq!(rate_cap(800, 1000, 4), 1000);
    }

    #[test]
    fn a_holder_shut_out_by_active_rates_waits_for_the_first_to_end() {
        let mut k = KeyState::new(P, 0);
        k.bucket.credit = 0;
        let (_, a) = k.lease(P, ask(1, 5000, 0, 5000, 1), 0);
        assert_eq!(a.rate, 1000);
        let a_ends = a.rate_ms;
        // 300 ms later a second holder finds the key's whole rate taken: it
        // comes back when holder 1's grant ends, not when the bucket (which
        // gets no refill meanwhile) would hold a token
        let (g, b) = k.lease(P, ask(2, 100, 0, 100, 1), 300);
        assert_eq!((g.granted, b.rate), (0, 0));
        assert_eq!(g.wait_ms, a_ends - 300);
    }

    #[test]
    fn a_rate_cut_short_by_others_comes_back_after_one_period() {
        let mut k = KeyState::new(P, 0);
        k.bucket.credit = 0;
        // holder 1 alone: 900/s of its demand 5000/s... capped at the key
        k.lease(P, ask(1, 5000, 0, 5000, 1), 0);
        // holder 2 (demand 5000/s too) learns of the key while holder 1's
        // rate runs: its fair share is 500/s, but holder 1 still holds the
        // whole rate: nothing, until holder 1's grant ends
        let (_, b) = k.lease(P, ask(2, 5000, 0, 5000, 1), 10);
        assert_eq!(b.rate, 0);
        // holder 1 renews at its fair share (500/s) and holder 2 gets 500/s
        // for as long as a full share takes to deliver GRANT_TOKENS
        let (_, a) = k.lease(P, ask(1, 5000, 0, 5000, 1), 20);
        assert_eq!(a.rate, 500);
        let (_, b) = k.lease(P, ask(2, 5000, 0, 5000, 1), 30);
        assert_eq!(b.rate, 500);
        assert_eq!(
            b.rate_ms,
            (GRANT_TOKENS * 1000).div_ceil(500).clamp(PERIOD_MS, MAX_PERIOD_MS)
        );
        // a third heavy holder: fair share 333/s, but only what holders 1
        // and 2 leave (nothing) - then, as holder 1 renews at 333/s, holder 3
        // gets the 167/s left, cut short: it asks again after one period
        k.lease(P, ask(3, 5000, 0, 5000, 1), 40);
        let (_, a) = k.lease(P, ask(1, 5000, 0, 5000, 1), 50);
        assert_eq!(a.rate, 333);
        let (_, c) = k.lease(P, ask(3, 5000, 0, 5000, 1), 60);
        assert_eq!(c.rate, 1000 - 333 - 500);
        assert_eq!(c.rate_ms, PERIOD_MS + GRACE_MS);
    }

    #[test]
    fn the_bucket_goes_out_as_bonus_to_unmet_demand_first_come() {
        let mut k = KeyState::new(P, 0);
        k.bucket.credit = 0;
        // two holders far above the key's rate, both known to the authority
        k.lease(P, ask(1, 3000, 0, 3000, 1), 0);
        k.lease(P, ask(2, 3000, 0, 3000, 1), 0);
        // holder 1's grant has ended; the bucket holds 600 tokens (say,
        // handed back): the first to renew takes what its unmet demand over
        // its grant can use, as far as the bucket goes
        k.refill(P, 1000);
        k.bucket.credit = 600 * P.window_ms;
        let (g, a) = k.lease(P, ask(1, 3000, 0, 3000, 1), 1000);
        assert_eq!(g.granted, 1 + 10, "its need and its half of the budget");
        assert_eq!(a.rate - a.bonus, 500, "its fair share of the refill");
        assert_eq!(a.bonus * a.rate_ms, (600 - 11) * P.window_ms, "the rest of the bucket");
        assert_eq!(k.bucket.credit, 0);
        // the second finds the bucket empty: its fair share, no bonus
        let (_, b) = k.lease(P, ask(2, 3000, 0, 3000, 1), 1000);
        assert_eq!((b.rate, b.bonus), (500, 0));
    }

    #[test]
    fn fallback_rates_hold_then_decay_towards_an_equal_share() {
        let h = FALLBACK_HOLD_MS;
        let hl = FALLBACK_HALF_LIFE_MS;
        assert_eq!(fallback_rate(900, 50, 0), 900);
        assert_eq!(fallback_rate(900, 50, h), 900);
        assert_eq!(fallback_rate(900, 50, h + hl), 475);
        assert_eq!(fallback_rate(10, 50, h + hl), 30, "a light holder rises");
        assert_eq!(fallback_rate(900, 50, h + 20 * hl), 50);
        // a heavy and a light holder's rates keep their sum
        let (a, b) = (fallback_rate(900, 500, h + hl / 3), fallback_rate(100, 500, h + hl / 3));
        assert!((999..=1001).contains(&(a + b)), "{a} + {b}");
    }
}
