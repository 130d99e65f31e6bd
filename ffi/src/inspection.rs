//! `lease_inspection`: what `lease_inspect` reports for one key.

use quotalease::Inspection;

/// What the limiter and the authority know about one key, filled by
/// `lease_inspect()`. Plain data owned by the caller: nothing to free. The
/// names are those of every binding's `inspect`.
///
/// The three `authority_*` figures may be unknown: each comes with a
/// `has_...` flag, and is 0 when its flag is false.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct lease_inspection {
    /// The key's limit (tokens per window; a `lease_set_limit` override included).
    pub limit: u64,
    /// The key's window in milliseconds.
    pub window_ms: u64,
    /// Whole tokens stored in the authoritative bucket as of its last refill
    /// (valid when `has_authority_tokens`; false: no bucket is stored, which
    /// reads as a full bucket).
    pub authority_tokens: u64,
    /// Clock reading (ms) of the bucket's last refill (with Redis: Redis
    /// `TIME`; with the manual clock: the limiter's clock). Valid when
    /// `has_authority_refilled_at_ms`.
    pub authority_refilled_at_ms: u64,
    /// Milliseconds until the stored bucket expires (Redis only). Valid when
    /// `has_authority_ttl_ms`.
    pub authority_ttl_ms: u64,
    /// Tokens this limiter holds for the key now.
    pub local_tokens: u64,
    /// Denials stay local for this long (ms): the authority said the bucket
    /// is empty. 0 when not.
    pub exhausted_for_ms: u64,
    /// Requests admitted on this key by this limiter.
    pub admitted: u64,
    /// Requests denied on this key by this limiter.
    pub denied: u64,
    /// Adaptive leasing: the rate this limiter spends on the key now, in
    /// tokens per window (0: no rate grant runs; it leases chunks).
    pub rate_per_window: u64,
    /// Adaptive leasing: live holders of the key (limiter instances) at the
    /// authority's last answer, this one included; 0 before any answer.
    pub holders: u64,
    /// Adaptive leasing: this limiter's fallback rate at the last answer, in
    /// tokens per window (its share of the key's rate among the live
    /// holders, what the failure policy `static-share` admits); 0 before any.
    pub fallback_per_window: u64,
    /// Adaptive leasing: the key's offered load on this limiter (admitted +
    /// denied per second, a moving average); 0 until it has been measured.
    pub demand_per_s: u64,
    /// Whether `authority_tokens` is known.
    pub has_authority_tokens: bool,
    /// Whether `authority_refilled_at_ms` is known.
    pub has_authority_refilled_at_ms: bool,
    /// Whether `authority_ttl_ms` is known.
    pub has_authority_ttl_ms: bool,
    /// A lease request for the key is in flight.
    pub lease_in_flight: bool,
    /// Adaptive leasing: the key is in rate mode here (`rate_per_window > 0`).
    pub rate_mode: bool,
}

impl From<Inspection> for lease_inspection {
    fn from(i: Inspection) -> Self {
        lease_inspection {
            limit: i.limit,
            window_ms: i.window_ms,
            authority_tokens: i.authority_tokens.unwrap_or(0),
            authority_refilled_at_ms: i.authority_refilled_at_ms.unwrap_or(0),
            authority_ttl_ms: i.authority_ttl_ms.unwrap_or(0),
            local_tokens: i.local_tokens,
            exhausted_for_ms: i.exhausted_for_ms,
            admitted: i.admitted,
            denied: i.denied,
            rate_per_window: i.rate_per_window,
            holders: i.holders,
            fallback_per_window: i.fallback_per_window,
            demand_per_s: i.demand_per_s,
            has_authority_tokens: i.authority_tokens.is_some(),
            has_authority_refilled_at_ms: i.authority_refilled_at_ms.is_some(),
            has_authority_ttl_ms: i.authority_ttl_ms.is_some(),
            lease_in_flight: i.lease_in_flight,
            rate_mode: i.rate_per_window > 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every figure of the core's `Inspection` lands in its own field.
    #[test]
    fn every_field_of_the_core_is_carried() {
        let i = Inspection {
            limit: 1,
            window_ms: 2,
            authority_tokens: Some(3),
            authority_refilled_at_ms: Some(4),
            authority_ttl_ms: Some(5),
            local_tokens: 6,
            lease_in_flight: true,
            exhausted_for_ms: 7,
            admitted: 8,
            denied: 9,
            rate_per_window: 10,
            holders: 11,
            fallback_per_window: 12,
            demand_per_s: 13,
            ..Inspection::default()
        };
        let c = lease_inspection::from(i.clone());
        let numbers = [
            c.limit,
            c.window_ms,
            c.authority_tokens,
            c.authority_refilled_at_ms,
            c.authority_ttl_ms,
            c.local_tokens,
            c.exhausted_for_ms,
            c.admitted,
            c.denied,
            c.rate_per_window,
            c.holders,
            c.fallback_per_window,
            c.demand_per_s,
        ];
        assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert!(c.has_authority_tokens && c.has_authority_refilled_at_ms && c.has_authority_ttl_ms);
        assert!(c.lease_in_flight && c.rate_mode);

        let none = lease_inspection::from(Inspection {
            authority_tokens: None,
            authority_refilled_at_ms: None,
            authority_ttl_ms: None,
            lease_in_flight: false,
            rate_per_window: 0,
            ..i
        });
        assert_eq!(
            (
                none.authority_tokens,
                none.authority_refilled_at_ms,
                none.authority_ttl_ms
            ),
            (0, 0, 0)
        );
        assert!(!none.has_authority_tokens && !none.has_authority_refilled_at_ms && !none.has_authority_ttl_ms);
        assert!(!none.lease_in_flight && !none.rate_mode);
    }
}
