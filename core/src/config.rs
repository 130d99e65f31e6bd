//! Configuration, its defaults and its validation. The rules for single
//! values live beside it: keys in `keys`, rates in `rate`, backend URLs in
//! `url` (what the engine and authorities use of them is re-exported here).

use std::str::FromStr;

use crate::bucket::Quota;
use crate::calendar::Calendar;
use crate::error::{Error, Result};
use crate::rate::validate_policy;
use crate::redact::RedactedUrl;
use crate::url::parse_url;

pub(crate) use crate::keys::validate_key;
pub(crate) use crate::url::BackendSpec;
#[cfg(feature = "redis")]
pub(crate) use crate::url::{tls_files, SentinelSpec, TlsFiles};

/// Longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// Latest reading a manual clock may start at (2^52 ms, about 142 000
/// years): its readings go to Redis' Lua as times, exact only below 2^53,
/// and the engine adds waits and lifetimes to them.
pub(crate) const MAX_CLOCK_START_MS: u64 = 1 << 52;

/// How the limiter coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Local leases borrowed from the authority in chunks (default).
    #[default]
    Lease,
    /// One authority call per request: exact, for modest traffic.
    Exact,
    /// An in-process bucket of `limit / expected_replicas`, no coordination.
    Local,
}

/// What the limiter does once the backend is unreachable and local tokens are spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// A local bucket of `limit / expected_replicas` per key (default).
    #[default]
    StaticShare,
    /// Admit everything until the backend is back.
    Allow,
    /// Deny everything until the backend is back.
    Deny,
}

/// Where time comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClockKind {
    /// The process' monotonic clock; Redis scripts use Redis `TIME` (default).
    #[default]
    System,
    /// A manual clock starting at `start_ms`, moved only by
    /// [`crate::Limiter::advance_clock`]: for deterministic tests. Redis scripts
    /// then receive this clock's time instead of calling `TIME`.
    Manual {
        /// The clock's initial reading in milliseconds, at most 2^52.
        start_ms: u64,
    },
}

macro_rules! str_enum {
    ($ty:ident, $field:literal, $( $s:literal => $v:expr ),+ $(,)?) => {
        impl FromStr for $ty {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                match s {
                    $( $s => Ok($v), )+
                    other => Err(Error::config(
                        $field,
                        format!(concat!("must be one of ", $( "\"", $s, "\" ", )+ "(got {:?})"), other),
                    )),
                }
            }
        }
        impl $ty {
            /// The option's spelling in every binding.
            pub fn as_str(&self) -> &'static str {
                match self { $( x if *x == $v => $s, )+ _ => unreachable!() }
            }
        }
    };
}

str_enum!(Mode, "mode", "lease" => Mode::Lease, "exact" => Mode::Exact, "local" => Mode::Local);
str_enum!(FailurePolicy, "on_backend_failure",
    "static-share" => FailurePolicy::StaticShare,
    "allow" => FailurePolicy::Allow,
    "deny" => FailurePolicy::Deny);

/// `overshoot_budget` of adaptive leasing: the most tokens one instance
/// leases ahead of its request on a key, and (under one token) which keys
/// are decided one request at a time. It trades calls against false
/// denials, never the bound (docs/limits.md). The default, [`Budget::Auto`],
/// lets a few busy instances of a large key lease further ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// A token count.
    Tokens(u64),
    /// Parts per million of the key's limit (`"2%"` is 20 000), at least one token.
    PerMillion(u64),
    /// The default (`"auto"`): 2 % of the limit, or, when more, an equal
    /// part of `fleet_ahead_pct` (half) of what the key refills in
    /// `target_ms` (a second; at most its capacity) among the key's live
    /// holders at the instance's last answer: six busy instances of a
    /// 1000/s key lease up to 83 tokens ahead each, not 20; a 120/hour key's
    /// holders no more than 2 %.
    Auto,
}

impl Budget {
    /// [`Budget::Auto`]'s part of the limit, in parts per million.
    pub const AUTO_PER_MILLION: u64 = 20_000;

    /// The budget as a share of the limit, in millionths (None: a count).
    fn per_million(&self) -> Option<u64> {
        match *self {
            Budget::Tokens(_) => None,
            Budget::PerMillion(ppm) => Some(ppm),
            Budget::Auto => Some(Self::AUTO_PER_MILLION),
        }
    }

    /// The budget in tokens for a key's limit ([`Budget::Auto`]: its 2 %).
    pub fn tokens(&self, limit: u64) -> u64 {
        let share = |ppm: u64| (limit as u128 * ppm as u128).div_ceil(1_000_000) as u64;
        let t = match *self {
            Budget::Tokens(t) => t,
            Budget::PerMillion(ppm) => share(ppm),
            Budget::Auto => share(Self::AUTO_PER_MILLION),
        };
        t.max(1)
    }

    /// Whether the budget is a share of the limit under one whole token for
    /// a key of `limit` (such a key is decided one request at a time).
    pub fn under_a_token(&self, limit: u64) -> bool {
        self.per_million()
            .is_some_and(|ppm| (limit as u128) * (ppm as u128) < 1_000_000)
    }
}

/// The option's text, which [`FromStr`] reads back as the same budget:
/// `"auto"`, a token count (`"40"`) or a percentage (`"0.5%"`).
impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Budget::Tokens(t) => write!(f, "{t}"),
            // (an exact decimal: whole percent, then up to four places)
            Budget::PerMillion(ppm) => {
                let frac = format!("{:04}", ppm % 10_000);
                match frac.trim_end_matches('0') {
                    "" => write!(f, "{}%", ppm / 10_000),
                    frac => write!(f, "{}.{frac}%", ppm / 10_000),
                }
            }
            Budget::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for Budget {
    type Err = Error;
    /// `"auto"`, `"2%"`, `"0.5%"` or a token count such as `"40"`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::config(
                "overshoot_budget",
                format!("must be \"auto\", a token count (at least 1) or a percentage of the limit such as \"2%\" (got {s:?})"),
            )
        };
        let t = s.trim();
        if t == "auto" {
            return Ok(Budget::Auto);
        }
        if let Some(pct) = t.strip_suffix('%') {
            let v: f64 = pct.trim().parse().map_err(|_| bad())?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad());
            }
            return Ok(Budget::PerMillion(((v * 10_000.0).round() as u64).max(1)));
        }
        match t.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(Budget::Tokens(n)),
            _ => Err(bad()),
        }
    }
}

/// Every option of a limiter, validated: what [`crate::Options`] (by name)
/// and [`crate::Builder`] (typed setters over it) produce, and what
/// [`crate::Limiter::config`] reads back. It is a result, not a way in:
/// it cannot be built outside this crate (no `Default`, `non_exhaustive`),
/// so every configuration passes the one rulebook of `Options`. Its `Debug`
/// prints `url` without credentials ([`crate::redact_url`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `memory://` (default, private to this limiter), `memory://NAME` (shared
    /// by every limiter of this process with that NAME), `redis://`,
    /// `rediss://` (TLS; `?ssl_certfile=&ssl_keyfile=` for a client
    /// certificate, `?ssl_ca_certs=` for a private CA),
    /// `redis+cluster://host:port[,host:port...]`,
    /// `redis+sentinel://host:port[,host:port...]/service_name[/db]`.
    pub url: String,
    /// Tokens per window for every key (required; `set_limit` overrides per key).
    pub limit: u64,
    /// Window in milliseconds (default 60 000).
    pub window_ms: u64,
    /// [`Calendar::NONE`] (default): `limit` per `window_ms` is a token
    /// bucket. Else a calendar quota (`rate = "1000/month@UTC"`): at most
    /// `limit` in each period of the calendar (`window_ms` is its nominal length).
    pub calendar: Calendar,
    /// Requests of one key in flight at once across the fleet, for
    /// [`crate::Limiter::acquire_concurrent`] (default 0: no such limit),
    /// unless the key's rules set one (`"100/min, 5 concurrent"`). Needs
    /// adaptive leasing.
    pub concurrency: u64,
    /// Tokens borrowed per lease. `None` (default): adaptive leasing, leases
    /// sized by demand under `overshoot_budget`. `Some(n)`: fixed leases of `n`.
    pub lease_size: Option<u64>,
    /// Adaptive leasing's budget: the most tokens one instance leases ahead
    /// of its request on a key (default [`Budget::Auto`]).
    pub overshoot_budget: Budget,
    /// Prefetch when local tokens drop below this. `None`: a quarter of
    /// `lease_size`, at least 1. 0 disables prefetch.
    pub refill_threshold: Option<u64>,
    /// Leased tokens unused this long are given back (default 2 000 ms).
    pub lease_ttl_ms: u64,
    /// What to do while the backend is unreachable (default `StaticShare`).
    pub on_backend_failure: FailurePolicy,
    /// Instances expected to share a key; sizes the static share (default 1).
    pub expected_replicas: u64,
    /// Bound on every backend round trip and on a cold `acquire`'s wait (default 250 ms).
    pub backend_timeout_ms: u64,
    /// Prefix of every Redis key (default `ql`).
    pub key_prefix: String,
    /// Most keys tracked locally; idle ones are evicted (default 100 000).
    pub max_keys: usize,
    /// `Lease` (default), `Exact` or `Local`.
    pub mode: Mode,
    /// Time source (default the system clock).
    pub clock: ClockKind,
    /// Named plan tiers (`free = 100/min`, `pro = 6000/min + 1000000/day`);
    /// `acquire_with(key, cost, Some("pro"))` holds a key to its tier. The
    /// policy file and store may define more tiers or redefine these.
    pub tiers: Vec<crate::policy::Tier>,
    /// The tier of a key whose caller names none and that the store does
    /// not assign (default: none, the key gets `limit`/`window_ms`). Must
    /// name a tier of `tiers` or of the policy file. With a default tier,
    /// `limit` may be left out: it is the tier's first rule.
    pub default_tier: Option<String>,
    /// A TOML file of tiers and per-key policies (docs/policies.md),
    /// re-read when it changes (checked every `policy_refresh_ms`).
    pub policy_file: Option<String>,
    /// How often the shared policy store (Redis, or the `memory://NAME`
    /// authority) and the policy file are checked for changes. The default,
    /// 0, follows no shared store (no poll: a limiter that does not use the
    /// store costs Redis nothing for it) and reads the file once; a fleet
    /// that changes tiers or keys' rules at run time sets it (e.g. 1 000).
    pub policy_refresh_ms: u64,
    /// Shadow mode for every key (default false): requests the rules deny
    /// are admitted with reason `shadow` and counted in `shadow_denied`,
    /// to watch what a limit would do before enforcing it. A tier or key
    /// can be put in shadow mode alone by its rules (`"shadow 100/min"`).
    pub shadow: bool,
    /// Adaptive leasing's tuning: [`crate::ledger::TUNING`], except in
    /// tests that draw other values (`Builder::tuning`, feature `test-util`).
    pub(crate) tuning: crate::ledger::Tuning,
}

impl Config {
    /// Every option at its default: where [`crate::Options`] starts.
    pub(crate) fn defaults() -> Self {
        Config {
            url: "memory://".to_string(),
            limit: 0,
            window_ms: 60_000,
            calendar: Calendar::NONE,
            concurrency: 0,
            lease_size: None,
            overshoot_budget: Budget::Auto,
            refill_threshold: None,
            lease_ttl_ms: 2_000,
            on_backend_failure: FailurePolicy::StaticShare,
            expected_replicas: 1,
            backend_timeout_ms: 250,
            key_prefix: "ql".to_string(),
            max_keys: 100_000,
            mode: Mode::Lease,
            clock: ClockKind::System,
            tiers: Vec::new(),
            default_tier: None,
            policy_file: None,
            policy_refresh_ms: 0,
            shadow: false,
            tuning: crate::ledger::TUNING,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &RedactedUrl(&self.url))
            .field("limit", &self.limit)
            .field("window_ms", &self.window_ms)
            .field("calendar", &self.calendar.spec().map(|c| c.to_string()))
            .field("concurrency", &self.concurrency)
            .field("lease_size", &self.lease_size)
            .field("overshoot_budget", &self.overshoot_budget)
            .field("refill_threshold", &self.refill_threshold)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("on_backend_failure", &self.on_backend_failure)
            .field("expected_replicas", &self.expected_replicas)
            .field("backend_timeout_ms", &self.backend_timeout_ms)
            .field("key_prefix", &self.key_prefix)
            .field("max_keys", &self.max_keys)
            .field("mode", &self.mode)
            .field("clock", &self.clock)
            .field("tiers", &self.tiers)
            .field("default_tier", &self.default_tier)
            .field("policy_file", &self.policy_file)
            .field("policy_refresh_ms", &self.policy_refresh_ms)
            .field("shadow", &self.shadow)
            .finish()
    }
}

/// A validated configuration with every default resolved.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub cfg: Config,
    pub backend: BackendSpec,
    pub lease_size: u64,
    pub refill_threshold: u64,
    /// Adaptive leasing is on (mode lease, no fixed `lease_size`).
    pub adaptive: bool,
    /// The reason of a decision from local tokens: `local` in mode local,
    /// else `lease` (read once per admit: one load, not a compare).
    pub admit_reason: crate::decision::Reason,
    /// The policy file as read when the limiter was built.
    pub file: Option<crate::policy::file::PolicyFile>,
}

impl Resolved {
    pub fn policy(&self) -> Quota {
        Quota {
            limit: self.cfg.limit,
            window_ms: self.cfg.window_ms,
            calendar: self.cfg.calendar,
        }
    }

    /// The bucket of a key's permits in flight (`concurrency`).
    pub fn in_flight_policy(&self) -> Quota {
        Quota {
            limit: self.cfg.concurrency,
            window_ms: IN_FLIGHT_WINDOW_MS,
            calendar: Calendar::IN_FLIGHT,
        }
    }
}

/// The credit units of a concurrency limit's permits (one permit is this
/// many units; permits never refill, so it sizes only the failure
/// policy's shares: a share of the limit per second).
pub(crate) const IN_FLIGHT_WINDOW_MS: u64 = 1_000;

/// Why a limiter that does not lease adaptively refuses calendar quotas
/// (and concurrency limits).
pub(crate) const CALENDAR_NEEDS_LEDGER: &str =
    "is a calendar quota or a concurrency limit, which needs adaptive leasing (mode \"lease\" \
     without lease_size): only the ledger resets a quota at calendar boundaries; for one request per \
     authority call, keep mode \"lease\" with a small overshoot_budget such as \"1\"";

/// Default lease size for a limit: 2 % of it, between 1 and 20.
pub fn default_lease_size(limit: u64) -> u64 {
    (limit / 50).clamp(1, 20)
}

impl Config {
    /// Validate every option and resolve the derived defaults.
    pub(crate) fn resolve(&self) -> Result<Resolved> {
        let file = match &self.policy_file {
            Some(path) => Some(crate::policy::file::read(path)?),
            None => None,
        };
        let mut this = self.clone();
        let default_tier = self
            .default_tier
            .clone()
            .or_else(|| file.as_ref().and_then(|f| f.default_tier.clone()));
        if let Some(name) = &default_tier {
            crate::policy::validate_tier_name(name).map_err(|e| match e {
                Error::Config { reason, .. } => Error::config("default_tier", reason),
                e => e,
            })?;
            let tier = file
                .as_ref()
                .and_then(|f| f.tiers.iter().find(|t| &t.name == name))
                .or_else(|| self.tiers.iter().find(|t| &t.name == name))
                .ok_or_else(|| {
                    Error::config(
                        "default_tier",
                        format!("names tier {name:?}, which neither `tiers` nor the policy file defines"),
                    )
                })?;
            if self.limit == 0 {
                let first = tier.rules.first();
                (this.limit, this.window_ms, this.calendar) = (first.limit, first.window_ms, first.calendar);
            }
        }
        let mut r = this.resolve_one()?;
        r.file = file;
        Ok(r)
    }

    fn resolve_one(&self) -> Result<Resolved> {
        let policy = validate_policy(self.limit, self.window_ms).map_err(|e| match e {
            Error::Config { field: "limit", reason } if self.limit == 0 => Error::config(
                "limit",
                format!("{reason}: every limiter needs a limit (tokens per window)"),
            ),
            e => e,
        })?;
        let lease_size = self.lease_size.unwrap_or_else(|| default_lease_size(policy.limit));
        if lease_size == 0 || lease_size > policy.limit {
            return Err(Error::config(
                "lease_size",
                format!("must be between 1 and limit ({}) (got {lease_size})", policy.limit),
            ));
        }
        let refill_threshold = self.refill_threshold.unwrap_or((lease_size / 4).max(1));
        if refill_threshold > lease_size {
            return Err(Error::config(
                "refill_threshold",
                format!("must be at most lease_size ({lease_size}) (got {refill_threshold})"),
            ));
        }
        if self.lease_ttl_ms == 0 {
            return Err(Error::config("lease_ttl_ms", "must be at least 1"));
        }
        if self.expected_replicas == 0 {
            return Err(Error::config("expected_replicas", "must be at least 1"));
        }
        if self.backend_timeout_ms == 0 || self.backend_timeout_ms > 60_000 {
            return Err(Error::config(
                "backend_timeout_ms",
                format!("must be between 1 and 60000 (got {})", self.backend_timeout_ms),
            ));
        }
        if self.key_prefix.len() > MAX_PREFIX_LEN || self.key_prefix.contains(['{', '}']) {
            return Err(Error::config(
                "key_prefix",
                format!(
                    "must be at most {MAX_PREFIX_LEN} bytes with no '{{' or '}}' (got {:?})",
                    self.key_prefix
                ),
            ));
        }
        if self.max_keys == 0 {
            return Err(Error::config("max_keys", "must be at least 1"));
        }
        if self.concurrency.saturating_mul(IN_FLIGHT_WINDOW_MS) > crate::bucket::MAX_CAPACITY_UNITS {
            return Err(Error::config(
                "concurrency",
                format!("must be at most 2^52 / 1000 (got {})", self.concurrency),
            ));
        }
        if let Budget::Tokens(0) | Budget::PerMillion(0) = self.overshoot_budget {
            return Err(Error::config("overshoot_budget", "must be at least 1 token"));
        }
        if let ClockKind::Manual { start_ms } = self.clock {
            if start_ms > MAX_CLOCK_START_MS {
                return Err(Error::config(
                    "clock_start_ms",
                    format!("must be at most 2^52 ({MAX_CLOCK_START_MS}) (got {start_ms})"),
                ));
            }
        }
        let backend = parse_url(&self.url)?;
        // `refill_threshold` only tunes fixed leases (adaptive ones prefetch
        // from demand x round trip).
        let adaptive = self.mode == Mode::Lease && self.lease_size.is_none();
        if !adaptive {
            let field = if self.concurrency > 0 {
                Some("concurrency")
            } else if self.calendar.is_some() {
                Some("rate")
            } else if self
                .tiers
                .iter()
                .any(|t| t.rules.has_calendar() || t.rules.concurrency().is_some())
            {
                Some("tiers")
            } else {
                None
            };
            if let Some(field) = field {
                return Err(Error::config(field, CALENDAR_NEEDS_LEDGER));
            }
        }
        Ok(Resolved {
            cfg: self.clone(),
            backend,
            lease_size,
            refill_threshold,
            adaptive,
            admit_reason: if self.mode == Mode::Local {
                crate::decision::Reason::Local
            } else {
                crate::decision::Reason::Lease
            },
            file: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(limit: u64) -> Config {
        Config {
            limit,
            ..Config::defaults()
        }
    }

    fn field_of(r: Result<Resolved>) -> &'static str {
        match r {
            Err(Error::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn a_budget_reads_back_from_its_text() {
        for b in [
            Budget::Auto,
            Budget::Tokens(40),
            Budget::PerMillion(20_000),
            Budget::PerMillion(5_000),
            Budget::PerMillion(1),
            Budget::PerMillion(1_000_000),
            Budget::PerMillion(123_450),
        ] {
            assert_eq!(b.to_string().parse::<Budget>().unwrap(), b, "{b}");
        }
        assert_eq!(Budget::PerMillion(5_000).to_string(), "0.5%");
        assert_eq!(Budget::PerMillion(20_000).to_string(), "2%");
    }

    #[test]
    fn defaults_resolve() {
        let r = cfg(600).resolve().unwrap();
        assert_eq!(r.lease_size, 12);
        assert_eq!(r.refill_threshold, 3);
        assert_eq!(r.backend, BackendSpec::Memory(None));
        assert_eq!(cfg(10).resolve().unwrap().lease_size, 1);
        assert_eq!(cfg(100_000).resolve().unwrap().lease_size, 20);
    }

    #[test]
    fn every_invalid_value_names_its_field() {
        assert_eq!(field_of(cfg(0).resolve()), "limit");
        assert_eq!(field_of(Config { window_ms: 0, ..cfg(5) }.resolve()), "window_ms");
        assert_eq!(
            field_of(
                Config {
                    window_ms: u64::MAX,
                    ..cfg(5)
                }
                .resolve()
            ),
            "limit"
        );
        assert_eq!(
            field_of(
                Config {
                    lease_size: Some(6),
                    ..cfg(5)
                }
                .resolve()
            ),
            "lease_size"
        );
        assert_eq!(
            field_of(
                Config {
                    lease_size: Some(0),
                    ..cfg(5)
                }
                .resolve()
            ),
            "lease_size"
        );
        assert_eq!(
            field_of(
                Config {
                    lease_size: Some(2),
                    refill_threshold: Some(3),
                    ..cfg(5)
                }
                .resolve()
            ),
            "refill_threshold"
        );
        assert_eq!(
            field_of(
                Config {
                    lease_ttl_ms: 0,
                    ..cfg(5)
                }
                .resolve()
            ),
            "lease_ttl_ms"
        );
        assert_eq!(
            field_of(
                Config {
                    expected_replicas: 0,
                    ..cfg(5)
                }
                .resolve()
            ),
            "expected_replicas"
        );
        assert_eq!(
            field_of(
                Config {
                    backend_timeout_ms: 0,
                    ..cfg(5)
                }
                .resolve()
            ),
            "backend_timeout_ms"
        );
        assert_eq!(
            field_of(
                Config {
                    key_prefix: "a{b".into(),
                    ..cfg(5)
                }
                .resolve()
            ),
            "key_prefix"
        );
        assert_eq!(field_of(Config { max_keys: 0, ..cfg(5) }.resolve()), "max_keys");
        let manual = |start_ms| Config {
            clock: ClockKind::Manual { start_ms },
            ..cfg(5)
        };
        assert_eq!(field_of(manual(MAX_CLOCK_START_MS + 1).resolve()), "clock_start_ms");
        assert!(manual(MAX_CLOCK_START_MS).resolve().is_ok());
        for url in ["http://x", "redis://:99999999", "redis+cluster://", "", "memory:/x"] {
            assert_eq!(
                field_of(
                    Config {
                        url: url.into(),
                        ..cfg(5)
                    }
                    .resolve()
                ),
                "url",
                "{url}"
            );
        }
        assert_eq!("sideways".parse::<Mode>().unwrap_err().kind(), crate::ErrorKind::Config);
        assert!("panic".parse::<FailurePolicy>().is_err());
    }

    #[test]
    fn enums_are_spelled_as_their_options() {
        assert_eq!(Mode::Exact.as_str(), "exact");
        assert_eq!(FailurePolicy::StaticShare.as_str(), "static-share");
    }
}
