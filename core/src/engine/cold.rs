//! The cold path: no local tokens for the request. One state machine,
//! [`Engine::step`], decides or says what to wait for; two drivers run it,
//! one blocking a thread (`acquire`, `try_acquire`) and one awaiting
//! (`acquire_async`), with the same deadline: `backend_timeout_ms` plus a
//! little slack for the whole request (its first policy read and every
//! rule's call), after which the failure policy or a `pending` denial applies.

use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::entry::{Entry, ACCESS_BLOCKED, ACCESS_UNLIMITED};
use super::{lock, Engine, Kept};
use crate::authority::Reply;
use crate::config::{validate_key, Mode};
use crate::decision::{Decision, Reason};
use crate::error::{Error, Result};
use crate::policy::RuleSet;

/// Where an exact-mode answer lands.
pub(super) type Slot = Arc<Mutex<Option<std::result::Result<Reply, String>>>>;

/// Outcome of one step of the cold path.
pub(super) enum Step {
    Done(Decision),
    /// A lease request is in flight for this key: wait for it, then step again.
    Wait,
    /// The state changed under us (another thread spent fresh tokens): step again.
    Again,
    /// Exact mode: wait for this answer, then decide with it.
    Exact(Slot),
    /// The entry was evicted (or swept) while this request was on it; what
    /// it was granted went back: decide again on the key's entry in the table.
    Retired,
}

/// How often a request starts again on a fresh entry when its entry is
/// evicted under it, before it is decided as a timed-out lease call would be
/// (only a table far smaller than the threads filling it gets there).
const RETIRED_RETRIES: usize = 8;

/// How a cold-path caller may wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Waiting {
    /// `acquire` / `acquire_async`: may wait for a lease request.
    Yes,
    /// `try_acquire`: never waits for the network.
    No,
    /// `reserve`: may wait, and a grant it waits for stays committed at
    /// the authority (it is not reported spent): a reservation's unused
    /// tokens may go back into the lease when it is settled.
    Reserve,
    /// `acquire_concurrent`: as `Reserve`, on the bucket of a key's permits
    /// (a name with the separator callers may not use).
    Permit,
}

impl Waiting {
    /// Whether the tokens admitted stay held (a reservation's, a permit's).
    pub(crate) fn kept(self) -> Kept {
        match self {
            Waiting::Reserve | Waiting::Permit => Kept::Yes,
            Waiting::Yes | Waiting::No => Kept::No,
        }
    }
}

/// The key whose policy-store entry decides `key`'s rules: a permit
/// bucket's are its key's (the tier that sets its concurrency).
fn policy_key(key: &str, waiting: Waiting) -> &str {
    match waiting {
        Waiting::Permit => key.strip_suffix(super::policies::IN_FLIGHT_SUFFIX).unwrap_or(key),
        _ => key,
    }
}

/// The cold path of a key, over its rules, with `$drive` (blocking or
/// awaiting) deciding one bucket `$b`: one rule is driven alone; several
/// are driven in turn and the first denial gives the earlier rules' tokens
/// back. An entry evicted under the request (`None` from the driver) starts
/// it again on the key's entry in the table, at most [`RETIRED_RETRIES`]
/// times (what earlier rules took goes back first).
macro_rules! cold_path {
    ($me:ident, $key:ident, $cost:ident, $tier:ident, |$b:ident| $drive:expr) => {{
        let mut attempt = 0;
        loop {
            let e = $me.entry_for($key, $tier)?;
            if let Some(d) = $me.access_decision(&e) {
                return Ok(d);
            }
            let last = attempt == RETIRED_RETRIES;
            attempt += 1;
            if e.further() == 0 {
                $me.validate_cost(&e, $cost)?;
                let $b = &e;
                match $drive? {
                    Some(d) => return Ok(d),
                    None if last => return Ok($me.after_timeout(&$me.entry_for($key, $tier)?, $cost)),
                    None => continue,
                }
            }
            let entries = $me.rule_entries(&e);
            for s in &entries {
                $me.validate_cost(s, $cost)?;
            }
            let mut got = Vec::with_capacity(entries.len());
            for $b in &entries {
                match $drive? {
                    Some(d) if !d.allowed => return Ok($me.rules_denied(&entries, &got, d, $cost)),
                    Some(d) => got.push(d),
                    None => break,
                }
            }
            if got.len() == entries.len() {
                return Ok($me.rules_admitted(&entries, got));
            }
            // A rule's entry was evicted: what the rules before it took goes back.
            $me.undo_rules(&entries, &got, $cost);
            if last {
                return Ok($me.after_timeout(&$me.entry_for($key, $tier)?, $cost));
            }
        }
    }};
}

impl Engine {
    /// Blocking driver of the cold path.
    pub fn acquire_slow(&self, key: &str, cost: u64, waiting: Waiting, tier: Option<&str>) -> Result<Decision> {
        let d = self.decide_slow(key, cost, waiting, tier)?;
        Ok(self.shadowed(key, d))
    }

    /// Async driver of the cold path (runs on the broker's runtime).
    pub async fn acquire_slow_async(
        &self,
        key: &str,
        cost: u64,
        waiting: Waiting,
        tier: Option<&str>,
    ) -> Result<Decision> {
        let d = self.decide_slow_async(key, cost, waiting, tier).await?;
        Ok(self.shadowed(key, d))
    }

    /// Shadow mode: a denial of a key whose rules are in shadow mode is
    /// admitted (reason `shadow`), counted in `shadow_denied` (and, as the
    /// rules' decision, in `denied`) and logged at most once a second. Only
    /// the cold path denies, so the admit path pays nothing for this. The
    /// buckets are left as the denial left them: counting goes on as if the
    /// rules were enforced, which is what shadow mode is for.
    fn shadowed(&self, key: &str, d: Decision) -> Decision {
        // A deny entry is no rule under trial: `resolve` never puts it in shadow mode.
        if d.allowed || !self.table.get(key).is_some_and(|e| e.shadow.load(Acquire)) {
            return d;
        }
        self.counters.shadow_denied.fetch_add(1, Relaxed);
        let now = self.clock.coarse();
        let last = self.counters.shadow_logged_at.load(Relaxed);
        if (last == 0 || now >= last + 1_000)
            && self
                .counters
                .shadow_logged_at
                .compare_exchange(last, now.max(1), Relaxed, Relaxed)
                .is_ok()
        {
            tracing::warn!(
                key = %crate::keys::key_hash(key),
                rule = %d.rule_name(),
                limit = d.limit,
                window_ms = d.window_ms,
                reason = %d.reason,
                shadow_denied = self.counters.shadow_denied.load(Relaxed),
                "quotalease: shadow mode: these rules would deny this key (admitted; at most one line a second)"
            );
        }
        Decision {
            allowed: true,
            reason: Reason::Shadow,
            ..d
        }
    }

    /// The decision of a key with an allow or deny entry (no bucket is
    /// asked): admitted with reason `unlimited`, or denied with reason
    /// `blocked` and a retry after the limiter's window (the entry may be
    /// gone by then). `None`: the key is held to its rules.
    fn access_decision(&self, e: &Entry) -> Option<Decision> {
        let p = e.policy();
        match e.access.load(Acquire) {
            ACCESS_UNLIMITED => {
                e.touch(self.clock.coarse());
                self.count(e, &e.admitted);
                Some(Decision {
                    remaining: p.limit,
                    reset_after_ms: 0,
                    ..self.decision(e, p, true, 0, 0, Reason::Unlimited)
                })
            }
            ACCESS_BLOCKED => Some(self.deny(e, p, 0, Reason::Blocked, p.window_ms)),
            _ => None,
        }
    }

    fn decide_slow(&self, key: &str, cost: u64, waiting: Waiting, tier: Option<&str>) -> Result<Decision> {
        // The admit path checks a key's length only; the separator that
        // names rule buckets is refused here, before the key is looked up
        // (a permit's bucket is named by the engine, after its key's check).
        if waiting != Waiting::Permit {
            validate_key(key)?;
        }
        // One deadline for the whole request: its key's first policy read
        // and the lease call of each rule share one `backend_timeout_ms`.
        let deadline = Instant::now() + self.wait_bound();
        if waiting != Waiting::No {
            self.await_policy(policy_key(key, waiting), deadline);
        } else {
            let _ = self.policy_wait(policy_key(key, waiting));
        }
        cold_path!(self, key, cost, tier, |b| self.drive(b, cost, waiting, deadline))
    }

    async fn decide_slow_async(&self, key: &str, cost: u64, waiting: Waiting, tier: Option<&str>) -> Result<Decision> {
        if waiting != Waiting::Permit {
            validate_key(key)?;
        }
        let deadline = tokio::time::Instant::now() + self.wait_bound();
        self.await_policy_async(policy_key(key, waiting), deadline).await;
        cold_path!(self, key, cost, tier, |b| self
            .drive_async(b, cost, waiting, deadline)
            .await)
    }

    /// Every rule admitted: the decision of the rule with the fewest tokens left.
    fn rules_admitted(&self, entries: &[Arc<Entry>], got: Vec<Decision>) -> Decision {
        let (i, d) = got
            .into_iter()
            .enumerate()
            .min_by_key(|(_, d)| d.remaining)
            .expect("a key has at least one rule");
        Decision {
            rule: i as u8,
            rule_set: RuleSet(entries[0].rule_set.load(Relaxed)),
            ..d
        }
    }

    /// Rule `got.len()` denied: the rules before it give their tokens back,
    /// and the request counts as denied (on the key's own entry).
    fn rules_denied(&self, entries: &[Arc<Entry>], got: &[Decision], d: Decision, cost: u64) -> Decision {
        self.undo_rules(entries, got, cost);
        if !got.is_empty() {
            self.count(&entries[0], &entries[0].denied);
        }
        Decision {
            rule: got.len() as u8,
            rule_set: RuleSet(entries[0].rule_set.load(Relaxed)),
            ..d
        }
    }

    /// The rules in `got` admitted a request that is not admitted after all:
    /// their tokens go back, and the key's own entry no longer counts it.
    fn undo_rules(&self, entries: &[Arc<Entry>], got: &[Decision], cost: u64) {
        for (s, admitted) in entries.iter().zip(got) {
            self.refund(s, admitted, cost);
        }
        if !got.is_empty() {
            let _ = entries[0]
                .admitted
                .fetch_update(Relaxed, Relaxed, |a| Some(a.saturating_sub(1)));
        }
    }

    /// Give back the `cost` tokens an admitting rule took for a request a
    /// later rule denied: into the local lease they came from, to the
    /// authority (mode exact), or to the failure policy's share.
    pub(super) fn refund(&self, e: &Arc<Entry>, d: &Decision, cost: u64) {
        match d.reason {
            Reason::Exact => self.give_back(e, e.policy(), cost),
            Reason::Fallback => self.refund_fallback(e, cost),
            _ => self.put_back(e, cost),
        }
    }

    /// The blocking cold path of one bucket.
    /// `None`: the entry was evicted under the request (decide again).
    fn drive(&self, e: &Arc<Entry>, cost: u64, waiting: Waiting, deadline: Instant) -> Result<Option<Decision>> {
        loop {
            let in_time = match self.step(e, cost, waiting)? {
                Step::Done(d) => return Ok(Some(d)),
                Step::Retired => return Ok(None),
                Step::Again => Instant::now() < deadline,
                Step::Wait => self.wait_blocking(|| self.lease_landed(e), deadline),
                Step::Exact(slot) => {
                    self.wait_blocking(|| lock(&slot).is_some(), deadline);
                    return self.exact_decision(e, cost, lock(&slot).take()).map(Some);
                }
            };
            if !in_time {
                return Ok(Some(self.after_timeout(e, cost)));
            }
        }
    }

    /// The awaiting cold path of one bucket.
    async fn drive_async(
        &self,
        e: &Arc<Entry>,
        cost: u64,
        waiting: Waiting,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Decision>> {
        loop {
            let in_time = match self.step(e, cost, waiting)? {
                Step::Done(d) => return Ok(Some(d)),
                Step::Retired => return Ok(None),
                Step::Again => tokio::time::Instant::now() < deadline,
                Step::Wait => self.wait_async(|| self.lease_landed(e), deadline).await,
                Step::Exact(slot) => {
                    self.wait_async(|| lock(&slot).is_some(), deadline).await;
                    return self.exact_decision(e, cost, lock(&slot).take()).map(Some);
                }
            };
            if !in_time {
                return Ok(Some(self.after_timeout(e, cost)));
            }
        }
    }

    fn lease_landed(&self, e: &Entry) -> bool {
        !e.in_flight.load(Acquire) || self.closed.load(Acquire)
    }

    /// One step of the cold path.
    pub(super) fn step(&self, e: &Arc<Entry>, cost: u64, waiting: Waiting) -> Result<Step> {
        if e.retired.load(Acquire) {
            return Ok(Step::Retired);
        }
        let now = self.clock.precise();
        let p = e.policy();
        self.expire_if_idle(e, p, now);
        if self.r.cfg.mode == Mode::Exact {
            return self.step_exact(e, p, cost, waiting, now);
        }
        let local = loop {
            if let Some(left) = e.try_take(cost) {
                return Ok(Step::Done(self.admit(
                    e,
                    p,
                    left,
                    self.admit_reason(),
                    now,
                    waiting.kept(),
                )));
            }
            // A lease may land between the failed take and this read.
            let local = e.tokens.load(Relaxed);
            if local < cost {
                break local;
            }
        };
        if e.rate.load(Acquire) > 0 {
            return Ok(self.step_rate(e, p, cost, waiting, now));
        }
        if let Some(retry) = self.exhausted_for(e, p, cost - local, now) {
            return Ok(Step::Done(self.deny(e, p, local, Reason::Exhausted, retry)));
        }
        let (lease, _) = self.lease_params(p);
        let need = cost - local;
        if self.circuit.is_open() {
            if self.circuit.take_probe(now) {
                // If a request is already out, its answer serves as the probe.
                self.start_lease(e, lease.max(cost), need.max(1), 0);
            }
            self.misconfigured()?;
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        // The request waits for the answer and spends `need` of it at once
        // (not `try_acquire` on Redis: it is denied now, the grant lands later).
        let spent = self.spent_on_landing(need, waiting);
        let applied = e.applied.load(Acquire);
        let started = self.start_lease(e, self.want(e, p, need, local), need, spent);
        if !self.is_inline() {
            if waiting == Waiting::No {
                return Ok(Step::Done(self.deny(e, p, local, Reason::Pending, 1)));
            }
            return Ok(Step::Wait);
        }
        if !started {
            // Another thread is leasing inline for this key: it takes
            // microseconds, so wait for it rather than deny falsely.
            return Ok(Step::Wait);
        }
        if self.circuit.is_open() {
            // The inline call failed (a simulated outage): the policy decides.
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        if e.applied.load(Acquire) == applied {
            // It failed and left the circuit closed (a simulated timeout:
            // silence opens it only when it lasts): a `pending` denial, as
            // a timed-out call to Redis gets, not a call per loop.
            return Ok(Step::Done(self.deny(e, p, local, Reason::Pending, 1)));
        }
        // Answered inline: tokens arrived, or the key is now exhausted, or
        // other threads spent what arrived (then go round again).
        if let Some(left) = e.try_take(cost) {
            return Ok(Step::Done(self.admit(
                e,
                p,
                left,
                self.admit_reason(),
                now,
                waiting.kept(),
            )));
        }
        let local = e.tokens.load(Relaxed);
        // Read the clock again: the answer set "exhausted until" from its own
        // reading, later than `now`, and the wait reported must not exceed
        // the bucket's (a retry 12 001 ms after a 12 000 ms refill: the
        // Python README test, under CI load).
        let after = self.clock.precise();
        match self.exhausted_for(e, p, cost.saturating_sub(local), after) {
            Some(retry) => Ok(Step::Done(self.deny(e, p, local, Reason::Exhausted, retry))),
            None => Ok(Step::Again),
        }
    }

    /// Rate mode: tokens accrue locally at the granted rate; a request they
    /// cannot cover is denied here with the time the next ones take, and the
    /// grant is renewed ahead of its deadline. When the grant has ended, the
    /// key steps again as one with no grant.
    fn step_rate(&self, e: &Arc<Entry>, p: crate::bucket::Quota, cost: u64, waiting: Waiting, now: u64) -> Step {
        self.accrue(e, now, e.commit.load(Relaxed), cost);
        if let Some(left) = e.try_take(cost) {
            return Step::Done(self.admit(e, p, left, self.admit_reason(), now, waiting.kept()));
        }
        let until = e.rate_until.load(Acquire);
        if now >= until {
            e.rate_ran_out();
            return Step::Again;
        }
        // Renew from a little before the period's end (the grace after it
        // keeps accruing meanwhile). While the circuit is open the renewal
        // goes out as its probe when one is due: a rate that ended unrenewed
        // is one its holder no longer reports, and an authority learning
        // after a loss grants nothing to a holder without one for
        // `learn_ms`. With every key on a rate, no other key probed: one
        // failed call during a Redis restart ended every rate of the
        // limiter unrenewed.
        let lead = (2 * self.rtt_ms.load(Relaxed)).max(self.r.cfg.tuning.renew_lead_ms);
        if now + lead >= until && (!self.circuit.is_open() || self.circuit.take_probe(now)) {
            let local = e.tokens.load(Relaxed).min(cost - 1);
            self.start_lease(e, self.want(e, p, cost - local, local), cost - local, 0);
            if let Some(left) = e.try_take(cost) {
                return Step::Done(self.admit(e, p, left, self.admit_reason(), now, waiting.kept()));
            }
            if e.rate.load(Acquire) == 0 {
                // The renewal (answered inline) ended the rate: step again.
                return Step::Again;
            }
        }
        // A rate runs near this holder's demand; its random bursts exceed it.
        // At saturation the bucket is near empty and the burst is denied
        // here, with no call. But when the last answer left the bucket at
        // least `recheck_pct` full, the key is not saturated (rates can
        // start on a mistaken demand estimate): ask now instead, and the
        // authority answers with a chunk (and ends the rate) or a new grant.
        // At most every `recheck_ms`, so a key the authority still finds
        // saturated costs no call per denial.
        let remaining = e.auth_remaining.load(Relaxed);
        let last_call = e.sent_at.load(Relaxed);
        let due = now.saturating_sub(last_call) >= self.r.cfg.tuning.recheck_ms;
        let recheck_at = (p.limit as u128 * self.r.cfg.tuning.recheck_pct as u128 / 100) as u64;
        if remaining >= cost.max(recheck_at) && due && !self.circuit.is_open() {
            let local = e.tokens.load(Relaxed).min(cost - 1);
            let spent = self.spent_on_landing(cost - local, waiting);
            let started = self.start_lease(e, self.want(e, p, cost - local, local), cost - local, spent);
            if !self.is_inline() {
                if waiting == Waiting::No {
                    return Step::Done(self.deny(e, p, local, Reason::Pending, 1));
                }
                return Step::Wait;
            }
            if started {
                return Step::Again;
            }
        }
        let rate = e.rate.load(Acquire).max(1);
        let local = e.tokens.load(Relaxed);
        let short = cost.saturating_sub(local);
        let carried = e.accrued.lock().map_or(0, |a| a.units);
        let w = e.rate_window.load(Relaxed).max(1);
        let retry = (short * w).saturating_sub(carried).div_ceil(rate);
        Step::Done(self.deny(e, p, local, Reason::Exhausted, retry))
    }

    /// What a waiting request spends of the grant it asked for as it
    /// lands (the ledger does not count it as held): `need`, unless it does
    /// not wait for it (`try_acquire` on Redis) or it is a reservation.
    fn spent_on_landing(&self, need: u64, waiting: Waiting) -> u64 {
        match waiting {
            Waiting::Yes => need,
            Waiting::No if self.is_inline() => need,
            Waiting::No | Waiting::Reserve | Waiting::Permit => 0,
        }
    }

    pub(crate) fn wait_bound(&self) -> Duration {
        // The broker's own round trip is bounded by the timeout; a little
        // slack lets its verdict (grant or circuit open) arrive first.
        Duration::from_millis(self.r.cfg.backend_timeout_ms + 20)
    }

    fn validate_cost(&self, e: &Entry, cost: u64) -> Result<()> {
        let limit = e.limit.load(Relaxed);
        if cost == 0 || cost > limit {
            return Err(Error::InvalidCost { cost, limit });
        }
        Ok(())
    }

    /// The waited-for request did not finish in time.
    pub(super) fn after_timeout(&self, e: &Arc<Entry>, cost: u64) -> Decision {
        if self.circuit.is_open() {
            return self.fallback(e, cost, self.clock.precise());
        }
        self.deny(e, e.policy(), 0, Reason::Pending, 1)
    }
}
