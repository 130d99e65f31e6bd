//! Concurrency limits, a permit per request in flight:
//! `lease_acquire_concurrent`, `lease_permit_release`, `lease_permit_free`.

use quotalease::Permit;

use crate::decision::lease_decision;
use crate::error::{fail_with, key_str, lease_status, lease_status::*, null_arg};
use crate::limiter::{lease_limiter, tier_str};

/// A permit (opaque): one request of a key in flight, counted against the
/// limiter's `concurrency` across the fleet until it is released (or
/// denied: then nothing was taken). Made by `lease_acquire_concurrent`,
/// released by `lease_permit_free`.
pub struct lease_permit {
    inner: Permit,
}

/// Take a permit for one request of `key` in flight: admitted while fewer
/// than the key's concurrency limit of its requests are in flight across
/// every limiter of the authority, denied otherwise. The limit is the
/// `"N concurrent"` of the key's rules (its own policy entry's, else its
/// assigned or default tier's), else the limiter's `concurrency` (an
/// option set by name with `lease_options_set_int`). The decision is
/// written to `*out` (`limit` is that limit, `remaining` the permits left;
/// a denial is `LEASE_REASON_EXHAUSTED` with `retry_after_ms`, when to ask
/// again) and a permit handle to `*permit` (also for a denial; free every
/// handle with `lease_permit_free`). Release an admitted permit with
/// `lease_permit_release` when the request ends; freed unreleased, it is
/// released then. May wait for one lease call (at most
/// `backend_timeout_ms`), as `lease_acquire` does.
///
/// At most that many permits of a key are held at once, plus those of
/// instances that died holding them, until their commitments expire at the
/// authority (7 s after such an instance's last call). A released permit
/// goes back to the authority at once, for any limiter to take.
///
/// Errors: `LEASE_ERR_NULL`; `LEASE_ERR_INVALID_KEY` / `LEASE_ERR_UTF8` for
/// a bad key; `LEASE_ERR_CONFIG` when the key has no concurrency limit (the
/// limiter's `concurrency` is 0, the default, and its rules set none);
/// `LEASE_ERR_CLOSED`. A limiter with `concurrency` needs adaptive leasing
/// (`mode` "lease" without `lease_size`): building one otherwise is
/// `LEASE_ERR_CONFIG`. `*out` and `*permit` are written only on `LEASE_OK`.
///
/// # Safety
/// `limiter` is NULL or live; `key` is NULL or readable for `key_len`
/// bytes; `out` and `permit` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_acquire_concurrent(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    out: *mut lease_decision,
    permit: *mut *mut lease_permit,
) -> lease_status {
    unsafe { acquire_concurrent("lease_acquire_concurrent", limiter, key, key_len, None, out, permit) }
}

/// `lease_acquire_concurrent` in plan tier `tier` (`tier_len` bytes of
/// UTF-8; NULL with `tier_len` 0 names none, as `lease_acquire_concurrent`):
/// the tier's `"N concurrent"` is the key's limit unless the key has a
/// policy entry of its own. Errors: as `lease_acquire_concurrent`, and
/// `LEASE_ERR_CONFIG` for an unknown tier or one that is not UTF-8,
/// `LEASE_ERR_NULL` for a NULL `tier` with a length.
///
/// # Safety
/// As for `lease_acquire_concurrent`; `tier` is NULL or readable for
/// `tier_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lease_acquire_concurrent_tier(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    tier: *const u8,
    tier_len: usize,
    out: *mut lease_decision,
    permit: *mut *mut lease_permit,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_acquire_concurrent_tier";
        let tier = match unsafe { tier_str(F, tier, tier_len) } {
            Ok(t) => t,
            Err(st) => return st,
        };
        unsafe { acquire_concurrent(F, limiter, key, key_len, tier, out, permit) }
    }
}

/// Both forms of `lease_acquire_concurrent`, `F` naming the caller's.
unsafe fn acquire_concurrent(
    f: &'static str,
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    tier: Option<&str>,
    out: *mut lease_decision,
    permit: *mut *mut lease_permit,
) -> lease_status {
    ffi_boundary! {
        let Some(l) = (unsafe { limiter.as_ref() }) else {
            return null_arg(f, "limiter");
        };
        if out.is_null() {
            return null_arg(f, "out");
        }
        if permit.is_null() {
            return null_arg(f, "permit");
        }
        let key = match unsafe { key_str(f, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        match l.limiter.acquire_concurrent(key, tier) {
            Ok(p) => {
                unsafe { out.write(p.decision().into()) };
                let handle = Box::into_raw(Box::new(lease_permit { inner: p }));
                unsafe { permit.write(handle) };
                LEASE_OK
            }
            Err(e) => fail_with(f, &e),
        }
    }
}

/// Release `permit`: its key may have one more request in flight. Once
/// only.
///
/// Errors: `LEASE_ERR_NULL`; `LEASE_ERR_RESERVATION` when it was released
/// already or was denied (no permit was taken); `LEASE_ERR_CLOSED` when its
/// limiter was closed.
///
/// # Safety
/// `permit` is NULL or came from `lease_acquire_concurrent` and was not freed.
#[no_mangle]
pub unsafe extern "C" fn lease_permit_release(permit: *const lease_permit) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_permit_release";
        let Some(p) = (unsafe { permit.as_ref() }) else {
            return null_arg(F, "permit");
        };
        match p.inner.release() {
            Ok(()) => LEASE_OK,
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Free a permit. NULL is a no-op. An admitted permit not yet released is
/// released now.
///
/// # Safety
/// `permit` is NULL or came from `lease_acquire_concurrent` and was not
/// freed; no other call on it may run during or after this one.
#[no_mangle]
pub unsafe extern "C" fn lease_permit_free(permit: *mut lease_permit) {
    ffi_boundary! {
        if !permit.is_null() {
            drop(unsafe { Box::from_raw(permit) });
        }
    }
}
