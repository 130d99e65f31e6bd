//! [`Builder`]: a [`Config`] set up in code, with the same rules as options
//! set by name (see [`crate::options`]).

use crate::config::{ClockKind, Config, FailurePolicy, Mode};
use crate::error::Result;
use crate::limiter::Limiter;
use crate::options::{OptionValue, Options};

/// Builds a [`Limiter`]. Every setter mirrors a [`Config`] field.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    cfg: Config,
    /// Options that carry rules between them (`rate` with `limit`/`window_ms`).
    named: Options,
    limit_or_window: bool,
    /// Tiers as given to [`Builder::tier`], parsed by `build`.
    tiers: Vec<(String, String)>,
}

macro_rules! setters {
    ($( $(#[$m:meta])* $name:ident : $ty:ty => |$c:ident, $v:ident| $body:expr ),+ $(,)?) => {
        $( $(#[$m])* pub fn $name(mut self, $v: $ty) -> Self { let $c = &mut self.cfg; $body; self } )+
    };
}

impl Builder {
    setters! {
        /// Backend URL (default `memory://`).
        url: impl Into<String> => |c, v| c.url = v.into(),
        /// Tokens per lease (default 2 % of limit, 1..=20).
        lease_size: u64 => |c, v| c.lease_size = Some(v),
        /// Prefetch below this many local tokens (default lease_size / 4, at least 1).
        refill_threshold: u64 => |c, v| c.refill_threshold = Some(v),
        /// Give back leased tokens unused this long (default 2 000 ms).
        lease_ttl_ms: u64 => |c, v| c.lease_ttl_ms = v,
        /// Failure policy (default static share).
        on_backend_failure: FailurePolicy => |c, v| c.on_backend_failure = v,
        /// Instances sharing a key, for the static share (default 1).
        expected_replicas: u64 => |c, v| c.expected_replicas = v,
        /// Backend round-trip bound (default 250 ms).
        backend_timeout_ms: u64 => |c, v| c.backend_timeout_ms = v,
        /// Redis key prefix (default `ql`).
        key_prefix: impl Into<String> => |c, v| c.key_prefix = v.into(),
        /// Most keys tracked locally (default 100 000).
        max_keys: usize => |c, v| c.max_keys = v,
        /// Coordination mode (default lease).
        mode: Mode => |c, v| c.mode = v,
        /// Clock (default system; manual for deterministic tests).
        clock: ClockKind => |c, v| c.clock = v,
        /// The tier of keys whose callers name none (must be one of the tiers).
        default_tier: impl Into<String> => |c, v| c.default_tier = Some(v.into()),
        /// A TOML file of tiers and per-key policies (docs/policies.md).
        policy_file: impl Into<String> => |c, v| c.policy_file = Some(v.into()),
        /// How often the policy store and file are checked (default 0: no store, no poll; the file is read once).
        policy_refresh_ms: u64 => |c, v| c.policy_refresh_ms = v,
    }

    /// Define plan tier `name` with `rules` (`"6000/min, 1000000/day"`);
    /// errors are reported by [`build`](Self::build).
    pub fn tier(mut self, name: &str, rules: &str) -> Self {
        self.tiers.push((name.to_string(), rules.to_string()));
        self
    }

    /// Tokens per window (required, unless [`rate`](Self::rate) is given).
    pub fn limit(mut self, limit: u64) -> Self {
        self.cfg.limit = limit;
        self.limit_or_window = true;
        self
    }

    /// Window in milliseconds (default 60 000).
    pub fn window_ms(mut self, window_ms: u64) -> Self {
        self.cfg.window_ms = window_ms;
        self.limit_or_window = true;
        self
    }

    /// Limit and window from a rate such as `"600/min"`. Giving `limit` or
    /// `window_ms` as well is an error at [`build`](Self::build).
    pub fn rate(mut self, rate: &str) -> Self {
        // Errors are reported by `build`, like every other invalid value.
        let _ = self.named.set("rate", OptionValue::Str(rate));
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<Limiter> {
        let mut named = self.named;
        if self.limit_or_window {
            // Only to apply the rate-vs-limit rule; the values come from `cfg`.
            named.set("limit", OptionValue::Int(1))?;
        }
        let from_rate = named.into_config()?;
        let mut cfg = self.cfg;
        for (name, rules) in &self.tiers {
            let t = crate::policy::parse_tiers(&format!("{name}={rules}"))?;
            if cfg.tiers.iter().any(|have| have.name == t[0].name) {
                return Err(crate::Error::config("tiers", format!("names tier {name:?} twice")));
            }
            cfg.tiers.extend(t);
        }
        if !self.limit_or_window && from_rate.limit != 0 {
            cfg.limit = from_rate.limit;
            cfg.window_ms = from_rate.window_ms;
        }
        Limiter::new(cfg)
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
