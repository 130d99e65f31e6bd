//! # quotalease
//!
//! A rate limiter whose limit holds across every instance of a service.
//! Each process keeps a **local lease** of tokens per key and admits requests
//! from it with no network call; a **broker** on an internal tokio runtime
//! borrows chunks of tokens from one **authoritative token bucket** per key
//! (Redis through one atomic Lua script per lease, or the embedded in-memory
//! authority), prefetches below a threshold, gives idle tokens back, and
//! applies an explicit policy when the backend is unreachable.
//!
//! ```
//! use quotalease::Limiter;
//! let limiter = Limiter::builder().limit(100).window_ms(60_000).build()?;
//! let d = limiter.acquire("user:42", 1)?;
//! assert!(d.allowed);
//! # Ok::<(), quotalease::Error>(())
//! ```
//!
//! The overshoot bound: over any interval, admitted ≤ the token-bucket
//! allowance + Σ tokens leased and unspent at its start ≤ allowance +
//! instances × lease_size.
#![warn(missing_docs)]

/// The project README's Rust code blocks, compiled and run as doctests
/// (`cargo test -p quotalease --doc`), so its quick start cannot rot. Its
/// other blocks are labelled with their language, which rustdoc skips.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

mod authority;
mod broker;
mod bucket;
mod builder;
mod calendar;
mod circuit;
mod clock;
mod config;
mod decision;
mod engine;
mod error;
mod events;
mod fork;
mod guard;
mod inspection;
mod keys;
mod ledger;
mod limiter;
mod metrics;
mod option_names;
mod options;
mod permit;
mod policy;
mod rate;
mod redact;
mod reservation;
mod stored;
mod url;
mod wire;

pub use bucket::Quota;
pub use builder::Builder;
pub use calendar::{Bounds, Calendar, CalendarSpec, Period};
pub use config::{default_lease_size, Budget, ClockKind, Config, FailurePolicy, Mode};
pub use decision::{Decision, Reason};
pub use error::{Error, ErrorKind, Result};
pub use events::{Event, EventKind, Listener};
pub use keys::{http_key, validate_key, MAX_KEY_LEN};
pub use limiter::{metrics_prometheus, Inspection, Limiter, PolicyListing};
pub use metrics::{prometheus_text, Metrics};
pub use options::{OptionValue, Options, MANUAL_CLOCK_START_MS, OPTION_NAMES};
pub use permit::Permit;
pub use policy::{Assignment, Origin, PolicySource, RuleSet, Rules, Tier};
pub use rate::{parse_quota, parse_rate, validate_policy};
pub use redact::{redact_secrets, redact_url, RedactedUrl};
pub use reservation::Reservation;

/// What the workspace's own crates (the CLI, the bindings, the benchmarks
/// and tests) reach inside the engine: the stored format, bucket math, the
/// ledger's tuning table. Not part of the API: any release may change it.
#[doc(hidden)]
pub mod internals {
    pub use crate::authority::{policy_base, redis_key};
    pub use crate::broker::{connections_open, longest_sweep_gap_ms};
    pub use crate::bucket::BucketState;
    pub use crate::ledger::{Tuning, TUNING};
    pub use crate::policy::{MAX_RULES, RULE_SEPARATOR};
    /// Every option's default, to show them (the C ABI's `lease_config_init`).
    /// A configuration is made through `Options` or `Builder`, not from this.
    pub fn default_config() -> crate::Config {
        crate::Config::defaults()
    }
    /// The codec of what the Redis authority stores for a key: the one Rust
    /// reader of the stored format.
    pub mod stored {
        pub use crate::stored::*;
    }
}

/// Tools for testing code that uses a limiter: outages, restarts and
/// rollbacks of a `memory://NAME` authority, on demand. Behind the
/// `test-util` feature (`quotalease = { version = "...", features =
/// ["test-util"] }` in `[dev-dependencies]`).
#[cfg(feature = "test-util")]
pub mod testing {
    /// Make the `memory://NAME` authority unreachable (`down = true`) or
    /// reachable again, as if its Redis had gone away: every limiter using it
    /// then applies its failure policy, deterministically (with manual
    /// clocks). Returns false when no limiter has that authority open.
    pub fn memory_outage(name: &str, down: bool) -> bool {
        crate::authority::MemoryAuthority::set_down(name, down)
    }

    /// Make the `memory://NAME` authority carry out every call and lose its
    /// reply (`mute = true`), as a Redis whose answers time out would: each
    /// call fails as silence (a timeout) after its state changed. Returns
    /// false when no limiter has that authority open.
    pub fn memory_lose_replies(name: &str, mute: bool) -> bool {
        crate::authority::MemoryAuthority::set_mute(name, mute)
    }

    /// Make the `memory://NAME` authority forget every key, as a Redis
    /// restarted empty would (the failover guard's tests). False when no
    /// limiter has that authority open.
    pub fn memory_reset(name: &str) -> bool {
        crate::authority::MemoryAuthority::reset(name)
    }

    /// Every key's state of the `memory://NAME` authority now, to put back
    /// with [`memory_restore`]: a replica that missed the writes since, promoted.
    pub fn memory_snapshot(name: &str) -> Option<MemorySnapshot> {
        crate::authority::MemoryAuthority::snapshot(name)
    }

    /// Put a [`memory_snapshot`] back. False when no limiter has that authority open.
    pub fn memory_restore(name: &str, snapshot: &MemorySnapshot) -> bool {
        crate::authority::MemoryAuthority::restore(name, snapshot)
    }

    /// Jump the clock of `limiter`'s authority by `ms` (back when negative):
    /// every later call tells the authority a time that far from the
    /// limiter's own, as a Redis whose `TIME` stepped would (jump every
    /// limiter of a fleet alike). The limiter's own clock does not move.
    /// Needs a manual clock (with one, calls carry the caller's time).
    pub fn jump_authority_clock(limiter: &crate::Limiter, ms: i64) -> crate::Result<()> {
        limiter.jump_authority_clock(ms)
    }

    pub use crate::authority::memory::Snapshot as MemorySnapshot;
}

/// The crate version, as in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
