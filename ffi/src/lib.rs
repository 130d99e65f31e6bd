//! # liblease: the C ABI of quotalease
//!
//! Built as `liblease.so` / `liblease.a`; the header `include/lease.h` is
//! generated from this crate by a pinned cbindgen (`scripts/check-header.sh`).
//! rustls-ffi is the model:
//!
//! - opaque handles `lease_limiter` and `lease_options`, names
//!   `lease_<thing>_<verb>`, and every allocation has its free
//!   (`lease_limiter_free(NULL)` is a no-op);
//! - every function returns a [`lease_status`] with fixed numbers that are
//!   never reused, and writes results through out-params;
//! - every pointer is NULL-checked (a NULL is `LEASE_ERR_NULL`, never a crash);
//! - every exported body runs inside one panic boundary (`ffi_boundary!`),
//!   so no panic crosses into C (it becomes `LEASE_ERR_PANIC`);
//! - the message of the last failure on the calling thread is
//!   [`lease_last_error`].
//!
//! Enumerations that C code passes *in* (mode, failure policy, clock) are
//! `uint32_t` typedefs with named constants rather than C enums, because
//! reading an out-of-range C enum into a Rust enum is undefined behaviour; an
//! unknown value is a clear `LEASE_ERR_CONFIG` instead.
//!
//! The ABI only translates: option names and the rules between options
//! ([`quotalease::Options`]), reason and error-kind names, and the
//! middleware key rule ([`quotalease::http_key`]) all come from the core.
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

/// Runs an exported function's body inside the panic boundary: a panic
/// becomes `LEASE_ERR_PANIC` (or NULL / nothing, by return type) plus a
/// message in `lease_last_error()`. `return` inside the body returns from
/// the exported function.
macro_rules! ffi_boundary {
    ($($body:tt)*) => {{
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(move || { $($body)* })) {
            Ok(r) => r,
            Err(payload) => $crate::error::Panicked::panicked(payload),
        }
    }};
}

/// Dereference a pointer argument or return `LEASE_ERR_NULL` naming it.
macro_rules! arg_ref {
    ($fname:literal, $p:ident) => {
        match unsafe { $p.as_ref() } {
            Some(r) => r,
            None => return $crate::error::null_arg($fname, stringify!($p)),
        }
    };
}

/// Mutable version of [`arg_ref!`] (for out-params).
macro_rules! arg_mut {
    ($fname:literal, $p:ident) => {
        match unsafe { $p.as_mut() } {
            Some(r) => r,
            None => return $crate::error::null_arg($fname, stringify!($p)),
        }
    };
}

mod config;
mod decision;
mod error;
mod events;
mod inspection;
mod keys;
mod limiter;
mod metrics;
mod options;
mod permit;
mod policy;
mod reservation;
mod version;

pub use config::*;
pub use decision::*;
pub use error::*;
pub use events::*;
pub use inspection::*;
pub use keys::*;
pub use limiter::*;
pub use metrics::*;
pub use options::*;
pub use policy::*;
pub use version::*;
