//! While the authority is unreachable: the circuit's transitions (logged,
//! counted, sent to listeners) and the failure policy that decides once
//! local tokens are spent. Also the static share used by mode `local`.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Arc;

use super::entry::Entry;
use super::{lock, Engine, Kept};
use crate::bucket::Quota;
use crate::circuit::Transition;
use crate::config::{FailurePolicy, Mode};
use crate::decision::{Decision, Reason};
use crate::events::{Event, EventKind};
use crate::metrics::Counters;
use crate::wire::is_silence;

impl Engine {
    /// The failure policy, once local tokens are spent and the backend is down.
    pub(super) fn fallback(&self, e: &Arc<Entry>, cost: u64, now: u64) -> Decision {
        let p = e.policy();
        match self.r.cfg.on_backend_failure {
            FailurePolicy::Allow => {
                e.fallback_used.fetch_add(cost, AcqRel);
                self.admit(e, p, 0, Reason::Fallback, now, Kept::No)
            }
            FailurePolicy::Deny => {
                let retry = self.circuit.ms_to_probe(now);
                Self::left(self.deny(e, p, 0, Reason::Fallback, retry), 0, p)
            }
            FailurePolicy::StaticShare => {
                let share = self.fallback_share(e, p, now);
                if share.limit == 0 {
                    // the ledger's answer: no part of the key's rate is ours
                    let retry = self.circuit.ms_to_probe(now).max(1);
                    return Self::left(self.deny(e, p, 0, Reason::Fallback, retry), 0, p);
                }
                self.fallback.cap(&e.key, share, self.share_left(e, p, share, now), now);
                let g = self.fallback.lease(&e.key, share, cost, cost, now);
                let d = if g.granted >= cost {
                    // reported with the next lease call and debited (I4)
                    e.fallback_used.fetch_add(cost, AcqRel);
                    self.admit(e, p, 0, Reason::Fallback, now, Kept::No)
                } else {
                    self.deny(e, p, 0, Reason::Fallback, g.wait_ms)
                };
                Self::left(d, g.remaining, p)
            }
        }
    }

    /// The most this instance's share of a key may hold: its part (`share`
    /// of the limit) of what the bucket held at the authority's last answer,
    /// rounded up, plus the share's own refill since the circuit opened. A
    /// fleet whose shares sum to the key's rate so starts an outage with
    /// about what the bucket held, not with one more whole limit. The refill
    /// between that answer and the outage is not counted: on a saturated key
    /// the others' rates took it (counting it let each starved client of a
    /// healthy Redis admit up to a share of a whole limit at once on top of
    /// the rates: 1.005x the allowance under a CPU hog, issue 22), and what
    /// they left stays in the bucket for the next answer. A key the
    /// authority never answered starts empty when the circuit opened: this
    /// instance cannot know what the others took. (The cap grows at the
    /// share's own refill rate, so it holds back only a bucket fuller than
    /// this: new, or refilled since an earlier outage.)
    fn share_left(&self, e: &Entry, p: Quota, share: Quota, now: u64) -> u64 {
        if p.limit == 0 {
            return share.limit;
        }
        let opened = self.circuit.opened_at();
        let remaining = match e.auth_at.load(Relaxed) {
            0 => 0,
            _ => e.auth_remaining.load(Relaxed).min(p.limit),
        };
        let since = now.saturating_sub(opened) as u128;
        let part = (remaining as u128 * share.limit as u128).div_ceil(p.limit as u128);
        let refill = since * share.limit as u128 / p.window_ms.max(1) as u128;
        (part + refill).min(share.limit as u128) as u64
    }

    /// A failure-policy decision says what this instance may still admit
    /// (its share's tokens; none under `deny`), not the authority's last
    /// estimate, which for a key it never answered is the whole limit.
    fn left(d: Decision, remaining: u64, p: Quota) -> Decision {
        let remaining = remaining.min(p.limit);
        Decision {
            remaining,
            reset_after_ms: p.ms_for_tokens(p.limit - remaining),
            ..d
        }
    }

    /// A request the failure policy admitted was denied by a later rule:
    /// its tokens go back to the static share they came from.
    pub(super) fn refund_fallback(&self, e: &Arc<Entry>, cost: u64) {
        if self.r.cfg.on_backend_failure == FailurePolicy::StaticShare {
            let now = self.clock.precise();
            let share = self.fallback_share(e, e.policy(), now);
            if share.limit == 0 {
                return;
            }
            let _ = self.fallback.answer(crate::authority::Call::GiveBack {
                key: e.key.to_string(),
                policy: share,
                tokens: cost,
                now: self.now(),
                holder: 0,
                adaptive: false,
                leaving: false,
                seen: 0,
                what: crate::wire::Back::Held,
                tuning: self.r.cfg.tuning,
            });
            let _ = e
                .fallback_used
                .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_sub(cost)));
        }
    }

    /// What this instance may admit on a key while the authority is away:
    /// with adaptive leasing, the fallback share of its last answer while it
    /// is valid (the valid shares of all holders sum to at most the key's
    /// rate, I4), a share of 0 included: the others hold the whole rate;
    /// else the static share `limit / expected_replicas`.
    fn fallback_share(&self, e: &Entry, p: Quota, now: u64) -> Quota {
        if self.r.adaptive {
            if let Some(fb) = e.share_at(now) {
                // A share of `r` credit units per ms is `r` tokens per window.
                return Quota::new(fb, p.window_ms);
            }
        }
        self.share(p)
    }

    /// The authority's view of a key's policy: local mode enforces the static share.
    pub(super) fn authority_policy(&self, p: Quota) -> Quota {
        if self.r.cfg.mode == Mode::Local {
            self.share(p)
        } else {
            p
        }
    }

    /// This instance's static share of a policy: `limit / expected_replicas`.
    fn share(&self, p: Quota) -> Quota {
        Quota::new((p.limit / self.r.cfg.expected_replicas).max(1), p.window_ms)
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
                if self.circuit.on_failure(self.clock.precise(), is_silence(err)) == Some(Transition::Opened) {
                    let policy = self.r.cfg.on_backend_failure.as_str();
                    self.transition(
                        EventKind::Degraded,
                        match crate::wire::misconfiguration(err) {
                            Some(why) => format!("backend misconfigured ({why}); acquire returns an error until it is fixed"),
                            None => format!(
                                "backend unreachable ({err}); local leases are spent first, then policy {policy:?} applies"
                            ),
                        },
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
