//! Reserve, then settle: `lease_reserve`, `lease_reservation_settle`,
//! `lease_reservation_free`.

use quotalease::Reservation;

use crate::decision::lease_decision;
use crate::error::{fail_with, key_str, lease_status, lease_status::*, null_arg};
use crate::limiter::{lease_limiter, tier_str};

/// A reservation (opaque): a request admitted (or denied) at an estimate
/// of its cost, to be settled once at its actual cost. Made by
/// `lease_reserve`, released by `lease_reservation_free`.
pub struct lease_reservation {
    inner: Reservation,
}

/// Reserve `estimate` tokens of `key` (in plan tier `tier`; NULL with
/// `tier_len` 0 names none) for a request whose cost is known only after
/// it ran (an LLM response's tokens, bytes streamed): decided as
/// `lease_acquire_tier` decides on `estimate`, the decision written to
/// `*out`, and a reservation handle to `*reservation` (also for a denial;
/// free every handle with `lease_reservation_free`). Settle it once with
/// `lease_reservation_settle` at the actual cost; freed unsettled, it keeps
/// the estimate.
///
/// Errors: as `lease_acquire_tier` (`LEASE_ERR_INVALID_COST` for an
/// estimate of 0 or above the key's limit); `LEASE_ERR_NULL` for a NULL
/// `reservation`. `*out` and `*reservation` are written only on `LEASE_OK`.
///
/// # Safety
/// As for `lease_acquire_tier`; `reservation` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lease_reserve(
    limiter: *const lease_limiter,
    key: *const u8,
    key_len: usize,
    estimate: u64,
    tier: *const u8,
    tier_len: usize,
    out: *mut lease_decision,
    reservation: *mut *mut lease_reservation,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_reserve";
        let Some(l) = (unsafe { limiter.as_ref() }) else {
            return null_arg(F, "limiter");
        };
        if out.is_null() {
            return null_arg(F, "out");
        }
        if reservation.is_null() {
            return null_arg(F, "reservation");
        }
        let key = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        let tier = match unsafe { tier_str(F, tier, tier_len) } {
            Ok(t) => t,
            Err(st) => return st,
        };
        match l.limiter.reserve(key, estimate, tier) {
            Ok(r) => {
                unsafe { out.write(r.decision().into()) };
                let handle = Box::into_raw(Box::new(lease_reservation { inner: r }));
                unsafe { reservation.write(handle) };
                LEASE_OK
            }
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Settle `reservation` at `actual` tokens (0 when the request used
/// nothing): below the estimate the rest goes back, above it the
/// difference is taken even into debt (later requests of the key wait
/// until the refill has paid it). Once only.
///
/// Errors: `LEASE_ERR_NULL`; `LEASE_ERR_RESERVATION` when it was settled
/// already, was denied (nothing was reserved), or `actual` is negative;
/// `LEASE_ERR_CLOSED` when its limiter was closed (the estimate stands).
///
/// # Safety
/// `reservation` is NULL or came from `lease_reserve` and was not freed.
#[no_mangle]
pub unsafe extern "C" fn lease_reservation_settle(reservation: *const lease_reservation, actual: i64) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_reservation_settle";
        let Some(r) = (unsafe { reservation.as_ref() }) else {
            return null_arg(F, "reservation");
        };
        let Ok(actual) = u64::try_from(actual) else {
            return fail_with(F, &Reservation::negative_actual(actual.into()));
        };
        match r.inner.settle(actual) {
            Ok(()) => LEASE_OK,
            Err(e) => fail_with(F, &e),
        }
    }
}

/// Release a reservation. NULL is a no-op. Unsettled, it keeps its
/// estimate (the tokens stay spent).
///
/// # Safety
/// `reservation` is NULL or came from `lease_reserve` and was not freed;
/// no other call on it may run during or after this one.
#[no_mangle]
pub unsafe extern "C" fn lease_reservation_free(reservation: *mut lease_reservation) {
    ffi_boundary! {
        if !reservation.is_null() {
            drop(unsafe { Box::from_raw(reservation) });
        }
    }
}
