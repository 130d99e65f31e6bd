//! `lease_options`: options set by name, with every rule of the core's
//! [`quotalease::Options`] (names in snake_case or camelCase, a suggestion for
//! an unknown name, `rate` excluding `limit`/`window_ms`, the manual clock's
//! start). The same names and messages as every other binding.

use std::ffi::{c_char, CStr};

use quotalease::{OptionValue, Options};

use crate::error::{c_str, fail, fail_with, lease_status, lease_status::*, null_arg};

/// A configuration being assembled option by option (opaque): create it with
/// `lease_options_new`, set options by name with `lease_options_set_str` /
/// `lease_options_set_int`, build limiters with
/// `lease_limiter_new_from_options`, release it with `lease_options_free`.
///
/// The names are those of docs/configuration.md's options table, in
/// snake_case ("lease_size") or camelCase ("leaseSize"): `url`, `limit`,
/// `window_ms`, `rate`, `lease_size`, `refill_threshold`, `lease_ttl_ms`,
/// `on_backend_failure`, `expected_replicas`, `backend_timeout_ms`,
/// `key_prefix`, `max_keys`, `mode`, `clock`, `clock_start_ms`, and for
/// plan tiers and the shared policy store `tiers`, `default_tier`,
/// `policy_file`, `policy_refresh_ms`, `shadow` (shadow mode: 1 or 0 with
/// `lease_options_set_int`), and `concurrency` (`lease_acquire_concurrent`).
/// An option not set keeps its default;
/// setting it again under the same name replaces the value, and under its
/// other spelling ("window_ms" after "windowMs") is `LEASE_ERR_CONFIG`.
///
/// Thread safety: a `lease_options` is not synchronised. Calls that change it
/// (`lease_options_set_*`, `lease_options_free`) must not run at the same
/// time as any other call on it; `lease_limiter_new_from_options` only reads
/// it and may run on many threads at once.
pub struct lease_options {
    pub(crate) options: Options,
}

/// Create an empty set of options (every option at its default) in `*out`
/// (NULL on failure).
///
/// Errors: `LEASE_ERR_NULL`.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_options_new(out: *mut *mut lease_options) -> lease_status {
    ffi_boundary! {
        let out = arg_mut!("lease_options_new", out);
        *out = Box::into_raw(Box::new(lease_options { options: Options::new() }));
        LEASE_OK
    }
}

/// Release options. NULL is a no-op. Limiters built from them are not
/// affected.
///
/// # Safety
/// `options` is NULL or came from `lease_options_new` and was not freed; no
/// other call on it may run during or after this one.
#[no_mangle]
pub unsafe extern "C" fn lease_options_free(options: *mut lease_options) {
    ffi_boundary! {
        if !options.is_null() {
            drop(unsafe { Box::from_raw(options) });
        }
    }
}

fn set(fname: &str, o: &mut lease_options, name: &str, value: OptionValue<'_>) -> lease_status {
    match o.options.set(name, value) {
        Ok(_) => LEASE_OK,
        Err(e) => fail_with(fname, &e),
    }
}

/// Set a string option by name: `url`, `rate` ("600/min", or a calendar
/// quota: "1000/month@Europe/Berlin", "500/month@billing-day-15"; at most
/// N each day, week, month or year of an IANA zone, which needs adaptive
/// leasing), `key_prefix`,
/// `mode` ("lease", "exact", "local"), `on_backend_failure`
/// ("static-share", "allow", "deny"), `clock` ("system", "manual"),
/// `tiers` ("free=100/min; pro=6000/min, 1000000/day": tiers separated by
/// ';', each name=rules, a rule may be a calendar quota as in `rate`;
/// "shadow 50/min" puts a tier's rules in shadow mode), `default_tier` (a tier's name), `policy_file` (a TOML file of
/// tiers and key entries) or `shadow` ("true" or "false"). The
/// string is copied: it may be freed after the call.
///
/// Errors: `LEASE_ERR_NULL` (options, name or value), `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG`: an unknown name (the message suggests the closest
/// option, e.g. "unknown option `lese_size`; did you mean `lease_size`?"),
/// a value the option does not take (the message names the option and what
/// it accepts), or an integer option given a string. The `rate` text and
/// the rules between options (`rate` with `limit` or `window_ms`,
/// `clock_start_ms` without the manual clock) are checked by
/// `lease_limiter_new_from_options`. On failure the options are unchanged.
///
/// # Safety
/// `options` is NULL or live; `name` and `value` are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn lease_options_set_str(
    options: *mut lease_options,
    name: *const c_char,
    value: *const c_char,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_options_set_str";
        let o = arg_mut!("lease_options_set_str", options);
        let name = match unsafe { c_str(F, "name", name) } {
            Ok(n) => n,
            Err(st) => return st,
        };
        if value.is_null() {
            return null_arg(F, "value");
        }
        let value = match unsafe { CStr::from_ptr(value) }.to_str() {
            Ok(v) => v,
            Err(e) => {
                return fail(
                    LEASE_ERR_UTF8,
                    format!("{F}: the value of option `{name}` is not valid UTF-8 ({e})"),
                )
            }
        };
        set(F, o, name, OptionValue::Str(value))
    }
}

/// Set an integer option by name: `limit`, `window_ms`, `lease_size`,
/// `refill_threshold`, `lease_ttl_ms`, `expected_replicas`,
/// `backend_timeout_ms`, `max_keys`, `clock_start_ms` or
/// `policy_refresh_ms` (how often the shared policy store is polled; 0, the
/// default: no store) or `shadow` (1: shadow mode, every request the rules
/// deny is admitted with `LEASE_REASON_SHADOW`; 0, the default: enforced)
/// or `concurrency` (most requests of one key in flight at once across the
/// fleet, taken with `lease_acquire_concurrent`; 0, the default: none; it
/// needs adaptive leasing, `mode` "lease" without `lease_size`).
///
/// The value is signed so that a negative number (a C `int` gone wrong) is
/// a clear `LEASE_ERR_CONFIG` naming the option instead of a huge unsigned
/// value; every useful value fits in `int64_t` (`limit` × `window_ms` is at
/// most 2^52). There is no `LEASE_AUTO` here: leave `lease_size` /
/// `refill_threshold` unset to derive them from `limit`.
///
/// Errors as for `lease_options_set_str` (a string option given an integer
/// is `LEASE_ERR_CONFIG`).
///
/// # Safety
/// `options` is NULL or live; `name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn lease_options_set_int(
    options: *mut lease_options,
    name: *const c_char,
    value: i64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_options_set_int";
        let o = arg_mut!("lease_options_set_int", options);
        let name = match unsafe { c_str(F, "name", name) } {
            Ok(n) => n,
            Err(st) => return st,
        };
        set(F, o, name, OptionValue::Int(value.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        unsafe { CStr::from_ptr(crate::error::lease_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn names_values_and_suggestions() {
        let mut o = std::ptr::null_mut();
        assert_eq!(unsafe { lease_options_new(&mut o) }, LEASE_OK);
        assert_eq!(unsafe { lease_options_set_int(o, c"limit".as_ptr(), 5) }, LEASE_OK);
        assert_eq!(
            unsafe { lease_options_set_int(o, c"windowMs".as_ptr(), 1000) },
            LEASE_OK
        );
        assert_eq!(
            unsafe { lease_options_set_int(o, c"lese_size".as_ptr(), 2) },
            LEASE_ERR_CONFIG
        );
        assert_eq!(
            last(),
            "lease_options_set_int: invalid configuration: unknown option `lese_size`; did you mean `lease_size`?"
        );
        assert_eq!(
            unsafe { lease_options_set_int(o, c"limit".as_ptr(), -1) },
            LEASE_ERR_CONFIG
        );
        assert!(last().contains("`limit`"), "{}", last());
        assert_eq!(
            unsafe { lease_options_set_str(o, c"url".as_ptr(), c"a\xffb".as_ptr()) },
            LEASE_ERR_UTF8
        );
        assert!(last().contains("option `url`"), "{}", last());
        assert_eq!(
            unsafe { lease_options_set_str(o, std::ptr::null(), c"x".as_ptr()) },
            LEASE_ERR_NULL
        );
        assert_eq!(
            unsafe { lease_options_set_str(o, c"url".as_ptr(), std::ptr::null()) },
            LEASE_ERR_NULL
        );
        assert!(last().contains("`value`"), "{}", last());
        // windowMs was set: the other spelling is an error naming both, the
        // same spelling again replaces the value.
        assert_eq!(
            unsafe { lease_options_set_int(o, c"window_ms".as_ptr(), 2000) },
            LEASE_ERR_CONFIG
        );
        assert_eq!(
            last(),
            "lease_options_set_int: invalid configuration: `window_ms` was given twice, as `windowMs` and as \
             `window_ms` (two spellings of one option): give it once"
        );
        assert_eq!(unsafe { lease_options_set_int(o, c"limit".as_ptr(), 5) }, LEASE_OK);
        let cfg = unsafe { &*o }.options.clone().into_config().unwrap();
        assert_eq!((cfg.limit, cfg.window_ms), (5, 1000));
        unsafe { lease_options_free(o) };
        unsafe { lease_options_free(std::ptr::null_mut()) };
    }
}
