//! The name of every option, in a module of its own: [`crate::Error`]
//! lists them in its "did you mean" hint, and the error type must depend on
//! nothing above it (options, config). [`crate::options`] re-exports it.

/// Every option name, in the order the docs list them.
pub const OPTION_NAMES: &[&str] = &[
    "url",
    "limit",
    "window_ms",
    "rate",
    "concurrency",
    "lease_size",
    "overshoot_budget",
    "refill_threshold",
    "lease_ttl_ms",
    "on_backend_failure",
    "expected_replicas",
    "backend_timeout_ms",
    "key_prefix",
    "max_keys",
    "mode",
    "clock",
    "clock_start_ms",
    "tiers",
    "default_tier",
    "policy_file",
    "policy_refresh_ms",
    "shadow",
];
