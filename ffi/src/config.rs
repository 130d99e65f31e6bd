//! `lease_config`: every option of docs/design.md, with `lease_config_init` filling the defaults.

use std::ffi::c_char;

use quotalease::{Config, FailurePolicy, Mode, OptionValue, Options, MANUAL_CLOCK_START_MS};

use crate::error::{c_str, fail, fail_with, lease_status, lease_status::*, write_str};

/// Coordination mode: one of the `LEASE_MODE_*` constants.
pub type lease_mode = u32;
/// Local leases borrowed from the authority in chunks (default).
pub const LEASE_MODE_LEASE: lease_mode = 0;
/// One authority call per request: exact, for modest traffic.
pub const LEASE_MODE_EXACT: lease_mode = 1;
/// An in-process bucket of `limit / expected_replicas`, no coordination.
pub const LEASE_MODE_LOCAL: lease_mode = 2;

/// What the limiter does while the backend is unreachable and local tokens
/// are spent: one of the `LEASE_FAILURE_*` constants.
pub type lease_failure_policy = u32;
/// A local bucket of `limit / expected_replicas` per key (default).
pub const LEASE_FAILURE_STATIC_SHARE: lease_failure_policy = 0;
/// Admit everything until the backend is back.
pub const LEASE_FAILURE_ALLOW: lease_failure_policy = 1;
/// Deny everything until the backend is back.
pub const LEASE_FAILURE_DENY: lease_failure_policy = 2;

/// Where time comes from: one of the `LEASE_CLOCK_*` constants.
pub type lease_clock = u32;
/// The process' monotonic clock; Redis scripts use Redis `TIME` (default).
pub const LEASE_CLOCK_SYSTEM: lease_clock = 0;
/// A manual clock starting at `clock_start_ms` (default 1000000, as in every
/// language), moved only by `lease_advance_clock`: for deterministic tests.
pub const LEASE_CLOCK_MANUAL: lease_clock = 1;

/// `lease_size` / `refill_threshold` value meaning "derive it from `limit`".
pub const LEASE_AUTO: u64 = u64::MAX;

/// Every option a limiter takes. Always start from `lease_config_init`, then
/// set what you need: a zero is passed on as zero (and rejected where it is
/// invalid), never silently replaced by a default. The values go through the
/// same rules as options set by name (`lease_options`, which also takes a
/// `rate` such as "600/min").
///
/// The struct belongs to the caller; liblease copies what it needs in
/// `lease_limiter_new`, so the strings may be freed after that call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lease_config {
    /// NUL-terminated UTF-8. Default "memory://" (an in-process authority
    /// private to the limiter); "memory://NAME" is shared by every limiter of
    /// the process with that NAME; `"redis://[user:pass@]host:port[/db]"`,
    /// "rediss://" (TLS), `"redis+cluster://host:port[,host:port...]"`,
    /// `"redis+sentinel://host:port[,host:port...]/service_name[/db]"`.
    pub url: *const c_char,
    /// Tokens per window for every key (required: the default 0 is rejected).
    pub limit: u64,
    /// Window in milliseconds (default 60000).
    pub window_ms: u64,
    /// Tokens borrowed per lease (default `LEASE_AUTO`: 2 % of `limit`,
    /// between 1 and 20). Must be between 1 and `limit`.
    pub lease_size: u64,
    /// Prefetch when local tokens drop below this (default `LEASE_AUTO`: a
    /// quarter of `lease_size`, at least 1). 0 disables prefetch.
    pub refill_threshold: u64,
    /// Leased tokens unused this long are given back (default 2000).
    pub lease_ttl_ms: u64,
    /// `LEASE_FAILURE_STATIC_SHARE` (default), `LEASE_FAILURE_ALLOW` or `LEASE_FAILURE_DENY`.
    pub on_backend_failure: lease_failure_policy,
    /// `LEASE_MODE_LEASE` (default), `LEASE_MODE_EXACT` or `LEASE_MODE_LOCAL`.
    pub mode: lease_mode,
    /// Instances expected to share a key; sizes the static share (default 1).
    pub expected_replicas: u64,
    /// Bound on every backend round trip and on a cold acquire's wait, in ms
    /// (default 250, at most 60000).
    pub backend_timeout_ms: u64,
    /// NUL-terminated UTF-8 prefix of every Redis key (default "ql"; at most
    /// 64 bytes, no '{' or '}').
    pub key_prefix: *const c_char,
    /// Most keys tracked locally; idle ones are evicted (default 100000).
    pub max_keys: u64,
    /// `LEASE_CLOCK_SYSTEM` (default) or `LEASE_CLOCK_MANUAL` (tests).
    pub clock: lease_clock,
    /// With `LEASE_CLOCK_MANUAL`: the clock's first reading in ms (default
    /// 1000000, where every language's manual clock starts; at most 2^52). With
    /// `LEASE_CLOCK_SYSTEM` leave it at its default: any other value is
    /// `LEASE_ERR_CONFIG` (it needs the manual clock).
    pub clock_start_ms: u64,
    /// Reserved for options added in later minor versions; `lease_config_init`
    /// sets them, leave them alone.
    pub _reserved: [u64; 4],
}

/// Fill `config` with every default (see each field). `limit` is left at 0:
/// set it (and `window_ms`) before `lease_limiter_new`.
///
/// The default strings point to static storage owned by liblease.
///
/// # Safety
/// `config` is NULL or points to a writable `lease_config`.
#[no_mangle]
pub unsafe extern "C" fn lease_config_init(config: *mut lease_config) -> lease_status {
    ffi_boundary! {
        if config.is_null() {
            return crate::error::null_arg("lease_config_init", "config");
        }
        let d = quotalease::internals::default_config();
        let c = lease_config {
            url: c"memory://".as_ptr(),
            limit: d.limit,
            window_ms: d.window_ms,
            lease_size: LEASE_AUTO,
            refill_threshold: LEASE_AUTO,
            lease_ttl_ms: d.lease_ttl_ms,
            on_backend_failure: LEASE_FAILURE_STATIC_SHARE,
            mode: LEASE_MODE_LEASE,
            expected_replicas: d.expected_replicas,
            backend_timeout_ms: d.backend_timeout_ms,
            key_prefix: c"ql".as_ptr(),
            max_keys: d.max_keys as u64,
            clock: LEASE_CLOCK_SYSTEM,
            clock_start_ms: MANUAL_CLOCK_START_MS,
            _reserved: [0; 4],
        };
        unsafe { config.write(c) };
        LEASE_OK
    }
}

fn bad_enum(fname: &str, field: &str, got: u32, allowed: &str) -> lease_status {
    fail(
        LEASE_ERR_CONFIG,
        format!("{fname}: invalid configuration: `{field}` must be one of {allowed} (got {got})"),
    )
}

/// Translate a C configuration into the engine's. The enum values are
/// checked here; every field then goes through the core's options by name
/// ([`Options::set`]), so the rules and messages are those of every
/// language. `LEASE_AUTO` leaves `lease_size` / `refill_threshold` unset,
/// and with the system clock a `clock_start_ms` left at its default is not
/// set (any other value is, and the core rejects it without the manual clock).
///
/// # Safety
/// `c` points to a readable `lease_config` whose strings are NULL or valid.
pub(crate) unsafe fn to_config(fname: &str, c: *const lease_config) -> Result<Config, lease_status> {
    // Every field is an integer or a pointer, so any bit pattern is a valid
    // copy; the enum values are checked below.
    let c = unsafe { c.read() };
    let mode = match c.mode {
        LEASE_MODE_LEASE => Mode::Lease,
        LEASE_MODE_EXACT => Mode::Exact,
        LEASE_MODE_LOCAL => Mode::Local,
        other => {
            return Err(bad_enum(
                fname,
                "mode",
                other,
                "LEASE_MODE_LEASE (0), LEASE_MODE_EXACT (1), LEASE_MODE_LOCAL (2)",
            ))
        }
    };
    let on_backend_failure = match c.on_backend_failure {
        LEASE_FAILURE_STATIC_SHARE => FailurePolicy::StaticShare,
        LEASE_FAILURE_ALLOW => FailurePolicy::Allow,
        LEASE_FAILURE_DENY => FailurePolicy::Deny,
        other => {
            return Err(bad_enum(
                fname,
                "on_backend_failure",
                other,
                "LEASE_FAILURE_STATIC_SHARE (0), LEASE_FAILURE_ALLOW (1), LEASE_FAILURE_DENY (2)",
            ))
        }
    };
    let manual_clock = match c.clock {
        LEASE_CLOCK_SYSTEM => false,
        LEASE_CLOCK_MANUAL => true,
        other => {
            return Err(bad_enum(
                fname,
                "clock",
                other,
                "LEASE_CLOCK_SYSTEM (0), LEASE_CLOCK_MANUAL (1)",
            ))
        }
    };
    let url = unsafe { c_str(fname, "config->url", c.url) }?;
    let key_prefix = unsafe { c_str(fname, "config->key_prefix", c.key_prefix) }?;
    let int = |v: u64| OptionValue::Int(v.into());
    let str = OptionValue::Str;
    let build = || -> quotalease::Result<Config> {
        let mut o = Options::new();
        o.set("url", str(url))?
            .set("limit", int(c.limit))?
            .set("window_ms", int(c.window_ms))?
            .set("lease_ttl_ms", int(c.lease_ttl_ms))?
            .set("on_backend_failure", str(on_backend_failure.as_str()))?
            .set("expected_replicas", int(c.expected_replicas))?
            .set("backend_timeout_ms", int(c.backend_timeout_ms))?
            .set("key_prefix", str(key_prefix))?
            .set("max_keys", int(c.max_keys))?
            .set("mode", str(mode.as_str()))?;
        if c.lease_size != LEASE_AUTO {
            o.set("lease_size", int(c.lease_size))?;
        }
        if c.refill_threshold != LEASE_AUTO {
            o.set("refill_threshold", int(c.refill_threshold))?;
        }
        if manual_clock {
            o.set("clock", str("manual"))?;
        }
        if manual_clock || c.clock_start_ms != MANUAL_CLOCK_START_MS {
            o.set("clock_start_ms", int(c.clock_start_ms))?;
        }
        o.into_config()
    };
    build().map_err(|e| fail_with(fname, &e))
}

/// Parse a mode name ("lease", "exact", "local") into `*out`, e.g. from a
/// configuration file. An unknown name is `LEASE_ERR_CONFIG`; a name that
/// is not UTF-8 `LEASE_ERR_UTF8`; a NULL argument `LEASE_ERR_NULL`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_mode_parse(name: *const c_char, out: *mut lease_mode) -> lease_status {
    ffi_boundary! {
        let out = arg_mut!("lease_mode_parse", out);
        let s = match unsafe { c_str("lease_mode_parse", "name", name) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        match s.parse::<Mode>() {
            Ok(m) => {
                *out = match m {
                    Mode::Lease => LEASE_MODE_LEASE,
                    Mode::Exact => LEASE_MODE_EXACT,
                    Mode::Local => LEASE_MODE_LOCAL,
                };
                LEASE_OK
            }
            Err(e) => fail_with("lease_mode_parse", &e),
        }
    }
}

/// Parse a failure policy name ("static-share", "allow", "deny") into `*out`.
/// An unknown name is `LEASE_ERR_CONFIG`; a name that is not UTF-8
/// `LEASE_ERR_UTF8`; a NULL argument `LEASE_ERR_NULL`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_failure_policy_parse(
    name: *const c_char,
    out: *mut lease_failure_policy,
) -> lease_status {
    ffi_boundary! {
        let out = arg_mut!("lease_failure_policy_parse", out);
        let s = match unsafe { c_str("lease_failure_policy_parse", "name", name) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        match s.parse::<FailurePolicy>() {
            Ok(p) => {
                *out = match p {
                    FailurePolicy::StaticShare => LEASE_FAILURE_STATIC_SHARE,
                    FailurePolicy::Allow => LEASE_FAILURE_ALLOW,
                    FailurePolicy::Deny => LEASE_FAILURE_DENY,
                };
                LEASE_OK
            }
            Err(e) => fail_with("lease_failure_policy_parse", &e),
        }
    }
}

/// Parse a rate such as "600/min", "10/s", "100/30s" or "5000/hour" into a
/// limit and a window. An invalid rate is `LEASE_ERR_CONFIG`, as is a
/// calendar quota ("1000/month@UTC": it has no limit-and-window form; give
/// it as the `rate` or `tiers` option); a rate that is not UTF-8
/// `LEASE_ERR_UTF8`; a NULL argument `LEASE_ERR_NULL`.
///
/// # Safety
/// `rate` is NULL or a NUL-terminated string; `limit` and `window_ms` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_parse_rate(rate: *const c_char, limit: *mut u64, window_ms: *mut u64) -> lease_status {
    ffi_boundary! {
        let limit = arg_mut!("lease_parse_rate", limit);
        let window_ms = arg_mut!("lease_parse_rate", window_ms);
        let s = match unsafe { c_str("lease_parse_rate", "rate", rate) } {
            Ok(s) => s,
            Err(st) => return st,
        };
        match quotalease::parse_rate(s) {
            Ok((l, w)) => {
                *limit = l;
                *window_ms = w;
                LEASE_OK
            }
            Err(e) => fail_with("lease_parse_rate", &e),
        }
    }
}

/// `url` as liblease prints it, written NUL-terminated into `buf`: user
/// name and password (everything between "://" and the last '@') become
/// "***", and so do a port that is not a number, query values other than a
/// valid `protocol` or `db`, and a fragment other than `#insecure`; hosts,
/// ports and the database stay: in "redis://user:pw@h:6379/0", "user:pw"
/// becomes "***". Every message liblease writes (`lease_last_error`,
/// events) already follows this rule; use it to log a URL yourself.
///
/// Buffer rules as for `lease_metrics_prometheus`: `*needed` (when `needed`
/// is not NULL) receives the size needed, NUL included; a smaller `cap`
/// gets "" (if `cap > 0`) and `LEASE_ERR_BUFFER_TOO_SMALL`. The result can
/// be a few bytes longer than `url`.
///
/// Errors: `LEASE_ERR_NULL` (url, or buf with `cap > 0`), `LEASE_ERR_UTF8`,
/// `LEASE_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `url` is NULL or a NUL-terminated string; `buf` is NULL or has `cap`
/// writable bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_redact_url(
    url: *const c_char,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_redact_url";
        let url = match unsafe { c_str(F, "url", url) } {
            Ok(u) => u,
            Err(st) => return st,
        };
        unsafe { write_str(F, &quotalease::redact_url(url), buf, cap, needed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn redacted(url: &CStr) -> (lease_status, String, usize) {
        let mut buf = [0 as c_char; 128];
        let mut needed = 0;
        let s = unsafe { lease_redact_url(url.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut needed) };
        let out = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        (s, out, needed)
    }

    #[test]
    fn urls_come_back_redacted() {
        let (s, out, needed) = redacted(c"redis://alice:s3cret-pw-XYZ@h:6379/0");
        assert_eq!((s, out.as_str(), needed), (LEASE_OK, "redis://***@h:6379/0", 21));
        assert_eq!(redacted(c"redis://h:1").1, "redis://h:1");
        assert_eq!(redacted(c"a\xffb").0, LEASE_ERR_UTF8);
        let mut needed = 0;
        let s = unsafe { lease_redact_url(c"redis://:pw@h".as_ptr(), std::ptr::null_mut(), 0, &mut needed) };
        assert_eq!((s, needed), (LEASE_ERR_BUFFER_TOO_SMALL, 14));
        let s = unsafe { lease_redact_url(std::ptr::null(), std::ptr::null_mut(), 0, &mut needed) };
        assert_eq!(s, LEASE_ERR_NULL);
    }
}
