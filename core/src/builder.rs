//! [`Builder`]: a [`Config`] set up in code, with the same rules as options
//! set by name (see [`crate::options`]).

use crate::config::{Budget, ClockKind, FailurePolicy, Mode};
use crate::error::{Error, Result};
use crate::limiter::Limiter;
use crate::options::{OptionValue, Options};

/// Builds a [`Limiter`]: typed setters over [`Options`], so a value set here
/// follows the same rules, and fails with the same error, as the option of
/// that name in every binding. The first invalid value is reported by
/// [`build`](Self::build).
#[derive(Clone, Debug, Default)]
pub struct Builder {
    options: Options,
    /// The first setter that failed.
    error: Option<Error>,
    #[cfg(feature = "test-util")]
    tuning: Option<crate::ledger::Tuning>,
}

macro_rules! setters {
    ($( $(#[$m:meta])* $name:ident : $ty:ty => |$v:ident| $value:expr ),+ $(,)?) => {
        $( $(#[$m])* pub fn $name(self, $v: $ty) -> Self { self.set(stringify!($name), $value) } )+
    };
}

impl Builder {
    fn set(mut self, name: &str, value: OptionValue<'_>) -> Self {
        if self.error.is_none() {
            if let Err(e) = self.options.set(name, value) {
                self.error = Some(e);
            }
        }
        self
    }

    setters! {
        /// Backend URL (default `memory://`).
        url: impl Into<String> => |v| OptionValue::Str(&Into::<String>::into(v)),
        /// Tokens per window (required, unless [`rate`](Self::rate) is given).
        limit: u64 => |v| OptionValue::Int(v.into()),
        /// Window in milliseconds (default 60 000).
        window_ms: u64 => |v| OptionValue::Int(v.into()),
        /// Limit and window from a rate such as `"600/min"`; giving `limit`
        /// or `window_ms` as well is an error.
        rate: &str => |v| OptionValue::Str(v),
        /// Requests of one key in flight at once, fleet-wide, for
        /// [`Limiter::acquire_concurrent`](crate::Limiter::acquire_concurrent) (default 0: none).
        concurrency: u64 => |v| OptionValue::Int(v.into()),
        /// Pins fixed leases of this many tokens (default unset: adaptive
        /// leasing under [`overshoot_budget`](Self::overshoot_budget)).
        lease_size: u64 => |v| OptionValue::Int(v.into()),
        /// The most tokens one instance leases ahead of its request under
        /// adaptive leasing (default [`Budget::Auto`]; a count or a share of
        /// the limit is a hard cap).
        overshoot_budget: Budget => |v| OptionValue::Str(&v.to_string()),
        /// Prefetch below this many local tokens (default lease_size / 4, at least 1).
        refill_threshold: u64 => |v| OptionValue::Int(v.into()),
        /// Give back leased tokens unused this long (default 2 000 ms).
        lease_ttl_ms: u64 => |v| OptionValue::Int(v.into()),
        /// Failure policy (default static share).
        on_backend_failure: FailurePolicy => |v| OptionValue::Str(v.as_str()),
        /// Instances sharing a key, for the static share (default 1).
        expected_replicas: u64 => |v| OptionValue::Int(v.into()),
        /// Backend round-trip bound (default 250 ms).
        backend_timeout_ms: u64 => |v| OptionValue::Int(v.into()),
        /// Redis key prefix (default `ql`).
        key_prefix: impl Into<String> => |v| OptionValue::Str(&Into::<String>::into(v)),
        /// Most keys tracked locally (default 100 000).
        max_keys: usize => |v| OptionValue::Int(v as i128),
        /// Coordination mode (default lease).
        mode: Mode => |v| OptionValue::Str(v.as_str()),
        /// The tier of keys whose callers name none (must be one of the tiers).
        default_tier: impl Into<String> => |v| OptionValue::Str(&Into::<String>::into(v)),
        /// A TOML file of tiers and per-key policies (docs/policies.md).
        policy_file: impl Into<String> => |v| OptionValue::Str(&Into::<String>::into(v)),
        /// How often the policy store and file are checked (default 0: no store, no poll; the file is read once).
        policy_refresh_ms: u64 => |v| OptionValue::Int(v.into()),
        /// Shadow mode: admit what the rules deny, counted in `shadow_denied` (default false).
        shadow: bool => |v| OptionValue::Bool(v),
    }

    /// Clock (default system; manual for deterministic tests).
    pub fn clock(self, clock: ClockKind) -> Self {
        match clock {
            ClockKind::System => self.set("clock", OptionValue::Str("system")),
            ClockKind::Manual { start_ms } => self
                .set("clock", OptionValue::Str("manual"))
                .set("clock_start_ms", OptionValue::Int(start_ms.into())),
        }
    }

    /// Define plan tier `name` with `rules` (`"6000/min, 1000000/day"`).
    pub fn tier(mut self, name: &str, rules: &str) -> Self {
        if self.error.is_none() {
            if let Err(e) = self.options.tier(name, rules) {
                self.error = Some(e);
            }
        }
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<Limiter> {
        if let Some(e) = self.error {
            return Err(e);
        }
        #[allow(unused_mut)]
        let mut cfg = self.options.into_config()?;
        #[cfg(feature = "test-util")]
        if let Some(t) = self.tuning {
            t.check().map_err(|reason| Error::Config {
                field: "tuning",
                reason,
            })?;
            cfg.tuning = t;
        }
        Limiter::new(cfg)
    }

    /// Adaptive leasing's tuning (default [`crate::internals::TUNING`]),
    /// for tests that check the bound under other values of the knobs
    /// (`core/tests/ledger_bound.rs`). Refused at `build` when it breaks a
    /// relation the bound relies on ([`crate::internals::Tuning::check`]).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn tuning(mut self, t: crate::ledger::Tuning) -> Self {
        self.tuning = Some(t);
        self
    }
}

impl Limiter {
    /// A builder with every default.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Build a limiter from options set by name (what the bindings use).
    pub fn from_options(options: Options) -> Result<Limiter> {
        Limiter::new(options.into_config()?)
    }
}
