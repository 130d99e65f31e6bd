//! [`Inspection`], in a module of its own: the engine fills it in and
//! `limiter`, above the engine, hands it out (and re-exports it).

/// What [`crate::Limiter::inspect`] reports for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inspection {
    /// The key's limit.
    pub limit: u64,
    /// The key's window (ms).
    pub window_ms: u64,
    /// Whole tokens stored in the authoritative bucket as of its last refill
    /// (`None`: no bucket stored, which reads as full).
    pub authority_tokens: Option<u64>,
    /// Clock reading (ms) of the bucket's last refill (Redis: Redis `TIME`).
    pub authority_refilled_at_ms: Option<u64>,
    /// Milliseconds until the stored bucket expires (Redis only).
    pub authority_ttl_ms: Option<u64>,
    /// Tokens this limiter holds for the key.
    pub local_tokens: u64,
    /// A lease request is in flight.
    pub lease_in_flight: bool,
    /// Denials stay local for this long (the authority said: empty).
    pub exhausted_for_ms: u64,
    /// Requests admitted / denied on this key by this limiter.
    pub admitted: u64,
    /// Requests denied on this key by this limiter.
    pub denied: u64,
    /// Adaptive leasing: the rate this instance spends on the key, in tokens
    /// per window (0: no rate grant; it leases chunks).
    pub rate_per_window: u64,
    /// Adaptive leasing: live holders of the key at the last answer.
    pub holders: u64,
    /// Adaptive leasing: this instance's fallback rate (tokens per window) at
    /// the last answer; 0 before any.
    pub fallback_per_window: u64,
    /// Adaptive leasing: the key's offered load here (admitted + denied per
    /// second, moving average).
    pub demand_per_s: u64,
    /// Every rule the key is held to (`"10/s, 10000/day"`); `limit` and
    /// `window_ms` above are the first rule's.
    pub rules: String,
    /// The key's tier, if its rules are a tier's.
    pub tier: Option<String>,
    /// Why the key has these rules (`"tier pro (assigned by store, defined
    /// in config)"`, `"own rules (from set_limit)"`).
    pub policy_source: String,
}
