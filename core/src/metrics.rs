//! Counters with the names docs/design.md fixes, and their Prometheus exposition.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a limiter's counters. Same names in every language.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Authority calls (lease and give-back scripts; one per key per call,
    /// even when several go out in one pipelined round trip).
    pub backend_calls: u64,
    /// Authority calls that failed or timed out.
    pub backend_errors: u64,
    /// Tokens granted by the authority: chunks, and rate-grant tokens as
    /// they accrue locally.
    pub tokens_leased: u64,
    /// Tokens given back to the authority.
    pub tokens_returned: u64,
    /// Leased tokens dropped locally unused (lease TTL, eviction, fork); tokens
    /// given back by `flush()` count in `tokens_returned` only.
    pub tokens_expired: u64,
    /// 1 while the failure policy is in force, else 0.
    pub fallback_active: u64,
    /// Times the limiter entered or left the failure policy.
    pub fallback_transitions: u64,
    /// Keys tracked locally now.
    pub keys_tracked: u64,
    /// Tokens this instance holds unspent now: its share of the fleet's
    /// overshoot bound (summed over instances, the fleet's bound).
    pub overshoot_bound: u64,
}

impl Metrics {
    /// Every metric as (name, help, is_counter, value), in a fixed order.
    pub fn fields(&self) -> [(&'static str, &'static str, bool, u64); 11] {
        [
            ("admitted", "Requests admitted.", true, self.admitted),
            ("denied", "Requests denied.", true, self.denied),
            ("backend_calls", "Authority script calls.", true, self.backend_calls),
            (
                "backend_errors",
                "Authority calls that failed or timed out.",
                true,
                self.backend_errors,
            ),
            (
                "tokens_leased",
                "Tokens granted by the authority.",
                true,
                self.tokens_leased,
            ),
            (
                "tokens_returned",
                "Tokens given back to the authority.",
                true,
                self.tokens_returned,
            ),
            (
                "tokens_expired",
                "Leased tokens dropped locally unused.",
                true,
                self.tokens_expired,
            ),
            (
                "fallback_active",
                "1 while the backend failure policy is in force.",
                false,
                self.fallback_active,
            ),
            (
                "fallback_transitions",
                "Entries into and exits from the failure policy.",
                true,
                self.fallback_transitions,
            ),
            ("keys_tracked", "Keys tracked locally.", false, self.keys_tracked),
            (
                "overshoot_bound",
                "Leased tokens held unspent: this instance's share of the overshoot bound.",
                false,
                self.overshoot_bound,
            ),
        ]
    }

    /// Prometheus text exposition, every name prefixed `quotalease_`.
    pub fn prometheus(&self) -> String {
        let mut out = String::with_capacity(1600);
        for (name, help, counter, v) in self.fields() {
            let (suffix, ty) = if counter { ("_total", "counter") } else { ("", "gauge") };
            let _ = writeln!(out, "# HELP quotalease_{name}{suffix} {help}");
            let _ = writeln!(out, "# TYPE quotalease_{name}{suffix} {ty}");
            let _ = writeln!(out, "quotalease_{name}{suffix} {v}");
        }
        out
    }
}

/// Limiter-wide counters (per-key admit/deny counts live in the entries).
#[derive(Default)]
pub(crate) struct Counters {
    pub admitted_retired: AtomicU64,
    pub denied_retired: AtomicU64,
    pub backend_calls: AtomicU64,
    pub backend_errors: AtomicU64,
    pub tokens_leased: AtomicU64,
    pub tokens_returned: AtomicU64,
    pub tokens_expired: AtomicU64,
    pub fallback_transitions: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Relaxed);
        }
    }
}
