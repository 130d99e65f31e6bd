//! The answer to `acquire`, and the HTTP headers it implies.

use std::fmt;

use crate::bucket::Quota;
use crate::policy::{rule_name, RuleSet, Rules};

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
    /// Admitted although the key's rules deny it: they are in shadow mode
    /// (the limiter's `shadow` option, or `"shadow ..."` rules of a tier or
    /// key). Counted in `denied` and `shadow_denied`; `remaining` and
    /// `retry_after_ms` are what the denial said.
    Shadow = 6,
    /// Denied: the key has a deny entry (`blocked`) in the policy store or
    /// file. Not turned into an admission by shadow mode.
    Blocked = 7,
    /// Admitted: the key has an allow entry (`unlimited`); no token spent.
    Unlimited = 8,
}

impl Reason {
    /// Every reason, in code order (`Reason as u8`).
    pub const ALL: [Reason; 9] = [
        Reason::Lease,
        Reason::Exhausted,
        Reason::Fallback,
        Reason::Pending,
        Reason::Exact,
        Reason::Local,
        Reason::Shadow,
        Reason::Blocked,
        Reason::Unlimited,
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
            Reason::Shadow => "shadow",
            Reason::Blocked => "blocked",
            Reason::Unlimited => "unlimited",
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
    /// Admitted: best estimate of tokens left for this key across the fleet.
    /// Denied: what this caller can have now (its instance's own tokens).
    pub remaining: u64,
    /// When denied: milliseconds until a retry can succeed (0 when
    /// allowed, except reason `shadow`: what the denial said).
    pub retry_after_ms: u64,
    /// Milliseconds until the key's bucket would be full again.
    pub reset_after_ms: u64,
    /// The key's window in milliseconds.
    pub window_ms: u64,
    /// Why.
    pub reason: Reason,
    /// Index of the binding rule in [`rules()`](Self::rules) (0 for a key
    /// with one rule): the rule that denied, or, when admitted, the one
    /// with the fewest tokens left. `limit`, `remaining`, `window_ms` and
    /// the times above are the binding rule's.
    pub rule: u8,
    /// Every rule the key is held to, as an id ([`Decision::rules`] reads it).
    pub rule_set: RuleSet,
}

impl Decision {
    /// A decision with one rule (`limit` per `window_ms`), as the C ABI and
    /// bindings rebuild one from its fields.
    pub fn single(
        allowed: bool,
        limit: u64,
        remaining: u64,
        retry_after_ms: u64,
        reset_after_ms: u64,
        window_ms: u64,
        reason: Reason,
    ) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            retry_after_ms,
            reset_after_ms,
            window_ms,
            reason,
            rule: 0,
            rule_set: RuleSet(0),
        }
    }

    /// Every rule the key is held to, first to last (one unless its tier or
    /// policy has several).
    pub fn rules(&self) -> Rules {
        match self.rule_set.get() {
            Some(r) => *r,
            None => Rules::one(Quota::new(self.limit, self.window_ms)),
        }
    }

    /// A decision that reports every rule of `rules`, the binding one at
    /// index `rule` (the C ABI and bindings rebuild decisions with it).
    pub fn with_rules(self, rules: &Rules, rule: u8) -> Decision {
        Decision {
            rule,
            rule_set: RuleSet::of(rules),
            ..self
        }
    }

    /// The binding rule's name in the headers: `"default"` for a key with
    /// one rule, else its window (`"1s"`, `"1day"`).
    pub fn rule_name(&self) -> String {
        let rules = self.rules();
        let p = rules.as_slice().get(self.rule as usize).copied();
        rule_name(&rules, &p.unwrap_or(Quota::new(self.limit, self.window_ms)))
    }

    /// HTTP response headers for this decision: the IETF `RateLimit-Policy`
    /// and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers, structured
    /// field syntax), plus `Retry-After` in whole seconds when denied.
    /// `RateLimit-Policy` lists every rule (one item each; a key with one
    /// rule has the policy `"default"`); `RateLimit` reports the binding rule.
    /// None for reasons `shadow` and `unlimited`: the client is held to no
    /// rule (and `r=0` on a request that went through would mislead it);
    /// only `Retry-After` for `blocked`, whose key is held to no rule either.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self.reason {
            Reason::Shadow | Reason::Unlimited => return Vec::new(),
            Reason::Blocked => return vec![("Retry-After", self.retry_after_secs())],
            _ => {}
        }
        let mut h = Vec::with_capacity(3);
        let mut policy = String::new();
        let rules = self.rules();
        for p in rules.as_slice() {
            if !policy.is_empty() {
                policy.push_str(", ");
            }
            policy.push_str(&format!(
                "\"{}\";q={};w={}",
                rule_name(&rules, p),
                p.limit,
                p.window_ms.div_ceil(1000).max(1)
            ));
        }
        h.push(("RateLimit-Policy", policy));
        h.push((
            "RateLimit",
            format!(
                "\"{}\";r={};t={}",
                self.rule_name(),
                self.remaining,
                self.reset_after_ms.div_ceil(1000)
            ),
        ));
        if !self.allowed {
            h.push(("Retry-After", self.retry_after_secs()));
        }
        h
    }

    /// `Retry-After` in whole seconds, at least 1.
    fn retry_after_secs(&self) -> String {
        self.retry_after_ms.div_ceil(1000).max(1).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_follow_the_draft() {
        let d = Decision::single(false, 100, 0, 1_200, 30_500, 60_000, Reason::Exhausted);
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
        let shadow = Decision {
            allowed: true,
            reason: Reason::Shadow,
            ..d
        };
        assert!(shadow.headers().is_empty(), "no headers for rules in shadow mode");
        let unlimited = Decision {
            reason: Reason::Unlimited,
            ..ok
        };
        assert!(unlimited.headers().is_empty());
        let blocked = Decision {
            reason: Reason::Blocked,
            ..d
        };
        assert_eq!(blocked.headers(), vec![("Retry-After", "2".to_string())]);
    }

    #[test]
    fn several_rules_list_every_policy_and_report_the_binding_one() {
        let rules = Rules::parse("10/s, 10000/day", "x").unwrap();
        let d =
            Decision::single(false, 10_000, 0, 8_640, 86_400_000, 86_400_000, Reason::Exhausted).with_rules(&rules, 1);
        assert_eq!(d.rules(), rules);
        assert!(
            std::mem::size_of::<Decision>() <= 48,
            "a decision stays small (the admit path returns it)"
        );
        assert_eq!(
            d.headers(),
            vec![
                (
                    "RateLimit-Policy",
                    "\"1s\";q=10;w=1, \"1day\";q=10000;w=86400".to_string()
                ),
                ("RateLimit", "\"1day\";r=0;t=86400".to_string()),
                ("Retry-After", "9".to_string()),
            ]
        );
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
        assert_eq!(Reason::from_code(9), None);
        let names: Vec<&str> = Reason::ALL.iter().map(Reason::as_str).collect();
        assert_eq!(
            names,
            [
                "lease",
                "exhausted",
                "fallback",
                "pending",
                "exact",
                "local",
                "shadow",
                "blocked",
                "unlimited"
            ]
        );
    }
}
