//! The opaque `lease_limiter` and every call on it.

use std::ffi::{c_char, c_void};

use quotalease::Limiter;

use crate::config::{lease_config, to_config};
use crate::decision::lease_decision;
use crate::error::{fail, fail_with, key_str, lease_status, lease_status::*, null_arg, status, write_str};
use crate::events::{self, lease_event_callback, SharedSink};
use crate::inspection::lease_inspection;
use crate::metrics::lease_metrics;
use crate::options::lease_options;

/// A distributed rate limiter (opaque). Create it with `lease_limiter_new`
/// or `lease_limiter_new_from_options`, release it with `lease_limiter_free`.
///
/// Thread safety: every function taking a `lease_limiter*` may be called
/// from many threads at once on the same limiter, except `lease_limiter_free`,
/// which must be the last call on it (no call may run or start during or
/// after it).
pub struct lease_limiter {
    pub(crate) limiter: Limiter,
    events: SharedSink,
}

/// Validate `config` and create a limiter in `*out` (NULL on failure).
/// Nothing starts until the first call: no thread, no connection; a Redis
/// URL is checked for syntax here and reached on first use.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_CONFIG` (the message names the
/// option and what would be accepted), `LEASE_ERR_UTF8`.
///
/// # Safety
/// `config` is NULL or a readable `lease_config` (from `lease_config_init`)
/// whose strings are NULL or NUL-terminated; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_limiter_new(config: *const lease_config, out: *mut *mut lease_limiter) -> lease_status {
    ffi_boundary! {
        let out = arg_mut!("lease_limiter_new", out);
        *out = std::ptr::null_mut();
        if config.is_null() {
            return null_arg("lease_limiter_new", "config");
        }
        let cfg = match unsafe { to_config("lease_limiter_new", config) } {
            Ok(c) => c,
            Err(st) => return st,
        };
        match Limiter::new(cfg) {
            Ok(l) => *out = into_handle(l),
            Err(e) => return fail_with("lease_limiter_new", &e),
        }
        LEASE_OK
    }
}

/// Create a limiter from options set by name (see `lease_options`) in `*out`
/// (NULL on failure). The rules between options are checked here: `rate`
/// together with `limit` or `window_ms`, or `clock_start_ms` without
/// `clock` = "manual", is `LEASE_ERR_CONFIG`; the manual clock starts at
/// 1000000 ms unless `clock_start_ms` is set (as in every language). Then
/// every value is validated as by `lease_limiter_new`.
///
/// The options are only read: build as many limiters from them as you like,
/// and free them whenever you are done.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_CONFIG` (the message names the
/// option and what would be accepted).
///
/// # Safety
/// `options` is NULL or live (from `lease_options_new`); `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lease_limiter_new_from_options(
    options: *const lease_options,
    out: *mut *mut lease_limiter,
) -> lease_status {
    ffi_boundary! {
        let out = arg_mut!("lease_limiter_new_from_options", out);
        *out = std::ptr::null_mut();
        let o = arg_ref!("lease_limiter_new_from_options", options);
        match Limiter::from_options(o.options.clone()) {
            Ok(l) => *out = into_handle(l),
            Err(e) => return fail_with("lease_limiter_new_from_options", &e),
        }
        LEASE_OK
    }
}

/// The C handle of a new limiter, its event sink registered.
fn into_handle(limiter: Limiter) -> *mut lease_limiter {
    // C has no logging bridge: one stderr line per backend transition,
    // unless QUOTALEASE_STDERR_LOG=0 (written before the callback runs).
    limiter.log_events_to_stderr();
    let sink = events::new_sink();
    let s = sink.clone();
    limiter.on_event(move |e| events::deliver(&s, e));
    Box::into_raw(Box::new(lease_limiter { limiter, events: sink }))
}

/// Release a limiter. NULL is a no-op. It does not give leased tokens back
/// (call `lease_close` first for a graceful shutdown; otherwise the lease
/// TTL and the authority's refill recover them). Once it returns, the event
/// callback is not running and will not be called again.
///
/// # Safety
/// `limiter` is NULL or came from `lease_limiter_new` (or
/// `lease_limiter_new_from_options`) and was not freed; no
/// other call on it may run during or after this one.
#[no_mangle]
pub unsafe extern "C" fn lease_limiter_free(limiter: *mut lease_limiter) {
    ffi_boundary! {
        if limiter.is_null() {
            return;
        }
        let l = unsafe { Box::from_raw(limiter) };
        events::set(&l.events, None, std::ptr::null_mut());
        drop(l);
    }
}

/// How an acquire call may wait.
#[derive(Clone, Copy)]
enum How {
    /// `lease_acquire`: for a lease request, at most `backend_timeout_ms`.
    Acquire,
    /// `lease_try_acquire`: never.
    Try,
    /// `lease_acquire_wait`: for tokens, up to this long.
    Wait(std::time::Duration),
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn acquire_impl(
    fname: &str,
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    tier: Option<&str>,
    out: *mut lease_decision,
    how: How,
) -> lease_status {
    let Some(l) = (unsafe { limiter.as_ref() }) else {
        return null_arg(fname, "limiter");
    };
    if out.is_null() {
        return null_arg(fname, "out");
    }
    let key = match unsafe { key_str(fname, key, key_len) } {
        Ok(k) => k,
        Err(st) => return st,
    };
    // No tier named: the engine's calls compiled with the tier known to be
    // none (its admit path folds the tier check away).
    // SAFETY (each `out.write`): `out` is not NULL (checked) and writable
    // (the caller's contract). The decision is read in place, not moved out
    // (`Limiter::decide`).
    let put = |d: &_| unsafe { out.write(lease_decision::from(d)) };
    let r = match (how, tier) {
        (How::Acquire, None) => l.limiter.decide(key, cost, None, true, put),
        (How::Acquire, Some(_)) => l.limiter.decide(key, cost, tier, true, put),
        (How::Try, None) => l.limiter.decide(key, cost, None, false, put),
        (How::Try, Some(_)) => l.limiter.decide(key, cost, tier, false, put),
        (How::Wait(wait), _) => l.limiter.acquire_wait(key, cost, tier, wait).map(|d| put(&d)),
    };
    match r {
        Ok(()) => LEASE_OK,
        Err(e) => fail_with(fname, &e),
    }
}

/// The tier a call names: `tier_len` bytes of UTF-8 at `tier`; NULL with
/// length 0 names none. Text that is not UTF-8 cannot name a tier: a
/// configuration error, as an unknown tier is.
///
/// # Safety
/// `tier` is NULL or has `tier_len` readable bytes.
/// `acquire_impl` for the `_tier` calls: the tier read first (`tier_str`).
///
/// # Safety
/// As for `acquire_impl`; `tier` is NULL or has `tier_len` readable bytes.
#[allow(clippy::too_many_arguments)]
unsafe fn acquire_tier_impl(
    fname: &str,
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    tier: *const u8,
    tier_len: usize,
    out: *mut lease_decision,
    how: How,
) -> lease_status {
    match unsafe { tier_str(fname, tier, tier_len) } {
        Ok(tier) => unsafe { acquire_impl(fname, limiter, key, key_len, cost, tier, out, how) },
        Err(st) => st,
    }
}

pub(crate) unsafe fn tier_str<'a>(
    fname: &str,
    tier: *const u8,
    tier_len: usize,
) -> Result<Option<&'a str>, lease_status> {
    if tier.is_null() {
        return if tier_len == 0 {
            Ok(None)
        } else {
            Err(null_arg(fname, "tier"))
        };
    }
    if tier_len > isize::MAX as usize {
        return Err(fail(
            LEASE_ERR_CONFIG,
            format!("{fname}: tier_len {tier_len} is not a length"),
        ));
    }
    let bytes = unsafe { std::slice::from_raw_parts(tier, tier_len) };
    match std::str::from_utf8(bytes) {
        Ok(t) => Ok(Some(t)),
        Err(e) => Err(fail(
            LEASE_ERR_CONFIG,
            format!("{fname}: invalid configuration: `tier` is not valid UTF-8 ({e}); tier names are letters, digits, '_', '-' or '.'"),
        )),
    }
}

/// Take `cost` tokens for `key` and write the decision to `*out`. A denial is
/// `LEASE_OK` with `out->allowed == false`; only bad input, a closed
/// limiter or a backend that refuses the configuration is an error.
///
/// The key is `key_len` bytes of UTF-8 at `key` (no NUL needed), 1 to 512
/// bytes. With local tokens this is a map lookup and an atomic update;
/// otherwise it waits for a lease request (at most `backend_timeout_ms`) or
/// applies the failure policy.
///
/// Errors: `LEASE_ERR_NULL` (limiter, out, or key with `key_len > 0`),
/// `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`, `LEASE_ERR_INVALID_COST`
/// (0 or above the key's limit), `LEASE_ERR_CLOSED`,
/// `LEASE_ERR_MISCONFIGURED` (the backend is reachable but refuses the URL:
/// see `lease_limiter_check`; an outage is not an error). `*out` is written
/// only on `LEASE_OK`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_acquire(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    out: *mut lease_decision,
) -> lease_status {
    ffi_boundary! {
        unsafe { acquire_impl("lease_acquire", limiter, key, key_len, cost, None, out, How::Acquire) }
    }
}

/// Like `lease_acquire` but never waits: with no local tokens and a lease
/// request needed, it starts one and denies with reason `LEASE_REASON_PENDING`.
///
/// # Safety
/// As for `lease_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lease_try_acquire(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    out: *mut lease_decision,
) -> lease_status {
    ffi_boundary! {
        unsafe { acquire_impl("lease_try_acquire", limiter, key, key_len, cost, None, out, How::Try) }
    }
}

/// `lease_acquire` for a key in plan tier `tier` (`tier_len` bytes of
/// UTF-8, no NUL needed; NULL with `tier_len` 0 names no tier, exactly as
/// `lease_acquire`): the key is held to the tier's rules, unless it has its
/// own entry in the policy store or file, or a `lease_set_limit` override,
/// which win whatever tier is named. With no tier named, the `default_tier`
/// option applies (else `limit` / `window_ms`). Tiers come from the options
/// `tiers` ("free=100/min; pro=6000/min, 1000000/day"), the policy file and
/// the shared store (`lease_policy_set_tier`).
///
/// A key with several rules is admitted only when every rule admits; tokens
/// the others took are given back when one denies. `out->rule` is the
/// binding rule, `out->rule_count` and the rule arrays list every rule.
///
/// Errors: as `lease_acquire`, and `LEASE_ERR_CONFIG` for a tier that no
/// option, file or store defines (the message names it and the known ones),
/// or one that is not UTF-8; `LEASE_ERR_NULL` for a NULL `tier` with
/// `tier_len > 0`.
///
/// # Safety
/// As for `lease_acquire`; `tier` is NULL or has `tier_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn lease_acquire_tier(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    tier: *const u8,
    tier_len: usize,
    out: *mut lease_decision,
) -> lease_status {
    ffi_boundary! {
        unsafe { acquire_tier_impl("lease_acquire_tier", limiter, key, key_len, cost, tier, tier_len, out, How::Acquire) }
    }
}

/// `lease_try_acquire` for a key in plan tier `tier`: never waits (see
/// `lease_acquire_tier` for the tier).
///
/// # Safety
/// As for `lease_acquire_tier`.
#[no_mangle]
pub unsafe extern "C" fn lease_try_acquire_tier(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    tier: *const u8,
    tier_len: usize,
    out: *mut lease_decision,
) -> lease_status {
    ffi_boundary! {
        unsafe { acquire_tier_impl("lease_try_acquire_tier", limiter, key, key_len, cost, tier, tier_len, out, How::Try) }
    }
}

/// `lease_acquire_tier` (`tier` NULL with `tier_len` 0: no tier), waiting up
/// to `wait_ms` for the tokens instead of denying: from the local lease, a
/// rate grant or the bucket's refill, in arrival order among this process's
/// waiters of the key. A denial whose `retry_after_ms` falls past the
/// deadline is returned at once; a deny entry (`LEASE_REASON_BLOCKED`) is
/// never waited on. Each request counts once in the metrics however often
/// it was denied while waiting. Blocks the calling thread.
///
/// Errors: as `lease_acquire_tier`.
///
/// # Safety
/// As for `lease_acquire_tier`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lease_acquire_wait(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    cost: u64,
    tier: *const u8,
    tier_len: usize,
    wait_ms: u64,
    out: *mut lease_decision,
) -> lease_status {
    ffi_boundary! {
        let how = How::Wait(std::time::Duration::from_millis(wait_ms));
        unsafe { acquire_tier_impl("lease_acquire_wait", limiter, key, key_len, cost, tier, tier_len, out, how) }
    }
}

/// How many requests of `key` wait in `lease_acquire_wait` in this process
/// now, into `*out`.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_UTF8`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_waiters(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    out: *mut u64,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_waiters";
        let Some(l) = (unsafe { limiter.as_ref() }) else {
            return null_arg(F, "limiter");
        };
        if out.is_null() {
            return null_arg(F, "out");
        }
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        unsafe { out.write(l.limiter.waiters(key) as u64) };
        LEASE_OK
    }
}

/// Override the policy of one key: `limit` tokens per `window_ms`. Takes
/// effect at once: under a lower limit the key's local tokens go back and
/// the authority clamps its stored tokens to the new capacity.
///
/// Errors: `LEASE_ERR_NULL`, `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`,
/// `LEASE_ERR_CONFIG` (limit or window 0, or their product above 2^52),
/// `LEASE_ERR_CLOSED`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn lease_set_limit(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    limit: u64,
    window_ms: u64,
) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_set_limit", limiter);
        let key = match unsafe { key_str("lease_set_limit", key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        status("lease_set_limit", l.limiter.set_limit(key, limit, window_ms))
    }
}

/// What the limiter and the authority know about `key` ("why was this
/// denied?"), written to `*out`: the key's policy, the authoritative
/// bucket, what this limiter holds, its counts and, with adaptive leasing,
/// the rate it spends, the key's live holders, its fallback rate and its
/// demand (see `struct lease_inspection`). It reads the authority without
/// changing it: one round trip with Redis, so it may block (at most
/// 5 x max(`backend_timeout_ms`, 1000) ms). For diagnostics, not for every
/// request.
///
/// The key is as for `lease_acquire`: `key_len` bytes of UTF-8 at `key`, 1 to
/// 512 bytes. A key this limiter has never seen is `LEASE_OK` with zero
/// local figures (and, with no bucket stored, `has_authority_tokens ==
/// false`).
///
/// Errors: `LEASE_ERR_NULL` (limiter, out, or key with `key_len > 0`),
/// `LEASE_ERR_INVALID_KEY`, `LEASE_ERR_UTF8`, `LEASE_ERR_CLOSED`,
/// `LEASE_ERR_BACKEND` (the authority did not answer),
/// `LEASE_ERR_MISCONFIGURED` (it refuses the configuration). `*out` is
/// written only on `LEASE_OK`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or has `key_len` readable
/// bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_inspect(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    out: *mut lease_inspection,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_inspect";
        let l = arg_ref!("lease_inspect", limiter);
        if out.is_null() {
            return null_arg(F, "out");
        }
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        match l.limiter.inspect(key) {
            Ok(i) => {
                unsafe { out.write(i.into()) };
                LEASE_OK
            }
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Write a snapshot of the limiter's counters to `*out` (also after `lease_close`).
///
/// # Safety
/// `limiter` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_metrics(limiter: *const lease_limiter, out: *mut lease_metrics) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_metrics", limiter);
        let out = arg_mut!("lease_metrics", out);
        *out = l.limiter.metrics().into();
        LEASE_OK
    }
}

/// Write the counters in Prometheus text format (names prefixed
/// `quotalease_`) into `buf`, NUL-terminated.
///
/// `*needed` (when `needed` is not NULL) receives the size the text needs,
/// NUL included. When `cap` is smaller, `buf` gets "" (if `cap > 0`) and the
/// call returns `LEASE_ERR_BUFFER_TOO_SMALL`: call again with a buffer of at
/// least `*needed` bytes (counters grow, so allow some slack, e.g. 4096
/// bytes). `buf = NULL, cap = 0` asks for the size only.
///
/// # Safety
/// `limiter` is NULL or live; `buf` is NULL or has `cap` writable bytes;
/// `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_metrics_prometheus(
    limiter: *const lease_limiter,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_metrics_prometheus", limiter);
        let text = l.limiter.metrics_prometheus();
        unsafe { write_str("lease_metrics_prometheus", &text, buf, cap, needed) }
    }
}

/// Labels of `n` names and values (NUL-terminated UTF-8 each).
unsafe fn labels_of<'a>(
    fname: &str,
    names: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> Result<Vec<(&'a str, &'a str)>, lease_status> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if names.is_null() {
        return Err(null_arg(fname, "label_names"));
    }
    if values.is_null() {
        return Err(null_arg(fname, "label_values"));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller promised `n` readable pointers in each array.
        let (name, value) = unsafe { (*names.add(i), *values.add(i)) };
        let name = unsafe { crate::error::c_str(fname, "label_names[i]", name)? };
        let value = unsafe { crate::error::c_str(fname, "label_values[i]", value)? };
        out.push((name, value));
    }
    Ok(out)
}

/// `lease_metrics_prometheus` with `n_labels` labels on every sample:
/// `label_names[i]` = `label_values[i]` (e.g. `limiter` = `api` gives
/// `quotalease_admitted_total{limiter="api"} 7`). Names follow the
/// Prometheus data model (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__`-prefixed, each
/// once; else `LEASE_ERR_CONFIG`); values are escaped. Several limiters in
/// one exposition: `lease_metrics_prometheus_many`.
///
/// # Safety
/// As for `lease_metrics_prometheus`; `label_names` and `label_values` are
/// NULL (with `n_labels` 0) or hold `n_labels` NUL-terminated strings each.
#[no_mangle]
pub unsafe extern "C" fn lease_metrics_prometheus_labeled(
    limiter: *const lease_limiter,
    label_names: *const *const c_char,
    label_values: *const *const c_char,
    n_labels: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_metrics_prometheus_labeled";
        let l = arg_ref!("lease_metrics_prometheus_labeled", limiter);
        let labels = match unsafe { labels_of(F, label_names, label_values, n_labels) } {
            Ok(v) => v,
            Err(st) => return st,
        };
        match l.limiter.metrics_prometheus_with(&labels) {
            Ok(text) => unsafe { write_str(F, &text, buf, cap, needed) },
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Several limiters' counters in ONE Prometheus exposition: every family's
/// `# HELP` and `# TYPE` once, then one sample per limiter (concatenating
/// the limiters' own texts repeats the families, which Prometheus rejects).
/// Limiter `i` gets the labels `label_names[j]` = `label_values[i *
/// n_labels + j]` for `j < n_labels` (every limiter has the same label
/// names; the values tell them apart). `LEASE_ERR_CONFIG` for an invalid or
/// repeated label name, or two limiters with the same values. The buffer
/// contract is `lease_metrics_prometheus`'s.
///
/// # Safety
/// `limiters` holds `n_limiters` live limiters; `label_names` holds
/// `n_labels` and `label_values` `n_limiters * n_labels` NUL-terminated
/// strings (both NULL when `n_labels` is 0); `buf`, `needed` as for
/// `lease_metrics_prometheus`.
#[no_mangle]
pub unsafe extern "C" fn lease_metrics_prometheus_many(
    limiters: *const *const lease_limiter,
    n_limiters: usize,
    label_names: *const *const c_char,
    n_labels: usize,
    label_values: *const *const c_char,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_metrics_prometheus_many";
        if limiters.is_null() && n_limiters > 0 {
            return null_arg(F, "limiters");
        }
        if n_labels > 0 && label_values.is_null() {
            return null_arg(F, "label_values");
        }
        let mut sets = Vec::with_capacity(n_limiters);
        for i in 0..n_limiters {
            // SAFETY: the caller promised `n_limiters` pointers.
            let Some(l) = (unsafe { (*limiters.add(i)).as_ref() }) else {
                return null_arg(F, "limiters[i]");
            };
            let values = if n_labels == 0 { std::ptr::null() } else { unsafe { label_values.add(i * n_labels) } };
            let labels = match unsafe { labels_of(F, label_names, values, n_labels) } {
                Ok(v) => v,
                Err(st) => return st,
            };
            sets.push((l, labels));
        }
        let pairs: Vec<(&Limiter, &[(&str, &str)])> = sets.iter().map(|(l, v)| (&l.limiter, v.as_slice())).collect();
        match quotalease::metrics_prometheus(&pairs) {
            Ok(text) => unsafe { write_str(F, &text, buf, cap, needed) },
            Err(e) => fail_with(F, &e),
        }
    }
}

/// A startup probe: connect to the backend now and run a script that reads
/// (never writes) one key under the limiter's prefix, the path every lease
/// takes. `LEASE_OK` when leases can be taken; `LEASE_ERR_MISCONFIGURED`
/// when the backend refuses the configuration (wrong password, database,
/// scheme, protocol, ACL); `LEASE_ERR_BACKEND` when it cannot be reached
/// (connecting, then the server's silence, are each bounded by
/// `backend_timeout_ms`). Always `LEASE_OK` on `memory://`. Creating a
/// limiter never connects, so call this where the service decides it is
/// ready. It changes nothing (no circuit, no tokens). Errors also:
/// `LEASE_ERR_NULL`, `LEASE_ERR_CLOSED`.
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_limiter_check(limiter: *const lease_limiter) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_limiter_check", limiter);
        status("lease_limiter_check", l.limiter.check())
    }
}

/// Give every leased token back now and wait for the authority to take them
/// (graceful shutdown). Errors: `LEASE_ERR_NULL`, `LEASE_ERR_CLOSED`,
/// `LEASE_ERR_BACKEND`.
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_flush(limiter: *const lease_limiter) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_flush", limiter);
        status("lease_flush", l.limiter.flush())
    }
}

/// Flush, then stop the limiter's broker. Every later call on it returns
/// `LEASE_ERR_CLOSED` (except `lease_metrics*`, `lease_close` and
/// `lease_limiter_free`). Idempotent. The handle stays valid until
/// `lease_limiter_free`. Errors: `LEASE_ERR_NULL`, `LEASE_ERR_BACKEND` (the
/// flush failed; the limiter is closed anyway).
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_close(limiter: *const lease_limiter) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_close", limiter);
        status("lease_close", l.limiter.close())
    }
}

/// Register `callback` for backend transitions (degraded / recovered),
/// replacing any earlier one; NULL unregisters. The callback runs on the
/// limiter's internal broker thread, with `user` as given here, and must not
/// block for long nor call `lease_set_event_callback` or
/// `lease_limiter_free` on this limiter. Once this function returns, the
/// previous callback is not running and will not be called again.
/// Transitions are also counted in `lease_metrics` (`fallback_transitions`).
///
/// # Safety
/// `limiter` is NULL or live; `callback` and `user` stay valid, and usable
/// from another thread, until replaced or until `lease_limiter_free`.
#[no_mangle]
pub unsafe extern "C" fn lease_set_event_callback(
    limiter: *const lease_limiter,
    callback: lease_event_callback,
    user: *mut c_void,
) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_set_event_callback", limiter);
        events::set(&l.events, callback, user);
        LEASE_OK
    }
}

/// For deterministic tests, with `clock = LEASE_CLOCK_MANUAL`: move the
/// limiter's clock forward by `ms`. `LEASE_ERR_CONFIG` with the system clock.
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_advance_clock(limiter: *const lease_limiter, ms: u64) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_advance_clock", limiter);
        status("lease_advance_clock", l.limiter.advance_clock(ms))
    }
}

/// For deterministic tests: run lease-TTL maintenance now, then wait until no
/// lease or give-back request is in flight (at most 10 s).
///
/// # Safety
/// `limiter` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lease_settle(limiter: *const lease_limiter) -> lease_status {
    ffi_boundary! {
        let l = arg_ref!("lease_settle", limiter);
        status("lease_settle", l.limiter.settle())
    }
}
