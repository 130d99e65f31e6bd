//! `lease_decision`: the answer to an acquire, and the HTTP headers it implies.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use quotalease::Quota;
use quotalease::{Decision, Error, Reason, RuleSet, Rules};

use crate::error::{fail_with, lease_status, write_str};

/// Most rules one key can be held to (a tier such as "10/s, 10000/day" has
/// two): the length of `lease_decision`'s rule arrays.
pub const LEASE_MAX_RULES: usize = 4;
const _: () = assert!(LEASE_MAX_RULES == quotalease::internals::MAX_RULES);

/// Why a decision came out the way it did: one of the `LEASE_REASON_*` constants.
pub type lease_reason = u32;
/// Admitted from (or denied with) a local lease.
pub const LEASE_REASON_LEASE: lease_reason = 0;
/// Denied: the authoritative bucket is empty until `retry_after_ms`.
pub const LEASE_REASON_EXHAUSTED: lease_reason = 1;
/// Decided by the failure policy while the backend is unreachable.
pub const LEASE_REASON_FALLBACK: lease_reason = 2;
/// Denied by `lease_try_acquire`: a lease request is in flight.
pub const LEASE_REASON_PENDING: lease_reason = 3;
/// Decided by one authority call (mode exact).
pub const LEASE_REASON_EXACT: lease_reason = 4;
/// Decided by the in-process bucket (mode local).
pub const LEASE_REASON_LOCAL: lease_reason = 5;
/// Admitted although the key's rules deny it: they are in shadow mode (the
/// `shadow` option, or "shadow ..." rules). `remaining` and
/// `retry_after_ms` are what the denial said; counted in `shadow_denied`.
pub const LEASE_REASON_SHADOW: lease_reason = 6;
/// Denied: the key has a deny entry ("blocked") in the policy store or file.
pub const LEASE_REASON_BLOCKED: lease_reason = 7;
/// Admitted: the key has an allow entry ("unlimited"); no token spent.
pub const LEASE_REASON_UNLIMITED: lease_reason = 8;

/// The outcome of one acquire. Plain data owned by the caller: nothing to free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct lease_decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// Why (`LEASE_REASON_*`; `lease_reason_name` spells it).
    pub reason: lease_reason,
    /// The key's limit (tokens per window).
    pub limit: u64,
    /// Best estimate of tokens left for this key across the fleet.
    pub remaining: u64,
    /// When denied: milliseconds until a retry can succeed (0 when allowed).
    pub retry_after_ms: u64,
    /// Milliseconds until the key's bucket would be full again (a calendar
    /// quota's: until its period ends).
    pub reset_after_ms: u64,
    /// The key's window in milliseconds (a calendar quota's nominal period:
    /// 86400000 a day, 604800000 a week, 2592000000 a month, 31536000000 a year).
    pub window_ms: u64,
    /// Index of the binding rule in `rule_limits` / `rule_window_ms`: the
    /// rule that denied or, when admitted, the one with the fewest tokens
    /// left. `limit`, `remaining`, `window_ms` and the two times above are
    /// that rule's. 0 for a key with one rule.
    pub rule: u32,
    /// How many rules the key is held to (1 to `LEASE_MAX_RULES`); a request
    /// is admitted only when every rule admits it.
    pub rule_count: u32,
    /// Each rule's limit (tokens per window), first `rule_count` entries
    /// valid, the rest 0.
    pub rule_limits: [u64; LEASE_MAX_RULES],
    /// Each rule's window in milliseconds, as `rule_limits`.
    pub rule_window_ms: [u64; LEASE_MAX_RULES],
}

impl From<Decision> for lease_decision {
    #[inline]
    fn from(d: Decision) -> Self {
        Self::from(&d)
    }
}

impl From<&Decision> for lease_decision {
    /// (By reference: the hot path reads the decision in place,
    /// `Limiter::decide`.)
    #[inline]
    fn from(d: &Decision) -> Self {
        let mut rule_limits = [0; LEASE_MAX_RULES];
        let mut rule_window_ms = [0; LEASE_MAX_RULES];
        let rule_count = if d.rule_set == RuleSet::default() {
            // One rule, the decision's own (every key with no tier and
            // one rule): no lookup of the interned rule set.
            rule_limits[0] = d.limit;
            rule_window_ms[0] = d.window_ms;
            1
        } else {
            let rules = d.rules();
            let rules = rules.as_slice();
            for (i, p) in rules.iter().enumerate() {
                rule_limits[i] = p.limit;
                rule_window_ms[i] = p.window_ms;
            }
            rules.len() as u32
        };
        lease_decision {
            allowed: d.allowed,
            reason: d.reason as u8 as lease_reason,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
            window_ms: d.window_ms,
            rule: u32::from(d.rule),
            rule_count,
            rule_limits,
            rule_window_ms,
        }
    }
}

/// The core's decision a C struct describes. A struct with `rule_count` 0
/// (zero-initialised, or filled by hand from the first seven fields) is one
/// rule: `limit` per `window_ms`.
fn decision_of(c: &lease_decision) -> quotalease::Result<Decision> {
    let single = Decision::single(
        c.allowed,
        c.limit,
        c.remaining,
        c.retry_after_ms,
        c.reset_after_ms,
        c.window_ms,
        reason_of(c.reason).unwrap_or(Reason::Lease),
    );
    if c.rule_count == 0 {
        return Ok(single);
    }
    let n = c.rule_count as usize;
    if n > LEASE_MAX_RULES || c.rule >= c.rule_count {
        return Err(Error::Config {
            field: "decision",
            reason: format!(
                "has rule_count {} and rule {}: rule_count is 1 to {LEASE_MAX_RULES} and rule below it",
                c.rule_count, c.rule
            ),
        });
    }
    let list: Vec<Quota> = (0..n)
        .map(|i| Quota::new(c.rule_limits[i], c.rule_window_ms[i]))
        .collect();
    Ok(single.with_rules(&Rules::new(&list, "decision")?, c.rule as u8))
}

// The constants are the core's codes (`Reason as u8`).
const _: () = {
    assert!(LEASE_REASON_LEASE == Reason::Lease as lease_reason);
    assert!(LEASE_REASON_EXHAUSTED == Reason::Exhausted as lease_reason);
    assert!(LEASE_REASON_FALLBACK == Reason::Fallback as lease_reason);
    assert!(LEASE_REASON_PENDING == Reason::Pending as lease_reason);
    assert!(LEASE_REASON_EXACT == Reason::Exact as lease_reason);
    assert!(LEASE_REASON_LOCAL == Reason::Local as lease_reason);
    assert!(LEASE_REASON_SHADOW == Reason::Shadow as lease_reason);
    assert!(LEASE_REASON_BLOCKED == Reason::Blocked as lease_reason);
    assert!(LEASE_REASON_UNLIMITED == Reason::Unlimited as lease_reason);
};

fn reason_of(r: lease_reason) -> Option<Reason> {
    u8::try_from(r).ok().and_then(Reason::from_code)
}

/// The core's name of every reason, NUL-terminated, in code order.
fn reason_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        Reason::ALL
            .iter()
            .map(|r| CString::new(r.as_str()).unwrap_or_default())
            .collect()
    })
}

/// The reason's name as in every binding: "lease", "exhausted", "fallback",
/// "pending", "exact", "local", "shadow", "blocked" or "unlimited" ("unknown" for
/// any other value). Static
/// storage: never free it.
#[no_mangle]
pub extern "C" fn lease_reason_name(reason: lease_reason) -> *const c_char {
    ffi_boundary! {
        match reason_of(reason) {
            Some(r) => reason_names()[r as usize].as_ptr(),
            None => c"unknown".as_ptr(),
        }
    }
}

/// Write the HTTP response headers for `decision` into `buf` as
/// "Name: value\r\n" lines: the IETF `RateLimit-Policy` and `RateLimit`
/// fields (draft-ietf-httpapi-ratelimit-headers), plus `Retry-After` in whole
/// seconds when denied. `RateLimit-Policy` has one item per rule
/// (`rule_count` of them; named "default" for a key with one rule, else by
/// window: "1s", "1day"; a calendar quota by its nominal window, "30day"
/// for a month, since the struct carries no calendar), `RateLimit`
/// reports the binding rule (`rule`). A
/// decision with `rule_count` 0 is read as one rule, `limit` per
/// `window_ms`. Buffer rules as for `lease_metrics_prometheus` (512 bytes
/// always suffice).
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_BUFFER_TOO_SMALL`, `LEASE_ERR_CONFIG`
/// (`rule_count` above `LEASE_MAX_RULES`, `rule` not below `rule_count`, or
/// rules a key could not have: a zero limit or window, two rules with one
/// window).
///
/// # Safety
/// `decision` is NULL or readable; `buf` is NULL or has `cap` writable
/// bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_decision_headers(
    decision: *const lease_decision,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        let c = arg_ref!("lease_decision_headers", decision);
        let d = match decision_of(c) {
            Ok(d) => d,
            Err(e) => return fail_with("lease_decision_headers", &e),
        };
        let mut text = String::with_capacity(256);
        for (name, value) in d.headers() {
            text.push_str(name);
            text.push_str(": ");
            text.push_str(&value);
            text.push_str("\r\n");
        }
        unsafe { write_str("lease_decision_headers", &text, buf, cap, needed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    /// The longest headers a decision can have fit the 512 bytes lease.h
    /// promises: four rules whose windows have the most digits a valid
    /// rule allows (limit x window is at most 2^52), every figure at its
    /// largest, denied (so with Retry-After).
    #[test]
    fn the_longest_headers_fit_512_bytes() {
        let big = 1u64 << 52;
        let mut c = lease_decision {
            allowed: false,
            reason: LEASE_REASON_EXHAUSTED,
            limit: 1,
            remaining: u64::MAX,
            retry_after_ms: u64::MAX,
            reset_after_ms: u64::MAX,
            window_ms: big - 1,
            rule: 3,
            rule_count: 4,
            ..lease_decision::default()
        };
        for i in 0..LEASE_MAX_RULES {
            c.rule_limits[i] = 1;
            c.rule_window_ms[i] = big - 1 - i as u64 * 2;
        }
        let mut buf = [0 as c_char; 512];
        let mut needed = 0;
        let st = unsafe { lease_decision_headers(&c, buf.as_mut_ptr(), buf.len(), &mut needed) };
        assert_eq!(st, lease_status::LEASE_OK, "needed {needed}");
        assert!(
            needed > 256,
            "past the old 256-byte bound, so the case is a real one: {needed}"
        );
        // The binding rule and every rule are reported.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(text.matches(";q=1;").count(), 4, "{text}");
    }

    #[test]
    fn a_decision_round_trips_its_rules() {
        let rules = Rules::parse("10/s, 10000/day", "x").unwrap();
        let d =
            Decision::single(false, 10_000, 0, 8_640, 86_400_000, 86_400_000, Reason::Exhausted).with_rules(&rules, 1);
        let c = lease_decision::from(d);
        assert_eq!((c.rule, c.rule_count), (1, 2));
        assert_eq!(c.rule_limits, [10, 10_000, 0, 0]);
        assert_eq!(c.rule_window_ms, [1_000, 86_400_000, 0, 0]);
        assert_eq!(decision_of(&c).unwrap().headers(), d.headers());
        let one = lease_decision::from(Decision::single(true, 5, 4, 0, 200, 1_000, Reason::Lease));
        assert_eq!(
            (one.rule, one.rule_count, one.rule_limits[0], one.rule_window_ms[0]),
            (0, 1, 5, 1_000)
        );
    }

    #[test]
    fn reason_names_are_the_cores() {
        for r in Reason::ALL {
            let name = unsafe { CStr::from_ptr(lease_reason_name(r as lease_reason)) };
            assert_eq!(name.to_str().unwrap(), r.as_str());
        }
        let n = Reason::ALL.len() as lease_reason;
        for code in [n, 255, 256, u32::MAX] {
            let name = unsafe { CStr::from_ptr(lease_reason_name(code)) };
            assert_eq!(name.to_bytes(), b"unknown", "{code}");
        }
    }
}
