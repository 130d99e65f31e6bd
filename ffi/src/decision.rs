//! `lease_decision`: the answer to an acquire, and the HTTP headers it implies.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use quotalease::{Decision, Reason};

use crate::error::{lease_status, write_str};

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
    /// Milliseconds until the key's bucket would be full again.
    pub reset_after_ms: u64,
    /// The key's window in milliseconds.
    pub window_ms: u64,
}

impl From<Decision> for lease_decision {
    #[inline]
    fn from(d: Decision) -> Self {
        lease_decision {
            allowed: d.allowed,
            reason: d.reason as u8 as lease_reason,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
            window_ms: d.window_ms,
        }
    }
}

// The constants are the core's codes (`Reason as u8`).
const _: () = {
    assert!(LEASE_REASON_LEASE == Reason::Lease as lease_reason);
    assert!(LEASE_REASON_EXHAUSTED == Reason::Exhausted as lease_reason);
    assert!(LEASE_REASON_FALLBACK == Reason::Fallback as lease_reason);
    assert!(LEASE_REASON_PENDING == Reason::Pending as lease_reason);
    assert!(LEASE_REASON_EXACT == Reason::Exact as lease_reason);
    assert!(LEASE_REASON_LOCAL == Reason::Local as lease_reason);
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
/// "pending", "exact" or "local" ("unknown" for any other value). Static
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
/// seconds when denied. Buffer rules as for `lease_metrics_prometheus`
/// (256 bytes always suffice).
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
        let d = Decision {
            allowed: c.allowed,
            limit: c.limit,
            remaining: c.remaining,
            retry_after_ms: c.retry_after_ms,
            reset_after_ms: c.reset_after_ms,
            window_ms: c.window_ms,
            reason: reason_of(c.reason).unwrap_or(Reason::Lease),
        };
        let mut text = String::with_capacity(128);
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
