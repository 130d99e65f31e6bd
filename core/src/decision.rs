//! The answer to `acquire`, and the HTTP headers it implies.

use std::fmt;

/// Why a decision came out the way it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reason {
    /// Admitted from (or denied with) a local lease.
    Lease = 0,
    /// Denied: the authoritative bucket is empty until `retry_after_ms`.
    Exhausted = 1,
    /// Decided by the failure policy while the backend is unreachable.
    Fallback = 2,
    /// Denied by `try_acquire`: a lease request is in flight.
    Pending = 3,
    /// Decided by one authority call (mode `exact`).
    Exact = 4,
    /// Decided by the in-process bucket (mode `local`).
    Local = 5,
}

impl Reason {
    /// Every reason, in code order (`Reason as u8`).
    pub const ALL: [Reason; 6] = [
        Reason::Lease,
        Reason::Exhausted,
        Reason::Fallback,
        Reason::Pending,
        Reason::Exact,
        Reason::Local,
    ];

    /// The reason with this code (`Reason as u8`).
    pub fn from_code(code: u8) -> Option<Reason> {
        Reason::ALL.get(code as usize).copied()
    }

    /// The reason's name in every binding.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Lease => "lease",
            Reason::Exhausted => "exhausted",
            Reason::Fallback => "fallback",
            Reason::Pending => "pending",
            Reason::Exact => "exact",
            Reason::Local => "local",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one `acquire`. Plain data: copying it allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The key's limit (tokens per window).
    pub limit: u64,
    /// Best estimate of tokens left for this key across the fleet.
    pub remaining: u64,
    /// When denied: milliseconds until a retry can succeed (0 when allowed).
    pub retry_after_ms: u64,
    /// Milliseconds until the key's bucket would be full again.
    pub reset_after_ms: u64,
    /// The key's window in milliseconds.
    pub window_ms: u64,
    /// Why.
    pub reason: Reason,
}

impl Decision {
    /// HTTP response headers for this decision: the IETF `RateLimit-Policy`
    /// and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers, structured
    /// field syntax, policy name `"default"`), plus `Retry-After` in whole
    /// seconds when denied.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::with_capacity(3);
        h.push((
            "RateLimit-Policy",
            format!(
                "\"default\";q={};w={}",
                self.limit,
                self.window_ms.div_ceil(1000).max(1)
            ),
        ));
        h.push((
            "RateLimit",
            format!(
                "\"default\";r={};t={}",
                self.remaining,
                self.reset_after_ms.div_ceil(1000)
            ),
        ));
        if !self.allowed {
            h.push(("Retry-After", self.retry_after_ms.div_ceil(1000).max(1).to_string()));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_the_draft() {
        let d = Decision {
            allowed: false,
            limit: 100,
            remaining: 0,
            retry_after_ms: 1_200,
            reset_after_ms: 30_500,
            window_ms: 60_000,
            reason: Reason::Exhausted,
        };
        assert_eq!(
            d.headers(),
            vec![
                ("RateLimit-Policy", "\"default\";q=100;w=60".to_string()),
                ("RateLimit", "\"default\";r=0;t=31".to_string()),
                ("Retry-After", "2".to_string()),
            ]
        );
        let ok = Decision {
            allowed: true,
            retry_after_ms: 0,
            ..d
        };
        assert_eq!(ok.headers().len(), 2);
    }
}

#[cfg(test)]
mod reason_tests {
    use super::Reason;

    #[test]
    fn codes_and_names_round_trip() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as u8 as usize, i);
            assert_eq!(Reason::from_code(i as u8), Some(*r));
        }
        assert_eq!(Reason::from_code(6), None);
        let names: Vec<&str> = Reason::ALL.iter().map(Reason::as_str).collect();
        assert_eq!(names, ["lease", "exhausted", "fallback", "pending", "exact", "local"]);
    }
}
