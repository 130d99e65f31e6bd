//! One key's local lease: the atomics the admit path touches.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Mutex, OnceLock};

use crate::bucket::Quota;
use crate::calendar::Calendar;
use crate::guard::Recent;
use crate::policy::MAX_RULES;

/// [`Entry::mark`]: the rules were resolved for a call naming no tier.
pub(crate) const MARK_DEFAULT: u32 = u32::MAX;
/// [`Entry::mark`]: the key has a policy of its own; a named tier is ignored.
pub(crate) const MARK_PINNED: u32 = u32::MAX - 1;
/// [`Entry::mark`]: the bucket of a further rule, never a caller's key: no
/// call's tier matches it, so a caller's key that names such a bucket
/// (`key`, U+001F, window) goes to the cold path, which refuses it.
pub(crate) const MARK_SUB: u32 = u32::MAX - 2;

/// [`Entry::access`]: the key has an allow entry (`unlimited`).
pub(crate) const ACCESS_UNLIMITED: u8 = 1;
/// [`Entry::access`]: the key has a deny entry (`blocked`).
pub(crate) const ACCESS_BLOCKED: u8 = 2;
/// In [`Entry::more`]: one of the key's rules is a calendar quota (the low
/// bits count its further rules), so the plain admit path, which reads no
/// calendar, passes it to the path of several rules.
pub(crate) const MORE_CALENDAR: u8 = 0x80;

/// How far a rate has accrued: taken up to `at`, with `units` credit units
/// short of a whole token carried; the most tokens held locally since `at`
/// (`peak`); the last rate this holder may report that no longer accrues,
/// and its end (`paused`): while a lease call is in flight, the one it
/// reported (the call replaces it), else the one that last ran out at its
/// end (see [`Entry::pause_rate`]); the most held since the last lease call
/// left (`low`); and the least held that a lease call not yet answered
/// reported (`reported`).
#[derive(Debug, Default)]
pub(crate) struct Accrual {
    pub at: u64,
    pub units: u64,
    pub peak: u64,
    pub paused: (u64, u64),
    /// The most tokens held (local and reserved) since lease call
    /// `low_seq` left (0: none yet), for [`Entry::low_window`].
    pub low: u64,
    pub low_seq: u64,
    /// The least held (local and reserved) that a lease call sent since
    /// the last answer applied reported (`u64::MAX`: every call sent was
    /// answered; 0 while an answer lands): what [`Entry::refill`] may fill
    /// the lease up to.
    pub reported: u64,
}

/// A fallback share granted under the policy `old` (1/window token per ms
/// of that window) under the policy `p`. Read under a new window as it was,
/// a share of a 170 per 10 s key became ten times as fast at 37 per 1 s
/// (`ledger_bound`'s outages with a random `set_limit`). It keeps the same
/// part of the new rate, and no more tokens per ms than the authority counts
/// for it (the ledger converts units only), so the valid shares still sum
/// to at most the key's rate (I4).
fn share_in(share: u64, old: Quota, p: Quota) -> u64 {
    if share == 0 || old == p {
        return share;
    }
    let share = share as u128;
    let by_units = share * p.window_ms as u128 / old.window_ms.max(1) as u128;
    let by_rate = share * p.limit as u128 / old.limit.max(1) as u128;
    by_units.min(by_rate) as u64
}

impl Accrual {
    /// 1 while a fraction of a token is kept (`units`): what a holder holds
    /// with it, counted in whole tokens for `low`.
    fn fraction(&self) -> u64 {
        u64::from(self.units > 0)
    }
}

/// Per-key state. `repr(C)` keeps the declared order, so everything the
/// admit path reads or writes (the first eight fields, 57 bytes) sits in the
/// entry's first 64 bytes (a unit test checks it). Not aligned to a cache
/// line: behind the `Arc`'s counts that took an aligned allocation of 64
/// bytes more than needed; the first 64 bytes may then straddle two lines,
/// and a lookup in a large table still measured faster (docs/benchmarks.md,
/// "Memory per tracked key").
#[repr(C)]
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
    /// Prefetch when fewer local tokens than this are left.
    pub threshold: AtomicU64,
    /// A lease request for this key is in flight.
    pub in_flight: AtomicBool,
    /// Further rules of the key (0: one rule); their windows are in `extra`.
    pub more: AtomicU8,
    /// The entry left the table; tokens granted to it go straight back.
    pub retired: AtomicBool,
    /// How the key's rules were chosen: [`MARK_DEFAULT`] (no tier named),
    /// [`MARK_PINNED`] (its own policy: `set_limit`, store or file), or the
    /// id of the tier the caller named. A call naming another resolves again.
    pub mark: AtomicU32,
    // --- the cold path's fields ---
    /// The id of the key's rules for its decisions ([`crate::policy::RuleSet`]).
    pub rule_set: AtomicU32,
    /// The key's calendar ([`Calendar`]; 0: a token bucket), in the
    /// padding after `rule_set`. A calendar key's `more` has
    /// [`MORE_CALENDAR`] set: its admits take the path of several rules.
    pub calendar: AtomicU32,
    /// The entries of the further rules' buckets (the admit path reaches
    /// them here, with no lookup; the table holds them too).
    pub subs: [arc_swap::ArcSwapOption<Entry>; MAX_RULES - 1],
    /// This is a further rule's bucket of some key (its requests are
    /// counted on the key's own entry).
    pub sub: bool,
    /// The key's rules are in shadow mode: the cold path admits what they
    /// deny (reason `shadow`). In the padding after `sub`: no extra bytes.
    pub shadow: AtomicBool,
    /// An allow or deny entry holds the key ([`ACCESS_UNLIMITED`],
    /// [`ACCESS_BLOCKED`]; 0: none): the cold path decides every request,
    /// and tokens granted to it go straight back. Also in that padding.
    pub access: AtomicU8,
    /// Whether the running rate keeps a tail at the authority once it runs
    /// out (it was granted for longer than the shortest period): only then
    /// may it be reported after its end ([`Entry::pause_rate`]). Read and
    /// written under `accrued`'s lock, with [`Accrual::paused`]. Also in
    /// that padding.
    pub tails: AtomicBool,
    /// Adaptive leasing: tokens of this entry's lease out on reservations
    /// not settled yet (`Limiter::reserve`). Reported as held, so the
    /// ledger keeps them committed until they are settled. Also in that
    /// padding.
    pub reserved: AtomicU32,
    /// Requests denied on this key.
    pub denied: AtomicU64,
    /// Until this clock reading the authority said: empty (denials are local).
    pub exhausted_until: AtomicU64,
    /// ...for requests needing at least this many tokens from the authority.
    pub exhausted_need: AtomicU64,
    /// Adaptive leasing: offered load (admitted + denied) in milli-tokens
    /// per second, and the clock reading and count of its last sample.
    pub demand: AtomicU64,
    pub demand_at: AtomicU64,
    pub demand_offered: AtomicU64,
    /// A rate grant (credit units per ms; 0: none), valid until `rate_until`,
    /// accrued into `tokens` as [`Accrual`] says (exact: no fraction lost or
    /// created). A lock, on the rate-mode cold path only.
    pub rate: AtomicU64,
    pub accrued: Mutex<Accrual>,
    pub rate_until: AtomicU64,
    /// The window of the rate's credit units (the policy may change meanwhile).
    pub rate_window: AtomicU64,
    /// Clock reading when the last lease call was sent (the stale-request
    /// guard, the round trip, the ledger's expiries).
    pub sent_at: AtomicU64,
    /// The number ([`crate::ledger::CALLS`]) of the last lease call whose
    /// answer this entry applied.
    pub applied: AtomicU64,
    /// The ledger's commitment (I3): local tokens are valid until
    /// `lease_until` (0: until given back), and a rate fills them up to `commit`.
    pub lease_until: AtomicU64,
    pub commit: AtomicU64,
    /// The authority's fallback share for this instance (credit units per ms,
    /// i.e. tokens per window; 0: none), valid until `fallback_until`; the
    /// key's live holders at the last answer; tokens admitted under the
    /// failure policy not yet reported (debited at the next answer, I4).
    pub fallback: AtomicU64,
    pub fallback_until: AtomicU64,
    pub holders: AtomicU64,
    pub fallback_used: AtomicU64,
    /// The failover guard (`crate::guard`): the bucket's epoch and version
    /// at the last answer, the clock reading until which that answer said
    /// the bucket is kept, and the tokens granted here recently (fixed
    /// leases only, so allocated at their first grant: the ledger's guard
    /// does not read them, and an adaptive key saves their 88 bytes).
    pub auth_epoch: AtomicU64,
    pub auth_version: AtomicU64,
    pub auth_alive_until: AtomicU64,
    pub recent: OnceLock<Box<Mutex<Recent>>>,
    /// Clock reading of the authority's last answer on the key (when
    /// `auth_remaining` was true; 0: none yet).
    pub auth_at: AtomicU64,
    /// A calendar key: the clock reading its current period ends at (0:
    /// not computed yet), for decisions' `reset_after_ms`.
    pub period_end: AtomicU64,
    /// The key, the same allocation as the table's key for this entry.
    pub key: std::sync::Arc<str>,
}

impl Entry {
    #[cfg(test)]
    pub fn new(key: &str, policy: Quota, threshold: u64, now: u64) -> Self {
        Self::with(key.into(), policy, threshold, now, false)
    }

    /// A new entry; `sub`: the bucket of a further rule.
    pub fn with(key: std::sync::Arc<str>, policy: Quota, threshold: u64, now: u64, sub: bool) -> Self {
        Entry {
            tokens: AtomicU64::new(0),
            last_used: AtomicU64::new(now),
            admitted: AtomicU64::new(0),
            limit: AtomicU64::new(policy.limit),
            window_ms: AtomicU64::new(policy.window_ms),
            auth_remaining: AtomicU64::new(policy.limit),
            threshold: AtomicU64::new(threshold),
            in_flight: AtomicBool::new(false),
            more: AtomicU8::new(0),
            retired: AtomicBool::new(false),
            mark: AtomicU32::new(if sub { MARK_SUB } else { MARK_DEFAULT }),
            rule_set: AtomicU32::new(0),
            calendar: AtomicU32::new(policy.calendar.0),
            subs: Default::default(),
            sub,
            shadow: AtomicBool::new(false),
            access: AtomicU8::new(0),
            tails: AtomicBool::new(false),
            reserved: AtomicU32::new(0),
            denied: AtomicU64::new(0),
            exhausted_until: AtomicU64::new(0),
            exhausted_need: AtomicU64::new(1),
            demand: AtomicU64::new(0),
            demand_at: AtomicU64::new(now),
            demand_offered: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            accrued: Mutex::new(Accrual {
                reported: u64::MAX,
                ..Accrual::default()
            }),
            rate_until: AtomicU64::new(0),
            rate_window: AtomicU64::new(policy.window_ms),
            sent_at: AtomicU64::new(0),
            applied: AtomicU64::new(crate::ledger::CALLS.load(SeqCst)),
            lease_until: AtomicU64::new(0),
            commit: AtomicU64::new(0),
            fallback: AtomicU64::new(0),
            fallback_until: AtomicU64::new(0),
            holders: AtomicU64::new(0),
            fallback_used: AtomicU64::new(0),
            auth_epoch: AtomicU64::new(0),
            auth_version: AtomicU64::new(0),
            auth_alive_until: AtomicU64::new(0),
            recent: OnceLock::new(),
            auth_at: AtomicU64::new(0),
            period_end: AtomicU64::new(0),
            key,
        }
    }

    #[inline]
    pub fn policy(&self) -> Quota {
        Quota {
            limit: self.limit.load(Relaxed),
            window_ms: self.window_ms.load(Relaxed),
            calendar: Calendar(self.calendar.load(Relaxed)),
        }
    }

    /// Move the entry to the policy `p`; returns the one it left. Its
    /// fallback share is converted with it (`share_in`), under the lock a
    /// share's store takes too ([`Self::set_share`]): a share and the policy
    /// it is read under always agree, whichever comes first.
    pub fn repolicy(&self, p: Quota) -> Quota {
        let _units = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.policy();
        self.limit.store(p.limit, Relaxed);
        self.window_ms.store(p.window_ms, Relaxed);
        self.calendar.store(p.calendar.0, Relaxed);
        self.fallback
            .store(share_in(self.fallback.load(Relaxed), old, p), Relaxed);
        old
    }

    /// Store a fallback share an answer granted under the policy `under`,
    /// converted to the entry's policy now when it has changed since.
    pub fn set_share(&self, share: u64, under: Quota) {
        let _units = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        self.fallback.store(share_in(share, under, self.policy()), Relaxed);
    }

    /// The fallback share at `now` while the answer that granted it says it
    /// is valid (0 included: the others hold the whole rate, I4); `None`
    /// once it lapsed, or before any answer.
    pub fn share_at(&self, now: u64) -> Option<u64> {
        (now < self.fallback_until.load(Relaxed)).then(|| self.fallback.load(Relaxed))
    }

    /// How many further rules the key has (its `more` less the flag).
    #[inline]
    pub fn further(&self) -> usize {
        ((self.more.load(Acquire) & !MORE_CALENDAR) as usize).min(MAX_RULES - 1)
    }

    /// The policy of a key whose `more` is 0: a token bucket (a calendar
    /// key's `more` has [`MORE_CALENDAR`] set), read without the calendar.
    #[inline(always)]
    pub fn bucket_policy(&self) -> Quota {
        Quota::new(self.limit.load(Relaxed), self.window_ms.load(Relaxed))
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

    /// Spend up to `n` local tokens, as many as there are. Returns how many.
    pub fn take_up_to(&self, n: u64) -> u64 {
        let mut cur = self.tokens.load(Relaxed);
        loop {
            let take = cur.min(n);
            if take == 0 {
                return 0;
            }
            match self.tokens.compare_exchange_weak(cur, cur - take, AcqRel, Relaxed) {
                Ok(_) => return take,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Add what a rate grant accrued up to `now` (at most `cap` tokens held
    /// locally; whole tokens beyond it are dropped), for
    /// a caller about to take `take` of them (0: none). Returns tokens added.
    pub fn accrue(&self, now: u64, cap: u64, take: u64) -> u64 {
        let w = self.rate_window.load(Acquire).max(1);
        let rate = self.rate.load(Acquire);
        if rate == 0 {
            return 0;
        }
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let end = now.min(self.rate_until.load(Acquire));
        if end <= acc.at {
            return 0;
        }
        let units = rate * (end - acc.at) + acc.units;
        (acc.at, acc.units) = (end, units % w);
        let tokens = units / w;
        // (tokens out on reservations are held too: the commitment counts
        // them until they are settled, and a settle below the estimate
        // puts them back in the lease)
        let lease = self.tokens.load(Relaxed);
        let held = lease + u64::from(self.reserved.load(Relaxed));
        // Accrual is taken lazily, when the tokens held ran out; it filled
        // what the commitment left beside what was held all along, so the
        // most held since the last accrual bounds it, not what is held now
        // (a holder that kept a full carry through a lull, then spent it,
        // took a second carry at once: four holders of a 100/s key admitted
        // 13 over one bucket, `a_carry_kept_through_a_lull_is_one_carry`).
        let most = held.max(acc.peak);
        let add = tokens.min(cap.saturating_sub(most));
        // What stays held once the caller took its tokens (if they are there).
        let stays = match lease + add {
            have if take > 0 && take <= have => held + add - take,
            _ => held + add,
        };
        if add < tokens || most + add >= cap {
            // A fraction of a token beside a full commitment would be more
            // than it: held with it, even for the instant before the
            // caller's take, it is spent early, and n holders at once spend
            // up to n tokens over one bucket (ten holders of a 100/s key
            // with `carry_ms` 1000: 109 in 20 ms where one bucket allowed
            // 102, when a take was taken to leave room for it). The ledger
            // sizes a carry a token over its rate's share for the fraction
            // (`ledger.lua` `rate_grant`), so a one-token share keeps it.
            // Full means the most held since the last accrual, as for whole
            // tokens: a fraction that accrued while the commitment was held
            // full, kept once the holder had spent it, brought its next
            // token that much early (69.2 admitted where one bucket allows
            // 68, `schedule_y_a_fraction_accrued_beside_a_full_carry_is_dropped`).
            acc.units = 0;
        }
        // The most held since the last accrual, counted with what accrued
        // meanwhile (`spent_credit` reads it as the most the holder had:
        // what accrued while the tokens held stayed at `peak` could have
        // been spent then). With only what is held now plus `add`, a
        // holder that kept its tokens through a lull while its rate filled
        // the carry, then spent both, was credited refill for the carry as
        // if it had never held it: 115.2 admitted where one bucket allows
        // 114 (`schedule_v_a_carry_filled_through_a_lull_is_held`).
        // A fraction of a token kept beside them is held too, as a whole
        // one: counted as none, each holder's credit could come up to a
        // token over the room its commitment left, and three at once went
        // over one bucket (83.1 admitted where it allows 82 and its refill,
        // `schedule_w_a_fraction_held_is_counted_in_low`).
        acc.low = acc.low.max(most + add + acc.fraction());
        acc.peak = stays;
        drop(acc);
        self.tokens.fetch_add(add, AcqRel);
        add
    }

    /// A lease call leaves at `now`: the rate stops accruing (what it
    /// accrued up to `now` must be taken first) and is kept, with its end,
    /// in [`Accrual::paused`] until the answer lands. Returns the rate the
    /// call reports (0: none): the running one, or the one that last ran
    /// out ([`Self::rate_ran_out`]) while the authority keeps its room for
    /// it, `tail_ms` (the ledger's renewal grace, `min_period_ms`) after its
    /// end and within the commitment (`commit_until`, 0: none), so that an
    /// authority that lost the key's state re-grants it (docs/design.md,
    /// "State loss": a rate that ran out while Redis restarted was reported
    /// as none, and its holder got nothing while the new state learned).
    /// The holder's end is before the authority's (it counts from when its
    /// call left), and so is the grace's. A rate in the units of another
    /// window than the call's (`window`: the key's policy changed) is not
    /// reported.
    pub fn pause_rate(&self, now: u64, window: u64, tail_ms: u64, commit_until: u64) -> u64 {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let rate = self.rate.load(Acquire);
        let until = self.rate_until.swap(now, AcqRel);
        let last = if rate > 0 { (rate, until) } else { acc.paused };
        let tail = if self.tails.load(Relaxed) { tail_ms } else { 0 };
        let reported = last.0 > 0
            && now < last.1.saturating_add(tail)
            && (commit_until == 0 || now < commit_until)
            && self.rate_window.load(Acquire) == window.max(1);
        acc.paused = if reported { last } else { (0, 0) };
        acc.paused.0
    }

    /// The rate ran out at its end: it accrues no more, and until the next
    /// lease call it is the last rate this holder may report, if it keeps a
    /// tail ([`Self::pause_rate`]), unless a call in flight holds one
    /// already.
    pub fn rate_ran_out(&self) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let rate = self.rate.swap(0, AcqRel);
        if rate > 0 && acc.paused.0 == 0 && self.tails.load(Relaxed) {
            acc.paused = (rate, self.rate_until.load(Acquire));
        }
    }

    /// The rate and any the holder may still report are gone: an answer
    /// without one, or a call that failed after it may have reached the
    /// authority (which may then have replaced the rate it reported).
    pub fn forget_rate(&self) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        acc.paused = (0, 0);
        self.rate.store(0, Release);
    }

    /// The renewal that paused the rate ([`Self::pause_rate`]) certainly
    /// never reached the authority: the rate runs on to its end as if the
    /// call had not left (the authority still counts it, I1; what the
    /// flight accrued is taken from where the pause left it), and one that
    /// ran out may still be reported. Not when a give-back ended the rate
    /// since ([`Self::end_rate`]).
    pub fn resume_rate(&self) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let (rate, until) = std::mem::take(&mut acc.paused);
        if rate > 0 {
            self.rate_until.store(until, Release);
            self.rate.store(rate, Release);
        }
    }

    /// End the rate (a give-back ends it at the authority): returns whether
    /// one ran, and the last lease call counted applied, which the
    /// give-back sends: the authority ends only a rate that call or an
    /// earlier one set. An answer counts applied once its rate started
    /// (`Engine::lease_done`), and this reads it under the lock that start
    /// takes: a rate read here as applied is ended here too. The rate of a
    /// later call's answer (in flight, or landing) stays counted at the
    /// authority and runs here when it lands (or, started already, is ended
    /// here: that only accrues less than the authority counts). A rate
    /// paused by a renewal in flight is forgotten, so that renewal, failing
    /// unsent, does not resume it (the give-back may have reached the
    /// authority; a renewal's answer landing later accrues its flight at no
    /// old rate).
    pub fn end_rate(&self) -> (bool, u64) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        acc.paused = (0, 0);
        (self.rate.swap(0, AcqRel) > 0, self.applied.load(Acquire))
    }

    /// Start accruing a new rate grant of `rate` units of 1/`window` token
    /// per ms at `now`, the answer to a call sent at `sent`. The last rate's
    /// fraction of a token carries over, in the same window, only when it
    /// is `covered`: the commitment it accrued under was still live when the
    /// call left, so the fraction lies within a commitment the authority
    /// counts (I2). A fraction whose commitment expired is dropped: the
    /// refill has filled the bucket in its place since, and handing it out
    /// would be a token over one bucket (six holders bursting after a quiet
    /// window admitted 89 where 87.9 were allowed: `ledger_bound`'s
    /// `schedule_n_a_burst_after_a_quiet_window`). Under the same condition
    /// the round trip of a renewal accrues the smaller of the paused rate
    /// and the new one (until the paused one's end): the authority counted
    /// the old rate until the call arrived and the new one from then, so
    /// all along the flight it paid for at least that much (I3).
    pub fn start_rate(&self, rate: u64, window: u64, (until, tails): (u64, bool), covered: bool, sent: u64, now: u64) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        self.tails.store(tails, Relaxed);
        let (old, old_until) = std::mem::take(&mut acc.paused);
        if self.rate_window.swap(window.max(1), AcqRel) != window.max(1) || !covered {
            acc.units = 0;
        } else {
            acc.units += old.min(rate) * now.min(old_until).saturating_sub(sent);
        }
        acc.at = now;
        acc.peak = self.tokens.load(Acquire);
        self.rate_until.store(until, Release);
        self.rate.store(rate, Release);
    }

    /// Tokens were added to those held (a grant, a refund, a reservation's
    /// count): a rate's next accrual fills only what the commitment leaves
    /// beside them, and the most held since the last lease call left
    /// ([`Self::low_window`]) counts them. Every such addition calls it
    /// after the add, under the lock a lease call reads that under.
    pub fn note_held(&self) {
        self.note_landed(0);
    }

    /// [`Self::note_held`] for a grant of which the request that asked
    /// takes `spent` as it lands: the ledger's commitment leaves them out
    /// (`Ask::spent`), so the commitment's room beside what is held leaves
    /// them out too. (Counted, a key whose holders' commitments are a token
    /// or two found its commitment full after every such grant, and the
    /// next accrual dropped the fraction the rate had accrued: a thousand
    /// holders of a token a second each used 0.831 of the allowance, 0.859
    /// with them left out; 0.879 before fractions were held to the peak.)
    /// A request that gave up before they landed leaves them held: the
    /// design's exception (c), as at the authority.
    pub fn note_landed(&self, spent: u64) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        self.note_in(&mut acc, spent);
    }

    fn note_in(&self, acc: &mut Accrual, spent: u64) {
        let held = self.held();
        acc.peak = acc.peak.max(held.saturating_sub(spent));
        acc.low = acc.low.max(held + acc.fraction());
    }

    /// Put up to `n` tokens back into the lease (a reservation settled
    /// below its estimate, tokens a request took and did not spend): as
    /// many as fit below `commit` (`None`: no ledger counts the lease) and
    /// below the least held a lease call in flight reported. The authority
    /// counts such a call's holder for what it reported and what it
    /// grants, whatever was held when the answer lands: tokens put back
    /// meanwhile beyond what it reported are held outside the commitment
    /// (a prefetch left while a reservation's tokens were taken and not
    /// yet counted, reporting 0 held; the settle put 2 back beside the
    /// answer's commitment of 1: 60 admitted where one bucket allows 59,
    /// `schedule_z_a_settle_refunds_no_more_than_a_call_in_flight_reported`).
    /// Under the lock a lease call reads what it reports under, so each
    /// call either reports them or caps them. Returns how many went back.
    pub fn refill(&self, n: u64, commit: Option<u64>) -> u64 {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let add = match commit {
            None => n,
            Some(c) => {
                let top = acc.reported.min(c);
                n.min(top.saturating_sub(self.held()))
            }
        };
        if add > 0 {
            self.tokens.fetch_add(add, AcqRel);
            self.note_in(&mut acc, 0);
        }
        add
    }

    /// An answer starts landing: until it has ([`Self::landed`]), nothing
    /// goes back into the lease (its commitment and its grant do not land
    /// at once).
    pub fn landing(&self) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        acc.reported = 0;
    }

    /// The answer to lease call `seq` has landed: when no later call left
    /// meanwhile (`low_seq`: the last call that left), the commitment it
    /// set counts what is held again.
    pub fn landed(&self, seq: u64) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        if acc.low_seq == seq {
            acc.reported = u64::MAX;
        }
    }

    /// Whether nothing has been held since the rate's accrual was last
    /// taken (none held now, and none at any time since): what it accrued
    /// since then fits whole in the commitment, so taking it can wait for
    /// a request (the sweep leaves it). Taken by a sweep into an empty
    /// lease, it would be held, and the next accrual, which cannot tell
    /// when the request took it, counts it held all along (`peak`) and
    /// drops the fraction its rate accrued meanwhile: on a key whose
    /// holders' shares are a few tokens a second that is a part of a token
    /// at most requests (with the grants' landing tokens left out of the
    /// peak too, `note_landed`: 20 holders of a 50/s key at 2x 0.828 ->
    /// 0.850 of the allowance; a thousand holders of a token a second 0.822
    /// -> 0.859).
    pub fn nothing_held_since_accrual(&self) -> bool {
        let acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        acc.peak == 0 && self.held() == 0
    }

    /// Tokens held: local ones and those out on reservations not settled.
    pub fn held(&self) -> u64 {
        self.tokens.load(Acquire) + u64::from(self.reserved.load(Acquire))
    }

    /// Lease call `seq` leaves: what is held now, which it reports (and
    /// [`Self::refill`] fills no further until it is answered); the most
    /// tokens held since the last one left (what is held now included) and
    /// that one's number (0: none), which the ledger's `spent_credit`
    /// reads; the window starts again.
    pub fn low_window(&self, seq: u64) -> (u64, u64, u64) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        let held = self.held();
        acc.reported = acc.reported.min(held);
        let with_fraction = held + acc.fraction();
        let out = (held, acc.low.max(with_fraction), acc.low_seq);
        (acc.low, acc.low_seq) = (with_fraction, seq);
        out
    }

    /// Forget the fraction of a token a rate accrued, and the paused rate
    /// (the commitment they lay within is replaced by one that has no room
    /// for them).
    pub fn drop_fraction(&self) {
        let mut acc = self.accrued.lock().unwrap_or_else(|e| e.into_inner());
        acc.units = 0;
        acc.paused = (0, 0);
    }

    /// Count `tokens` granted by the authority at `now` (the failover guard
    /// of fixed leases).
    pub fn granted(&self, tokens: u64, now: u64) {
        if tokens > 0 {
            let w = self.window_ms.load(Relaxed);
            self.recent
                .get_or_init(Box::default)
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(tokens, now, w);
        }
    }

    /// What the failover guard sends with a lease call at `now`.
    pub fn guard(&self, now: u64, budget: u64) -> crate::guard::Guard {
        let w = self.window_ms.load(Relaxed);
        crate::guard::Guard {
            epoch: self.auth_epoch.load(Relaxed),
            version: self.auth_version.load(Relaxed),
            alive_ms: self.auth_alive_until.load(Relaxed).saturating_sub(now),
            recent: self
                .recent
                .get()
                .map_or(0, |r| r.lock().unwrap_or_else(|e| e.into_inner()).sum(now, w)),
            holders: self.holders.load(Relaxed),
            budget,
        }
    }

    /// What an answer said of the bucket, landed at `now`.
    pub fn seen(&self, s: crate::guard::Seen, now: u64) {
        self.auth_epoch.store(s.epoch, Relaxed);
        self.auth_version.store(s.version, Relaxed);
        self.auth_alive_until.store(now.saturating_add(s.alive_ms), Relaxed);
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
    fn the_admit_path_fields_are_the_first_64_bytes() {
        assert_eq!(align_of::<Entry>(), 8, "no padding to a cache line (issue 26)");
        assert!(offset_of!(Entry, in_flight) + size_of::<AtomicBool>() <= 64);
        assert!(offset_of!(Entry, threshold) + 8 <= 64);
        assert!(offset_of!(Entry, more) < 64);
        assert!(offset_of!(Entry, mark) + 4 <= 64);
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
    fn a_fallback_share_keeps_its_part_of_the_rate_under_a_new_policy() {
        let old = Quota::new(170, 10_000);
        let new = Quota::new(37, 1_000);
        // 17 tokens per 10 s window (1.7 a second, a tenth of the key's
        // rate): read under 1 s windows as it was, 17 a second, ten times
        // as fast; the rate rose to 37 a second, and the share keeps its
        // 1.7 a second (no more than the ledger counts), 1 per 1 s window
        assert_eq!(share_in(17, old, new), 1);
        assert_eq!(share_in(17, old, old), 17);
        // a raised rate: no more tokens per ms than the ledger counts
        assert_eq!(share_in(10, Quota::new(100, 1_000), Quota::new(1_000, 1_000)), 10);
        // a lowered rate: the same part of it (a tenth of 500 a second)
        assert_eq!(share_in(100, Quota::new(1_000, 1_000), Quota::new(500, 1_000)), 50);
        // a longer window at the same limit: the same part of the slower rate
        assert_eq!(share_in(10, Quota::new(100, 1_000), Quota::new(100, 10_000)), 10);
        // a share and a policy change in either order agree
        let e = Entry::new("k", old, 0, 1);
        e.set_share(17, old);
        assert_eq!(e.repolicy(new), old);
        let first_share = e.fallback.load(Relaxed);
        let e = Entry::new("k", old, 0, 1);
        e.repolicy(new);
        e.set_share(17, old);
        assert_eq!((first_share, e.fallback.load(Relaxed)), (1, 1));
    }

    #[test]
    fn an_entry_is_384_bytes() {
        // a field more is that many bytes more for every key (issue 26)
        assert_eq!(size_of::<Entry>(), 384);
    }

    #[test]
    fn the_shadow_and_access_flags_and_reserved_cost_no_byte() {
        // They sit in the padding between `sub` and the next 8-byte field.
        assert_eq!(offset_of!(Entry, shadow), offset_of!(Entry, sub) + 1);
        assert_eq!(offset_of!(Entry, access), offset_of!(Entry, sub) + 2);
        assert_eq!(offset_of!(Entry, reserved), offset_of!(Entry, sub) + 4);
        assert_eq!(offset_of!(Entry, denied), offset_of!(Entry, sub) + 8);
    }

    #[test]
    fn nothing_goes_back_above_what_a_call_in_flight_reported() {
        let e = Entry::new("k", Quota::new(10, 1000), 1, 0);
        // no ledger counts the lease: all of it goes back
        assert_eq!(e.refill(3, None), 3);
        // a call leaves reporting the 3 held; then 2 are taken (a
        // reservation not counted yet)
        assert_eq!(e.low_window(7).0, 3);
        assert_eq!(e.try_take(2), Some(1));
        // a commitment of 8, but the answer will count 3 and its grant:
        // 2 go back, not 5
        assert_eq!(e.refill(5, Some(8)), 2);
        // nothing while its answer lands, then up to the commitment again
        e.landing();
        assert_eq!(e.refill(1, Some(8)), 0);
        e.landed(7);
        assert_eq!(e.refill(9, Some(8)), 5);
        // an earlier call's answer landing while a later one is out leaves
        // the later one's cap (lowered to nothing while it landed)
        assert_eq!(e.low_window(9).0, 8);
        e.landing();
        e.landed(8);
        assert_eq!(e.take_up_to(8), 8);
        assert_eq!(e.refill(1, Some(8)), 0);
        e.landing();
        e.landed(9);
        assert_eq!(e.refill(1, Some(8)), 1);
        // reserved tokens count as held
        e.reserved.store(7, Relaxed);
        assert_eq!(e.refill(3, Some(8)), 0);
    }

    #[test]
    fn try_take_spends_only_what_is_there() {
        let e = Entry::new("k", Quota::new(10, 1000), 1, 0);
        assert_eq!(e.try_take(1), None);
        e.tokens.store(3, Relaxed);
        assert_eq!(e.try_take(2), Some(1));
        assert_eq!(e.try_take(2), None);
        assert_eq!(e.try_take(1), Some(0));
    }

    #[test]
    fn a_rate_accrues_exactly_and_hands_back_what_does_not_fit() {
        let p = Quota::new(10, 1000);
        let e = Entry::new("k", p, 1, 0);
        // 3 credit units per ms: a token every 333.3 ms, until 2000
        e.start_rate(3, p.window_ms, (2_000, false), true, 0, 0);
        assert_eq!(e.accrue(333, 5, 0), 0, "999 units: not a whole token yet");
        assert_eq!(e.accrue(334, 5, 0), 1, "1002 units");
        assert_eq!(e.accrue(1_000, 5, 0), 2, "3000 units in all, no fraction lost");
        // cap 1: 1000..2000 at 3/ms, 3 tokens over the cap, are dropped
        assert_eq!(e.accrue(5_000, 1, 0), 0, "3 tokens held already");
        assert_eq!(e.tokens.load(Relaxed), 3);
        assert_eq!(e.accrue(6_000, 10, 0), 0, "the rate ended at 2000: nothing more");
    }

    #[test]
    fn accrual_fills_only_what_the_most_held_left() {
        let p = Quota::new(10, 1000);
        let e = Entry::new("k", p, 1, 0);
        // 10 credit units per ms: a token every 100 ms; a commitment of 5
        e.start_rate(10, p.window_ms, (100_000, false), true, 0, 0);
        assert_eq!(e.accrue(400, 5, 0), 4);
        // 4 held through a quiet second, then spent: the accrual filled the
        // one token of room beside them, not the 5 of an empty lease
        assert_eq!(e.take_up_to(4), 4);
        assert_eq!(e.accrue(1_400, 5, 0), 1);
        // held 1 since: room for 4 more
        assert_eq!(e.take_up_to(1), 1);
        assert_eq!(e.accrue(2_400, 5, 0), 4);
        // a grant raises what is held (and the most held)
        e.tokens.fetch_add(3, AcqRel);
        e.note_held();
        assert_eq!(e.take_up_to(7), 7);
        assert_eq!(e.accrue(3_400, 5, 0), 0, "7 held since the last accrual: no room");
    }

    #[test]
    fn a_fraction_stays_only_below_the_commitment() {
        let p = Quota::new(10, 1000);
        // 3 credit units per ms: a token every 333.3 ms; a commitment of
        // two (a one-token share and a token for the fraction) and of one
        let roomy = Entry::new("k", p, 1, 0);
        roomy.start_rate(3, p.window_ms, (10_000, false), true, 0, 0);
        let full = Entry::new("k", p, 1, 0);
        full.start_rate(3, p.window_ms, (10_000, false), true, 0, 0);
        // at 500: 1.5 tokens accrued; one whole token each
        assert_eq!(roomy.accrue(500, 2, 1), 1);
        assert_eq!(roomy.try_take(1), Some(0));
        assert_eq!(full.accrue(500, 1, 1), 1);
        assert_eq!(full.try_take(1), Some(0));
        // at 700: 2.1 in all; below its commitment the half token was kept
        // (1.5 held at most, within 2); at its commitment it was dropped
        // (1.5 would be more than 1, even before the take)
        assert_eq!(roomy.accrue(700, 2, 1), 1, "the half token was kept");
        assert_eq!(full.accrue(700, 1, 1), 0, "the half token was dropped at the cap");
        // capped accrual keeps no fraction either
        let capped = Entry::new("k", p, 1, 0);
        capped.start_rate(3, p.window_ms, (10_000, false), true, 0, 0);
        assert_eq!(capped.accrue(1_100, 2, 0), 2, "3.3 accrued, 2 fit");
        assert_eq!(capped.take_up_to(2), 2);
        assert_eq!(
            capped.accrue(1_300, 2, 0),
            0,
            "0.6 more: the 0.3 was dropped with the third token"
        );
    }
}
