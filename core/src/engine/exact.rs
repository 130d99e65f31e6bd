//! Mode `exact`: one authority call per request, no local tokens. The call
//! goes out like a lease for exactly `cost` tokens; the caller waits for its
//! own answer (the cold-path drivers do the waiting).

use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};

use super::cold::{Slot, Step, Waiting};
use super::entry::Entry;
use super::{lock, Engine, Kept};
use crate::authority::{Call, Reply};
use crate::bucket::Quota;
use crate::decision::{Decision, Reason};
use crate::error::Result;
use crate::metrics::Counters;

impl Engine {
    pub(super) fn step_exact(&self, e: &Arc<Entry>, p: Quota, cost: u64, waiting: Waiting, now: u64) -> Result<Step> {
        if self.circuit.is_open() && !self.circuit.take_probe(now) {
            self.misconfigured()?;
            return Ok(Step::Done(self.fallback(e, cost, now)));
        }
        if waiting == Waiting::No && !self.is_inline() {
            return Ok(Step::Done(self.deny(e, p, 0, Reason::Pending, 1)));
        }
        let slot: Slot = Arc::new(Mutex::new(None));
        let call = Call::Lease {
            key: e.key.to_string(),
            policy: p,
            want: cost,
            need: cost,
            now: self.now(),
            adaptive: None,
            guard: e.guard(self.clock.precise(), self.r.cfg.overshoot_budget.tokens(p.limit)),
        };
        let (me, filled) = (self.me.upgrade(), slot.clone());
        self.submit(
            call,
            Box::new(move |r| {
                let ok = r.as_ref().map(|_| ()).map_err(|e| e.clone());
                // The answer lands before waiters are woken.
                *lock(&filled) = Some(r);
                if let Some(me) = me {
                    me.finish(ok.as_ref().map(|_| ()).map_err(String::as_str));
                }
            }),
        )?;
        Ok(Step::Exact(slot))
    }

    /// Decide with the answer to an exact call (`None`: it did not come in
    /// time); the backend's refusal of the configuration is an error.
    pub(super) fn exact_decision(
        &self,
        e: &Arc<Entry>,
        cost: u64,
        answer: Option<std::result::Result<Reply, String>>,
    ) -> Result<Decision> {
        if let Some(Err(err)) = &answer {
            if crate::wire::misconfiguration(err).is_some() {
                return Err(crate::error::Error::of_backend(err, &self.r.cfg.url));
            }
        }
        let p = e.policy();
        Ok(match answer {
            Some(Ok(Reply::Grant(g, _, seen))) => {
                let now = self.clock.precise();
                self.seen(e, seen, now);
                e.granted(g.granted, now);
                Counters::add(&self.counters.tokens_leased, g.granted);
                e.auth_remaining.store(g.remaining, Relaxed);
                e.auth_at.store(now.max(1), Relaxed);
                if g.granted >= cost {
                    self.admit(e, p, 0, Reason::Exact, self.clock.precise(), Kept::No)
                } else {
                    self.deny(e, p, 0, Reason::Exact, g.wait_ms)
                }
            }
            _ => self.after_timeout(e, cost),
        })
    }
}
