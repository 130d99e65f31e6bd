//! `lease_metrics`: the counters, with the names docs/design.md fixes.

use quotalease::Metrics;

/// A snapshot of a limiter's counters, filled by `lease_metrics()`. In C write
/// `struct lease_metrics`: the plain name is the function. Same names in every language
/// (Prometheus names are `quotalease_<name>`, with `_total` for counters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct lease_metrics {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Authority calls (lease and give-back scripts).
    pub backend_calls: u64,
    /// Authority calls that failed or timed out.
    pub backend_errors: u64,
    /// Tokens granted by the authority.
    pub tokens_leased: u64,
    /// Tokens given back to the authority.
    pub tokens_returned: u64,
    /// Leased tokens dropped locally unused (TTL, eviction, fork, flush).
    pub tokens_expired: u64,
    /// 1 while the failure policy is in force, else 0.
    pub fallback_active: u64,
    /// Times the limiter entered or left the failure policy.
    pub fallback_transitions: u64,
    /// Keys tracked locally now.
    pub keys_tracked: u64,
    /// Tokens this instance holds unspent now: its share of the fleet's
    /// overshoot bound.
    pub overshoot_bound: u64,
    /// Requests admitted only because their rules are in shadow mode (each
    /// is counted in `denied` too).
    pub shadow_denied: u64,
    /// Tokens reserved requests used beyond their estimate, charged when
    /// settled (`lease_reservation_settle`).
    pub tokens_debited: u64,
}

impl From<Metrics> for lease_metrics {
    fn from(m: Metrics) -> Self {
        lease_metrics {
            admitted: m.admitted,
            denied: m.denied,
            backend_calls: m.backend_calls,
            backend_errors: m.backend_errors,
            tokens_leased: m.tokens_leased,
            tokens_returned: m.tokens_returned,
            tokens_expired: m.tokens_expired,
            fallback_active: m.fallback_active,
            fallback_transitions: m.fallback_transitions,
            keys_tracked: m.keys_tracked,
            overshoot_bound: m.overshoot_bound,
            shadow_denied: m.shadow_denied,
            tokens_debited: m.tokens_debited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric of the core has its field here, in the same order.
    #[test]
    fn fields_match_the_core() {
        let mut m = Metrics::default();
        let n = m.fields().len();
        assert_eq!(std::mem::size_of::<lease_metrics>(), n * 8);
        // Give every core field a distinct value and read the C struct back in order.
        m = Metrics {
            admitted: 1,
            denied: 2,
            backend_calls: 3,
            backend_errors: 4,
            tokens_leased: 5,
            tokens_returned: 6,
            tokens_expired: 7,
            fallback_active: 8,
            fallback_transitions: 9,
            keys_tracked: 10,
            overshoot_bound: 11,
            shadow_denied: 12,
            tokens_debited: 13,
        };
        let c = lease_metrics::from(m);
        // SAFETY: lease_metrics is repr(C) with n u64 fields.
        let raw: &[u64] = unsafe { std::slice::from_raw_parts((&c as *const lease_metrics).cast::<u64>(), n) };
        let core: Vec<u64> = m.fields().iter().map(|f| f.3).collect();
        assert_eq!(raw, core.as_slice());
    }
}
