//! The cold path: no local tokens for the request. One state machine,
//! [`Engine::step`], decides or says what to wait for; two drivers run it,
//! one blocking a thread (`acquire`, `try_acquire`) and one awaiting
//! (`acquire_async`), with the same deadline: `backend_timeout_ms` plus a
//! little slack, after which the failure policy or a `pending` denial applies.

use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::entry::Entry;
use super::{lock, Engine};
use crate::authority::Reply;
use crate::config::Mode;
use crate::decision::{Decision, Reason};
use crate::error::{Error, Result};

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
}

/// How a cold-path caller may wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Waiting {
    /// `acquire` / `acquire_async`: may wait for a lease request.
    Yes,
    /// `try_acquire`: never waits for the network.
    No,
}

impl Engine {
    /// Blocking driver of the cold path.
    pub fn acquire_slow(&self, key: &str, cost: u64, waiting: Waiting) -> Result<Decision> {
        let e = self.entry(key);
        self.validate_cost(&e, cost)?;
        let deadline = Instant::now() + self.wait_bound();
        loop {
            let in_time = match self.step(&e, cost, waiting)? {
                Step::Done(d) => return Ok(d),
                Step::Again => Instant::now() < deadline,
                Step::Wait => self.wait_blocking(|| self.lease_landed(&e), deadline),
                Step::Exact(slot) => {
                    self.wait_blocking(|| lock(&slot).is_some(), deadline);
                    return Ok(self.exact_decision(&e, cost, lock(&slot).take()));
                }
            };
            if !in_time {
                return Ok(self.after_timeout(&e, cost));
            }
        }
    }

    /// Async driver of the cold path (runs on the broker's runtime).
    pub async fn acquire_slow_async(&self, key: &str, cost: u64) -> Result<Decision> {
        let e = self.entry(key);
        self.validate_cost(&e, cost)?;
        let deadline = tokio::time::Instant::now() + self.wait_bound();
        loop {
            let in_time = match self.step(&e, cost, Waiting::Yes)? {
                Step::Done(d) => return Ok(d),
                Step::Again => tokio::time::Instant::now() < deadline,
                Step::Wait => self.wait_async(|| self.lease_landed(&e), deadline).await,
                Step::Exact(slot) => {
                    self.wait_async(|| lock(&slot).is_some(), deadline).await;
                    return Ok(self.exact_decision(&e, cost, lock(&slot).take()));
                }
            };
            if !in_time {
                return Ok(self.after_timeout(&e, cost));
            }
        }
    }

    fn lease_landed(&self, e: &Entry) -> bool {
        !e.in_flight.load(Acquire) || self.closed.load(Acquire)
    }

    /// One step of the cold path.
    pub(super) fn step(&self, e: &Arc<Entry>, cost: u64, waiting: Waiting) -> Result<Step> {
        let now = self.clock.precise();
        let p = e.policy();
        self.expire_if_idle(e, p, now);
        if self.r.cfg.mode == Mode::Exact {
            return self.step_exact(e, p, cost, waiting, now);
        }
        let local = loop {
            if let Some(left) = e.try_take(cost) {
                return Ok(Step::Done(self.admit(e, p, left, self.admit_reason(), now)));
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
                self.start_lease(e, lease.max(cost), need.max(1));
            }
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        let started = self.start_lease(e, self.want(e, p, need, local), need);
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
        // Answered inline: tokens arrived, or the key is now exhausted, or
        // other threads spent what arrived (then go round again).
        if let Some(left) = e.try_take(cost) {
            return Ok(Step::Done(self.admit(e, p, left, self.admit_reason(), now)));
        }
        let local = e.tokens.load(Relaxed);
        match self.exhausted_for(e, p, cost.saturating_sub(local), now) {
            Some(retry) => Ok(Step::Done(self.deny(e, p, local, Reason::Exhausted, retry))),
            None => Ok(Step::Again),
        }
    }

    /// Rate mode: tokens accrue locally at the granted rate; a request they
    /// cannot cover is denied here with the time the next ones take, and the
    /// grant is renewed ahead of its deadline. When the grant has ended, the
    /// key steps again as one with no grant.
    fn step_rate(&self, e: &Arc<Entry>, p: crate::bucket::Policy, cost: u64, waiting: Waiting, now: u64) -> Step {
        let carry = self.carry(e, p).max(cost);
        self.accrue(e, p, now, carry);
        if let Some(left) = e.try_take(cost) {
            return Step::Done(self.admit(e, p, left, self.admit_reason(), now));
        }
        let until = e.rate_until.load(Acquire);
        if now >= until {
            e.rate.store(0, Release);
            return Step::Again;
        }
        // Renew from a little before the period's end (the grace after it
        // keeps accruing meanwhile).
        let lead = (2 * self.rtt_ms.load(Relaxed)).max(crate::adaptive::PERIOD_MS / 100);
        if now + lead + crate::adaptive::GRACE_MS >= until && !self.circuit.is_open() {
            let local = e.tokens.load(Relaxed).min(cost - 1);
            self.start_lease(e, self.want(e, p, cost - local, local), cost - local);
            if let Some(left) = e.try_take(cost) {
                return Step::Done(self.admit(e, p, left, self.admit_reason(), now));
            }
            if e.rate.load(Acquire) == 0 {
                // The renewal (answered inline) ended the rate: step again.
                return Step::Again;
            }
        }
        // A rate runs near this holder's demand; its random bursts exceed it.
        // At saturation the bucket is near empty and the burst is denied
        // here, with no call. But when the last answer left the bucket at
        // half full or more, the key is not saturated (rates can start on
        // a mistaken demand estimate): ask now instead, and the authority
        // answers with a chunk (and ends the rate) or a new grant. At most
        // every quarter period, so a key the authority still finds saturated
        // costs no call per denial.
        let remaining = e.auth_remaining.load(Relaxed);
        let last_call = e.in_flight_since.load(Relaxed);
        let due = now.saturating_sub(last_call) >= crate::adaptive::PERIOD_MS / 4;
        if remaining >= cost.max(p.limit / 2) && due && !self.circuit.is_open() {
            let local = e.tokens.load(Relaxed).min(cost - 1);
            let started = self.start_lease(e, self.want(e, p, cost - local, local), cost - local);
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
        let carried = e.accrued.lock().map_or(0, |a| a.1);
        let retry = (short * p.window_ms).saturating_sub(carried).div_ceil(rate);
        Step::Done(self.deny(e, p, local, Reason::Exhausted, retry))
    }

    pub(super) fn wait_bound(&self) -> Duration {
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
