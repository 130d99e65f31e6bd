//! The engine's side of the authority seam: lease and give-back calls, and
//! what their answers do to a key (tokens in, "exhausted until", counters,
//! circuit). Every call goes out through [`Authority::call`]; the memory
//! authority answers inline, Redis from the broker thread.

use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use super::entry::Entry;
use super::Engine;
use crate::authority::{Call, Done, Now, Reply};
use crate::bucket::{Grant, Policy};
use crate::config::Mode;
use crate::error::Result;
use crate::metrics::Counters;

impl Engine {
    /// The time an authority call is made at.
    pub(super) fn now(&self) -> Now {
        Now {
            ms: self.clock.precise(),
            explicit: self.clock.is_manual(),
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
        if !self.is_inline() {
            self.on_answer(r);
        }
        let _ = self
            .pending
            .fetch_update(AcqRel, Acquire, |p| Some(p.saturating_sub(1)));
        self.wake_all();
    }

    /// Send a lease request for `e` (want, need) unless one is in flight.
    /// Memory authorities answer inline. Returns false if one was in flight.
    pub(super) fn start_lease(&self, e: &Arc<Entry>, want: u64, need: u64) -> bool {
        let now = self.clock.coarse();
        if e.in_flight.swap(true, AcqRel) {
            // Every request is bounded by the backend timeout; one in flight
            // for far longer was lost somewhere: do not let it block the key.
            let stale = self.r.cfg.backend_timeout_ms * 4 + 1_000;
            if now.saturating_sub(e.in_flight_since.load(Relaxed)) < stale || self.clock.is_manual() {
                return false;
            }
            tracing::warn!(key = %e.key, "quotalease: a lease request was lost; sending a new one");
        }
        e.in_flight_since.store(now, Relaxed);
        let Some(me) = self.me.upgrade() else {
            e.in_flight.store(false, Release);
            return true;
        };
        let call = Call::Lease {
            key: e.key.to_string(),
            policy: self.authority_policy(e.policy()),
            want,
            need,
            now: self.now(),
        };
        let entry = e.clone();
        let done: Done = Box::new(move |r| me.lease_done(&entry, need, r));
        if self.submit(call, done).is_err() {
            e.in_flight.store(false, Release);
        }
        true
    }

    fn lease_done(&self, e: &Entry, need: u64, r: std::result::Result<Reply, String>) {
        let r = match r {
            Ok(Reply::Grant(g)) => {
                self.apply_grant(e, g, need, self.clock.precise());
                Ok(())
            }
            Ok(other) => Err(format!("unexpected answer to a lease: {other:?}")),
            Err(err) => Err(err),
        };
        e.in_flight.store(false, Release);
        self.finish(r.as_ref().map(|_| ()).map_err(String::as_str));
    }

    fn apply_grant(&self, e: &Entry, g: Grant, need: u64, now: u64) {
        Counters::add(&self.counters.tokens_leased, g.granted);
        e.auth_remaining.store(g.remaining, Relaxed);
        if g.granted == 0 {
            // Come back when half a lease has refilled, not at the first token:
            // at saturation, instances then lease chunks instead of racing
            // for single tokens (fewer Redis calls; the budget is still all
            // used, since the bucket keeps what accumulates meanwhile).
            let p = e.policy();
            let (lease, _) = self.lease_params(p);
            let settle = if self.r.cfg.mode == Mode::Lease {
                p.ms_for_tokens(lease / 2)
            } else {
                0
            };
            e.exhausted_need.store(need, Relaxed);
            e.exhausted_until.store(now + g.wait_ms.max(1) + settle, Relaxed);
        } else {
            e.exhausted_until.store(0, Relaxed);
            // Fresh tokens start their lease TTL now.
            e.touch(now);
            e.tokens.fetch_add(g.granted, AcqRel);
            if e.retired.load(Acquire) || self.closed.load(Acquire) {
                let back = e.tokens.swap(0, AcqRel);
                self.give_back(&e.key, e.policy(), back);
            }
        }
    }

    /// `Some(retry_after_ms)` when the authority said it cannot give `need`
    /// tokens yet: the denial costs no network call.
    pub(super) fn exhausted_for(&self, e: &Entry, p: Policy, need: u64, now: u64) -> Option<u64> {
        let until = e.exhausted_until.load(Relaxed);
        let known = e.exhausted_need.load(Relaxed);
        (until > now && need >= known).then(|| until - now + p.ms_for_tokens(need - known))
    }

    /// Return `tokens` of `key` to the authority.
    pub(super) fn give_back(&self, key: &str, policy: Policy, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        let call = Call::GiveBack {
            key: key.to_owned(),
            policy: self.authority_policy(policy),
            tokens,
            now: self.now(),
        };
        let done: Done = Box::new(move |r| {
            let r = match r {
                Ok(Reply::Returned) => {
                    Counters::add(&me.counters.tokens_returned, tokens);
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
