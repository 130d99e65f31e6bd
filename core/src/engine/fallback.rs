//! While the authority is unreachable: the circuit's transitions (logged,
//! counted, sent to listeners) and the failure policy that decides once
//! local tokens are spent. Also the static share used by mode `local`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::entry::Entry;
use super::{lock, Engine};
use crate::bucket::Policy;
use crate::circuit::Transition;
use crate::config::{FailurePolicy, Mode};
use crate::decision::{Decision, Reason};
use crate::events::{Event, EventKind};
use crate::metrics::Counters;

impl Engine {
    /// The failure policy, once local tokens are spent and the backend is down.
    pub(super) fn fallback(&self, e: &Arc<Entry>, cost: u64, now: u64) -> Decision {
        let p = e.policy();
        match self.r.cfg.on_backend_failure {
            FailurePolicy::Allow => self.admit(e, p, 0, Reason::Fallback, now),
            FailurePolicy::Deny => {
                let retry = self.circuit.ms_to_probe(now);
                self.deny(e, p, 0, Reason::Fallback, retry)
            }
            FailurePolicy::StaticShare => {
                let g = self
                    .fallback
                    .lease(&e.key, self.fallback_share(e, p, now), cost, cost, now);
                if g.granted >= cost {
                    self.admit(e, p, 0, Reason::Fallback, now)
                } else {
                    self.deny(e, p, 0, Reason::Fallback, g.wait_ms)
                }
            }
        }
    }

    /// What this instance may admit on a key while the authority is away:
    /// with adaptive leasing, the fallback rate the authority last gave it
    /// (the live holders' rates sum to the key's rate), moving towards the
    /// key's limit over its live holders once the outage lasts
    /// ([`crate::adaptive::fallback_rate`]); for a key never answered, the
    /// key's limit over the most holders any key reported; before any
    /// answer, the static share `limit / expected_replicas`.
    fn fallback_share(&self, e: &Entry, p: Policy, now: u64) -> Policy {
        if self.r.adaptive {
            // A rate of `r` credit units per ms is `r` tokens per window.
            let fb = e.fallback.load(Relaxed);
            if fb > 0 {
                let holders = e.holders.load(Relaxed).max(1);
                let equal = (p.limit / holders).max(1);
                let open_for = self.circuit.open_for(now);
                return Policy {
                    limit: crate::adaptive::fallback_rate(fb, equal, open_for).max(1),
                    window_ms: p.window_ms,
                };
            }
            if let Some(limit) = p.limit.checked_div(self.fleet.load(Relaxed)) {
                return Policy {
                    limit: limit.max(1),
                    window_ms: p.window_ms,
                };
            }
        }
        self.share(p)
    }

    /// The authority's view of a key's policy: local mode enforces the static share.
    pub(super) fn authority_policy(&self, p: Policy) -> Policy {
        if self.r.cfg.mode == Mode::Local {
            self.share(p)
        } else {
            p
        }
    }

    /// This instance's static share of a policy: `limit / expected_replicas`.
    fn share(&self, p: Policy) -> Policy {
        Policy {
            limit: (p.limit / self.r.cfg.expected_replicas).max(1),
            window_ms: p.window_ms,
        }
    }

    /// Tell the circuit how a call to a remote authority went.
    pub(super) fn on_answer(&self, r: std::result::Result<(), &str>) {
        match r {
            Ok(()) => {
                if self.circuit.on_success() == Some(Transition::Closed) {
                    self.transition(
                        EventKind::Recovered,
                        "the backend answers again; back to leasing".into(),
                    );
                }
            }
            Err(err) => {
                if self.circuit.on_failure(self.clock.precise()) == Some(Transition::Opened) {
                    let policy = self.r.cfg.on_backend_failure.as_str();
                    self.transition(
                        EventKind::Degraded,
                        format!(
                            "backend unreachable ({err}); local leases are spent first, then policy {policy:?} applies"
                        ),
                    );
                }
            }
        }
    }

    fn transition(&self, kind: EventKind, message: String) {
        Counters::add(&self.counters.fallback_transitions, 1);
        match kind {
            EventKind::Degraded => {
                tracing::error!(url = %crate::RedactedUrl(&self.r.cfg.url), "quotalease degraded: {message}")
            }
            EventKind::Recovered => {
                tracing::warn!(url = %crate::RedactedUrl(&self.r.cfg.url), "quotalease recovered: {message}")
            }
        }
        let event = Event { kind, message };
        let listeners = lock(&self.listeners).clone();
        for l in listeners {
            // A listener's panic must not take the broker down.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l(&event)));
        }
    }
}
