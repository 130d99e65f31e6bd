//! Plan tiers and the shared policy store: the operator calls, and what a
//! key's policy is and where it came from.

use std::ffi::c_char;

use quotalease::{PolicySource, Rules};

use crate::error::{c_str, fail_with, key_str, lease_status, lease_status::*, null_arg, status, write_str};
use crate::inspection::lease_inspection;
use crate::limiter::{lease_limiter, tier_str};

/// A store call's result: `*version` (when not NULL) gets the store's
/// version after the change.
fn versioned(fname: &str, r: quotalease::Result<u64>, version: *mut u64) -> lease_status {
    match r {
        Ok(v) => {
            if let Some(out) = unsafe { version.as_mut() } {
                *out = v;
            }
            LEASE_OK
        }
        Err(e) => fail_with(fname, &e),
    }
}

/// The text `lease_policy_describe` and `lease_inspect_policy` write.
fn policy_text(rules: &str, tier: Option<&str>, source: &str) -> String {
    let mut s = format!("rules: {rules}\n");
    if let Some(t) = tier {
        s.push_str("tier: ");
        s.push_str(t);
        s.push('\n');
    }
    s.push_str("source: ");
    s.push_str(source);
    s.push('\n');
    s
}

fn describe(rules: &Rules, source: &PolicySource) -> String {
    policy_text(&rules.to_string(), source.tier.as_deref(), &source.to_string())
}

/// Define (or redefine) plan tier `name` in the shared policy store as
/// `rules` ("6000/min, 1000000/day": one to `LEASE_MAX_RULES` rates with
/// distinct windows). Every limiter on the same store (the same Redis and
/// `key_prefix`, or the same `memory://NAME`) applies it within its
/// `policy_refresh_ms` (or at its `lease_refresh_policies`); this one before
/// returning. Keys in the tier keep their buckets' state: lowering clamps,
/// raising refills at the new rate. Waits for the store (a Redis round
/// trip). `*version` (when `version` is not NULL) receives the store's
/// version after the change.
///
/// Errors: `LEASE_ERR_NULL` (limiter, name, rules), `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG` (a name that is not 1 to 64 letters, digits, '_', '-'
/// or '.', malformed rules; the message says what is accepted, or a limiter
/// with `policy_refresh_ms` 0, which has no store), `LEASE_ERR_CLOSED`,
/// `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live; `name` and `rules` are NULL or NUL-terminated;
/// `version` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_set_tier(
    limiter: *const lease_limiter,
    name: *const c_char,
    rules: *const c_char,
    version: *mut u64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_set_tier";
        let l = arg_ref!("lease_policy_set_tier", limiter);
        let name = match unsafe { c_str(F, "name", name) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        let rules = match unsafe { c_str(F, "rules", rules) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        versioned(F, l.limiter.policy_set_tier(name, rules), version)
    }
}

/// Remove tier `name` from the shared store: keys in it fall back to the
/// options' or the policy file's definition of the tier, if any. Removing a
/// tier the store does not hold is `LEASE_OK`. `*version` as for
/// `lease_policy_set_tier`.
///
/// Errors: as `lease_policy_set_tier`.
///
/// # Safety
/// `limiter` is NULL or live; `name` is NULL or NUL-terminated; `version`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_delete_tier(
    limiter: *const lease_limiter,
    name: *const c_char,
    version: *mut u64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_delete_tier";
        let l = arg_ref!("lease_policy_delete_tier", limiter);
        let name = match unsafe { c_str(F, "name", name) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        versioned(F, l.limiter.policy_delete_tier(name), version)
    }
}

/// Give `key` (`key_len` bytes of UTF-8, as for `lease_acquire`) its own
/// entry in the shared store: `assignment` is "tier:NAME" or rules of its
/// own ("10/s, 1000/day"). The entry wins over the tier callers name.
/// `*version` as for `lease_policy_set_tier`.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG` (a malformed assignment, or no store),
/// `LEASE_ERR_CLOSED`, `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `assignment` is NULL or NUL-terminated; `version` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_assign(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    assignment: *const c_char,
    version: *mut u64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_assign";
        let l = arg_ref!("lease_policy_assign", limiter);
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        let assignment = match unsafe { c_str(F, "assignment", assignment) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        versioned(F, l.limiter.policy_assign(key, assignment), version)
    }
}

/// Remove `key`'s entry from the shared store (`LEASE_OK` when it has
/// none). `*version` as for `lease_policy_set_tier`.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG` (no store), `LEASE_ERR_CLOSED`, `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `version` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_unassign(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    version: *mut u64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_unassign";
        let l = arg_ref!("lease_policy_unassign", limiter);
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        versioned(F, l.limiter.policy_unassign(key), version)
    }
}

/// Write `key`'s entry in the shared store, as stored ("tier:pro" or
/// "10/s, 1000/day"), NUL-terminated into `buf`; "" when the store holds
/// none (an entry is never empty). Reads the store (a Redis round trip).
/// Buffer rules as for `lease_metrics_prometheus` (512 bytes always
/// suffice).
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`,
/// `LEASE_ERR_BUFFER_TOO_SMALL`, `LEASE_ERR_CONFIG` (no store),
/// `LEASE_ERR_CLOSED`, `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `buf` is NULL or has `cap` writable bytes; `needed` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_get(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_get";
        let l = arg_ref!("lease_policy_get", limiter);
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        match l.limiter.policy_get(key) {
            Ok(entry) => unsafe { write_str(F, entry.as_deref().unwrap_or(""), buf, cap, needed) },
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Check the policy store (and the policy file) now and apply what changed
/// before returning; without it a limiter does so every
/// `policy_refresh_ms`. `LEASE_OK` with no store.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_CLOSED`, `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_refresh_policies(limiter: *const lease_limiter) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_refresh_policies", limiter);
        status("lease_refresh_policies", l.limiter.refresh_policies())
    }
}

/// The rules `key` is held to on a call naming `tier` (as for
/// `lease_acquire_tier`: NULL with `tier_len` 0 names none), and why,
/// written NUL-terminated into `buf` as lines "name: value\n":
///
/// ```text
/// rules: 6000/min, 1000000/day
/// tier: pro
/// source: tier pro (assigned by store, defined in config)
/// ```
///
/// The `tier:` line is there only when the rules are a tier's; `source`
/// says where the assignment and the rules came from ("config", "file",
/// "store", "set_limit", "caller", "default_tier"), e.g. "own rules (from
/// set_limit)". Reads what this limiter knows: no call to the store.
/// Buffer rules as for `lease_metrics_prometheus` (512 bytes always suffice).
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG` (an unknown tier, or one that is not UTF-8),
/// `LEASE_ERR_BUFFER_TOO_SMALL`, `LEASE_ERR_CLOSED`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `tier` is NULL or has `tier_len` readable bytes; `buf` is NULL or
/// has `cap` writable bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_policy_describe(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    tier: *const u8,
    tier_len: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_policy_describe";
        let l = arg_ref!("lease_policy_describe", limiter);
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        let tier = match unsafe { tier_str(F, tier, tier_len) } {
            Ok(t) => t,
            Err(st) => return st,
        };
        match l.limiter.policy(key, tier) {
            Ok((rules, source)) => unsafe { write_str(F, &describe(&rules, &source), buf, cap, needed) },
            Err(e) => fail_with(F, &e),
        }
    }
}

/// `lease_inspect` with the key's policy as text: the figures go to `*out`
/// (when `out` is not NULL) and the policy in force, for the tier the key's
/// calls name, to `buf` in the form of `lease_policy_describe` (the
/// inspection's rules, tier and policy source). One read of the authority,
/// as `lease_inspect`. On `LEASE_ERR_BUFFER_TOO_SMALL` nothing is written to
/// `*out` (512 bytes always suffice).
///
/// Errors: as `lease_inspect`, and `LEASE_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `out` is NULL or writable; `buf` is NULL or has `cap` writable
/// bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_inspect_policy(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    out: *mut lease_inspection,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_inspect_policy";
        let l = arg_ref!("lease_inspect_policy", limiter);
        if buf.is_null() && cap > 0 {
            return null_arg(F, "buf");
        }
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        match l.limiter.inspect(key) {
            Ok(i) => {
                let text = policy_text(&i.rules, i.tier.as_deref(), &i.policy_source);
                let st = unsafe { write_str(F, &text, buf, cap, needed) };
                if st == LEASE_OK {
                    if let Some(o) = unsafe { out.as_mut() } {
                        *o = i.into();
                    }
                }
                st
            }
            Err(e) => fail_with(F, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest text a key's policy can have fits the 512 bytes the
    /// docs promise: four rules at the largest limit and window, the
    /// longest tier name, the longest source sentence.
    #[test]
    fn the_longest_policy_text_fits_512_bytes() {
        // An upper bound on one rule's text: a limit and a window of 2^52
        // each (their product is at most 2^52, so no rule reaches both).
        let rule = format!("{0}/{0}ms", 1u64 << 52);
        let rules = vec![rule; quotalease::internals::MAX_RULES].join(", ");
        let tier = "t".repeat(64);
        let source = format!("tier {tier} (assigned by default_tier, defined in default_tier)");
        assert!(policy_text(&rules, Some(&tier), &source).len() < 512);
    }

    #[test]
    fn the_text_has_a_tier_line_only_for_a_tier() {
        assert_eq!(
            policy_text("10/s", None, "own rules (from set_limit)"),
            "rules: 10/s\nsource: own rules (from set_limit)\n"
        );
        assert_eq!(
            policy_text(
                "1/s, 5/min",
                Some("pro"),
                "tier pro (assigned by caller, defined in config)"
            ),
            "rules: 1/s, 5/min\ntier: pro\nsource: tier pro (assigned by caller, defined in config)\n"
        );
    }
}
