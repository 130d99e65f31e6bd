//! The engine's side of the authority seam: lease and give-back calls, and
//! what their answers do to a key (tokens in, "exhausted until", counters,
//! circuit). Every call goes out through [`Authority::call`]; the memory
//! authority answers inline, Redis from the broker thread.

use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use super::entry::Entry;
use super::Engine;
use crate::authority::{Call, Done, Now, Reply};
use crate::bucket::{Grant, Quota};
use crate::config::Mode;
use crate::error::Result;
use crate::ledger::{Answer, Ask};
use crate::metrics::Counters;
use crate::wire::Back;

impl Engine {
    /// Whether adaptive leasing decides a key of policy `p` one request at a
    /// time ([`Ask::single`]): its overshoot budget is a share of the limit
    /// under one whole token (the default 2 % of a limit below 50). Such a
    /// key is leased exactly what each request needs, with no prefetch and
    /// no rate, so the fleet admits what one exact bucket would.
    pub(super) fn single(&self, p: Quota) -> bool {
        self.r.adaptive && self.r.cfg.overshoot_budget.under_a_token(p.limit)
    }

    /// The time an authority call is made at.
    pub(super) fn now(&self) -> Now {
        self.now_at(self.clock.precise())
    }

    /// The time an authority call is made at, at this clock's reading `ms`.
    fn now_at(&self, ms: u64) -> Now {
        Now {
            ms: self.clock.authority(ms),
            explicit: self.clock.is_manual(),
            wall_ms: self.clock.wall(),
        }
    }

    /// Send one call, counting it in flight until its answer is handled.
    pub(super) fn submit(&self, call: Call, done: Done) -> Result<()> {
        if !self.is_inline() {
            self.broker()?;
        }
        self.pending.fetch_add(1, AcqRel);
        Counters::add(&self.counters.backend_calls, 1);
        self.authority.call(call, done).inspect_err(|_| {
            self.pending.fetch_sub(1, AcqRel);
        })
    }

    /// Every answer ends here: errors counted, circuit told, waiters woken.
    pub(super) fn finish(&self, r: std::result::Result<(), &str>) {
        if r.is_err() {
            Counters::add(&self.counters.backend_errors, 1);
        }
        // Before the circuit hears of it: a caller that finds the circuit
        // open finds the reason there too.
        if !self.is_inline() {
            self.note_misconfig(r);
        }
        // The memory authority fails only in a simulated outage: skip the
        // circuit's bookkeeping on its (inline, frequent) successes.
        if !self.is_inline() || r.is_err() || self.circuit.is_open() {
            self.on_answer(r);
        }
        let _ = self
            .pending
            .fetch_update(AcqRel, Acquire, |p| Some(p.saturating_sub(1)));
        self.wake_all();
    }

    /// Send a lease request for `e` (want, need) unless one is in flight.
    /// `spent`: tokens of the grant the waiting request spends as it lands
    /// (0 for a prefetch or a request that does not wait): the ledger does
    /// not count them as held. Memory authorities answer inline. Returns
    /// false if one was in flight.
    pub(super) fn start_lease(&self, e: &Arc<Entry>, want: u64, need: u64, spent: u64) -> bool {
        let now = self.clock.coarse();
        if e.in_flight.swap(true, AcqRel) {
            // Every request is bounded by the backend timeout; one in flight
            // for far longer was lost somewhere: do not let it block the key.
            // (0: a fresh entry's first call, claimed a moment ago.)
            let stale = self.r.cfg.backend_timeout_ms * 4 + 1_000;
            let sent = e.sent_at.load(Acquire);
            if sent == 0 || now.saturating_sub(sent) < stale || self.clock.is_manual() {
                return false;
            }
            tracing::warn!(key = %e.key, "quotalease: a lease request was lost; sending a new one");
            // Its answer could still land after the new call left: count
            // it as applied, so the ledger never gives back a grant this
            // holder may yet spend (a grant lost for good is then lost).
            // Its rate may have been replaced: the new call reports none.
            e.applied.fetch_max(crate::ledger::CALLS.load(SeqCst), AcqRel);
            e.forget_rate();
        } else {
            // The claim's time at once, so that a thread finding this call in
            // flight judges it by its own time, not by the last call's (an
            // idle key's burst of requests took a call claimed a moment ago
            // for a lost one: `adaptive_bench hot`, 4 threads on a fresh
            // key). The coarse reading is at most the precise one stored
            // below, before the call leaves.
            e.sent_at.store(now, Release);
        }
        let Some(me) = self.me.upgrade() else {
            e.in_flight.store(false, Release);
            return true;
        };
        let local = self.clock.precise();
        let now = self.now_at(local);
        e.sent_at.store(local, Relaxed);
        let policy = self.authority_policy(e.policy());
        let used = e.fallback_used.load(Acquire);
        // (every lease call is numbered: `applied` tells an inline call
        // that failed, too)
        let seq = crate::ledger::CALLS.fetch_add(1, SeqCst) + 1;
        let adaptive = self.r.adaptive.then(|| {
            // A renewal replaces the grant at the authority: the old rate
            // pauses as the call leaves (the authority stops paying for it
            // when the call arrives, later), and the new one accrues from
            // when its answer lands (the authority pays from before); the
            // flight accrues the smaller of the two then (`start_rate`).
            if e.rate.load(Acquire) > 0 {
                self.accrue(e, local, e.commit.load(Relaxed), 0);
            }
            let t = &self.r.cfg.tuning;
            let rate = e.pause_rate(local, policy.window_ms, t.min_period_ms, e.lease_until.load(Acquire));
            // (tokens out on reservations stay committed until settled)
            let (held, low, low_seq) = e.low_window(seq);
            Ask {
                holder: self.holder.load(Relaxed),
                demand: e.demand.load(Relaxed),
                held,
                rate,
                carry: e.commit.load(Relaxed),
                fallback_used: used,
                share: e.share_at(local).unwrap_or(0),
                spent,
                // A call while the circuit is open (a probe) asks for what
                // the request needs and no rate: its reply may be lost as
                // the calls before it were (a starved server answers late),
                // and a rate granted unseen stays counted in the key's
                // rates until this holder's next answered call, while the
                // holder runs on its fallback share (six uneven holders
                // muted for 2.7 s: 0.964 of the allowance, 0.986 with it;
                // `lost_replies_cost_no_debt_after_the_outage`). A chunk
                // unseen comes back whole at that call (`unseen`).
                single: self.single(policy) || self.circuit.is_open(),
                commit_ms: self.commit_ms(),
                seq,
                applied: e.applied.load(Acquire),
                low,
                low_seq,
                tuning: self.r.cfg.tuning,
            }
        });
        let call = Call::Lease {
            key: e.key.to_string(),
            policy,
            want,
            need,
            now,
            adaptive,
            guard: e.guard(local, self.r.cfg.overshoot_budget.tokens(policy.limit)),
        };
        let entry = e.clone();
        let sent_under = e.policy();
        let done: Done = Box::new(move |r| me.lease_done(&entry, sent_under, (need, spent), used, seq, r));
        if self.submit(call, done).is_err() {
            e.in_flight.store(false, Release);
        }
        true
    }

    /// The key's offered load (admitted + denied per second, milli-tokens):
    /// a moving average with a one-second half-life, sampled per lease call.
    pub(super) fn sample_demand(&self, e: &Entry, now: u64) -> u64 {
        let offered = e.admitted.load(Relaxed) + e.denied.load(Relaxed);
        let at = e.demand_at.load(Relaxed);
        let dt = now.saturating_sub(at);
        let old = e.demand.load(Relaxed) as f64;
        // The first estimate waits for `demand_first_ms` of traffic, or for
        // `demand_first_requests` (a busy key: until then every request
        // costs a call, as chunks are sized by demand), and is then taken
        // whole; later samples (10 ms apart at least) are averaged in with
        // `demand_half_life_ms`.
        let seen = offered.saturating_sub(e.demand_offered.load(Relaxed));
        let due = if old == 0.0 {
            dt >= self.r.cfg.tuning.demand_first_ms || (dt >= 1 && seen >= self.r.cfg.tuning.demand_first_requests)
        } else {
            dt >= 10
        };
        if due && e.demand_at.compare_exchange(at, now, AcqRel, Relaxed).is_ok() {
            let before = e.demand_offered.swap(offered, AcqRel);
            let sample = offered.saturating_sub(before) as f64 * 1e6 / dt as f64;
            let keep = if old == 0.0 {
                0.0
            } else {
                0.5f64.powf(dt as f64 / self.r.cfg.tuning.demand_half_life_ms as f64)
            };
            e.demand.store((old * keep + sample * (1.0 - keep)) as u64, Relaxed);
        }
        e.demand.load(Relaxed)
    }

    /// How long the authority keeps an adaptive commitment: until it is given
    /// back for the memory authority on the system clock (its holders live
    /// and die with it, and nothing ticks their expiry), else
    /// its tuning's `commit_ms`.
    pub(super) fn commit_ms(&self) -> u64 {
        if self.is_inline() && !self.clock.is_manual() {
            0
        } else {
            self.r.cfg.tuning.commit_ms
        }
    }

    fn lease_done(
        &self,
        e: &Entry,
        sent_under: Quota,
        (need, spent): (u64, u64),
        used: u64,
        seq: u64,
        r: std::result::Result<Reply, String>,
    ) {
        let now = self.clock.precise();
        if !self.is_inline() {
            // Round trip, from the reading the request went out at.
            let rtt = now.saturating_sub(e.sent_at.load(Relaxed));
            let old = self.rtt_ms.load(Relaxed);
            self.rtt_ms
                .store(if old == 0 { rtt } else { (old * 7 + rtt) / 8 }, Relaxed);
        }
        let r = match r {
            Ok(Reply::Grant(g, answer, seen)) => {
                if self.r.adaptive {
                    e.landing();
                }
                if answer.is_some() && used > 0 {
                    // the authority debited them
                    let _ = e
                        .fallback_used
                        .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(used)));
                }
                // (the state's promised life counts from when the call
                // left: the authority's count starts later)
                let from = if answer.is_some() {
                    e.sent_at.load(Relaxed).min(now)
                } else {
                    now
                };
                self.seen(e, seen, from);
                if let Some(a) = answer {
                    self.apply_answer(e, a, sent_under, now);
                }
                // Applied once its rate runs (a give-back from here on ends
                // that rate at the authority as it ends it here,
                // `Entry::end_rate`), and before its tokens land (a call
                // that reads `applied` later has this answer applied or
                // being applied).
                e.applied.fetch_max(seq, AcqRel);
                if g.granted > 0 || answer.is_none_or(|a| a.rate == 0) {
                    self.apply_grant(e, g, need, spent, now);
                }
                // Granted under a policy the key has left meanwhile: held
                // as what the change found (`leave_policy`; its fallback
                // share is converted as it is stored, `Entry::set_share`).
                if e.policy() != sent_under {
                    self.leave_policy(e, sent_under);
                }
                // An answer that lands after its commitment's expiry (a
                // pause, a clock that jumped while it was out) grants
                // nothing this holder may spend (I3): it goes back at once.
                let until = e.lease_until.load(Acquire);
                if until != 0 && now >= until {
                    self.expire_if_idle(e, e.policy(), now);
                }
                if self.r.adaptive {
                    e.landed(seq);
                }
                Ok(())
            }
            Ok(other) => Err(format!("unexpected answer to a lease: {other:?}")),
            Err(err) => {
                // Never sent: the renewal changed nothing at the authority,
                // so the rate it paused runs on to its end, and the next
                // probe renews it (a renewal due while Redis restarts fails
                // so; paused, its holder reported no rate to the restarted
                // authority, which grants such a holder nothing while it
                // learns: `a_renewal_that_fails_unsent_keeps_its_rate`).
                // A call that may have reached it: the authority may have
                // replaced the rate it reported, which is no longer this
                // holder's to report.
                if self.r.adaptive && crate::wire::is_unsent(&err) {
                    e.resume_rate();
                } else if self.r.adaptive {
                    e.forget_rate();
                }
                Err(err)
            }
        };
        e.in_flight.store(false, Release);
        self.finish(r.as_ref().map(|_| ()).map_err(String::as_str));
    }

    /// The bucket's stamp from an answer (the failover guard); a loss the
    /// authority found is logged (the tokens granted here in the last
    /// window were debited again).
    pub(super) fn seen(&self, e: &Entry, seen: crate::guard::Seen, now: u64) {
        if seen.lost {
            tracing::warn!(
                key = %e.key,
                "quotalease: the authority had lost this key's state (restarted empty, or a replica that \
                 missed writes promoted); it grants no new tokens until every commitment of the lost state \
                 has expired"
            );
        }
        e.seen(seen, now);
    }

    /// The adaptive part of an answer: the commitment's expiry and cap, the
    /// fallback share, a rate grant (or the end of one), and the prefetch
    /// threshold for the demand. Durations count from when the call was
    /// sent (`sent_at`, on this clock): the authority's count starts later,
    /// so this holder's expiries come first (I3).
    fn apply_answer(&self, e: &Entry, a: Answer, under: Quota, now: u64) {
        let p = e.policy();
        let sent = e.sent_at.load(Relaxed).min(now);
        // the commitment the last answer made was still live at the
        // authority when this call left (0: it lives until given back; the
        // authority keeps it `expiry_margin_ms` past this holder's expiry at
        // least): a fraction of a token its rate accrued is within it
        let old_until = e.lease_until.load(Acquire);
        let covered = old_until == 0 || sent < old_until + self.r.cfg.tuning.expiry_margin_ms;
        e.commit.store(a.commit, Relaxed);
        let until = if a.commit_ms == 0 {
            0
        } else {
            (sent + a.commit_ms)
                .saturating_sub(self.r.cfg.tuning.expiry_margin_ms)
                .max(1)
        };
        e.lease_until.store(until, Release);
        e.set_share(a.fallback, under);
        e.fallback_until.store(sent + a.fallback_ms, Relaxed);
        e.holders.store(a.holders, Relaxed);
        if a.rate > 0 {
            // What the old grant accrued was taken when the call left; the
            // new one accrues from now (its answer), until its end.
            let tails = a.rate_ms > self.r.cfg.tuning.min_period_ms;
            e.start_rate(a.rate, p.window_ms, (sent + a.rate_ms, tails), covered, sent, now);
            e.exhausted_until.store(0, Relaxed);
        } else {
            // (the authority ended the rate: none to report either)
            e.forget_rate();
            // a chunk's commitment holds the chunk: no room for a fraction
            e.drop_fraction();
        }
        // Prefetch a round trip's worth (twice) ahead of running dry; an
        // inline authority needs no prefetch, nor a key decided one request
        // at a time, nor a key whose demand does not expect another request
        // before an idle lease goes back (`lease_ttl_ms`): there a prefetch
        // costs a lease call and a give-back and serves nobody.
        let d = e.demand.load(Relaxed) as u128;
        if self.single(p) || d * (self.r.cfg.lease_ttl_ms as u128) < 1_000_000 {
            e.threshold.store(0, Relaxed);
        } else if !self.is_inline() {
            let rtt = self.rtt_ms.load(Relaxed) as u128;
            e.threshold.store(1 + (2 * d * rtt).div_ceil(1_000_000) as u64, Relaxed);
        }
    }

    /// Take what a rate grant accrued up to `now` (at most `cap` held, for a
    /// request about to spend `take`): those tokens came from the
    /// authority, so they count as leased.
    pub(super) fn accrue(&self, e: &Entry, now: u64, cap: u64, take: u64) {
        let got = e.accrue(now, cap, take);
        if got > 0 {
            // (a rate is the ledger's: its guard reads no recent grants)
            Counters::add(&self.counters.tokens_leased, got);
        }
    }

    fn apply_grant(&self, e: &Entry, g: Grant, need: u64, spent: u64, now: u64) {
        Counters::add(&self.counters.tokens_leased, g.granted);
        e.auth_remaining.store(g.remaining, Relaxed);
        e.auth_at.store(now.max(1), Relaxed);
        if g.granted == 0 {
            // Come back when half a lease has refilled, not at the first token:
            // at saturation, instances then lease chunks instead of racing
            // for single tokens (fewer Redis calls; the budget is still all
            // used, since the bucket keeps what accumulates meanwhile).
            let p = e.policy();
            let (lease, _) = self.lease_params(p);
            let settle = if self.r.cfg.mode == Mode::Lease && !self.r.adaptive {
                p.ms_for_tokens(lease / 2)
            } else {
                0
            };
            // A calendar quota's wait runs to the period's end: denials stay
            // local for a longest period only, so tokens others give back
            // are found (its denials still say the true wait).
            // A permit bucket's denials stay local for a recheck: a permit
            // may come back at any release.
            let wait = if p.calendar.is_some() {
                g.wait_ms.min(self.r.cfg.tuning.max_period_ms)
            } else if p.calendar.is_in_flight() {
                g.wait_ms.min(self.r.cfg.tuning.recheck_ms)
            } else {
                g.wait_ms
            };
            e.exhausted_need.store(need, Relaxed);
            e.exhausted_until.store(now + wait.max(1) + settle, Relaxed);
        } else {
            e.exhausted_until.store(0, Relaxed);
            if !self.r.adaptive {
                e.granted(g.granted, now);
            }
            // Fresh tokens start their lease TTL now.
            e.touch(now);
            e.tokens.fetch_add(g.granted, AcqRel);
            e.note_landed(spent.min(g.granted));
            if e.retired.load(Acquire) || self.closed.load(Acquire) || e.access.load(Acquire) != 0 {
                let back = e.tokens.swap(0, AcqRel);
                self.give_back(e, e.policy(), back);
            }
        }
    }

    /// `Some(retry_after_ms)` when the authority said it cannot give `need`
    /// tokens yet: the denial costs no network call.
    pub(super) fn exhausted_for(&self, e: &Entry, p: Quota, need: u64, now: u64) -> Option<u64> {
        let until = e.exhausted_until.load(Relaxed);
        let known = e.exhausted_need.load(Relaxed);
        if until <= now || need < known {
            return None;
        }
        Some(if p.calendar.is_some() {
            self.period_left(e, p)
        } else {
            until - now + p.ms_for_tokens(need - known)
        })
    }

    /// Return `tokens` of `e` to the authority. With adaptive leasing this
    /// also ends the entry's rate grant (the ledger stops paying for it).
    /// A closing limiter leaves the ledger: even with nothing to return, a
    /// key where it holds a valid fallback share gets the call, which frees
    /// the share for the holders that stay.
    pub(super) fn give_back(&self, e: &Entry, policy: Quota, tokens: u64) {
        let (ends_rate, seen) = if self.r.adaptive { e.end_rate() } else { (false, 0) };
        let leaving = self.r.adaptive && self.closed.load(Acquire);
        let share = e.share_at(self.clock.precise()).is_some_and(|s| s > 0);
        if tokens == 0 && !ends_rate && !(leaving && share) {
            return;
        }
        self.send_tokens(e, policy, tokens, (leaving, seen), Back::Held);
    }

    /// Take `tokens` more of `e`'s bucket at the authority, whatever it
    /// holds (the overage of a settled reservation): what the bucket cannot
    /// pay becomes a debt its refill pays before anything is granted.
    pub(super) fn debit(&self, e: &Entry, tokens: u64) {
        if tokens > 0 {
            self.send_tokens(e, e.policy(), tokens, (false, 0), Back::Debit);
        }
    }

    /// One give-back call (or a debit) of `tokens` of `e`; `leaving`: the
    /// limiter is closing; `seen`: the last lease call whose answer `e` had
    /// applied when its rate ended here ([`Entry::end_rate`]).
    fn send_tokens(&self, e: &Entry, policy: Quota, tokens: u64, (leaving, seen): (bool, u64), what: Back) {
        let Some(me) = self.me.upgrade() else { return };
        let call = Call::GiveBack {
            key: e.key.to_string(),
            policy: self.authority_policy(policy),
            tokens,
            now: self.now(),
            holder: self.holder.load(Relaxed),
            adaptive: self.r.adaptive,
            leaving,
            seen,
            what,
            tuning: self.r.cfg.tuning,
        };
        let done: Done = Box::new(move |r| {
            let r = match r {
                Ok(Reply::Returned) => {
                    if what != Back::Debit {
                        Counters::add(&me.counters.tokens_returned, tokens);
                    }
                    Ok(())
                }
                Ok(other) => Err(format!("unexpected answer to a give-back: {other:?}")),
                Err(err) => Err(err),
            };
            me.finish(r.as_ref().map(|_| ()).map_err(String::as_str));
        });
        let _ = self.submit(call, done);
    }
}
