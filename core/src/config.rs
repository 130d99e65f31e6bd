//! Configuration, its defaults and its validation.

use std::str::FromStr;

use crate::bucket::{Policy, MAX_CAPACITY_UNITS};
use crate::error::{Error, Result};
use crate::redact::{redact_secrets, RedactedUrl};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

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
        /// The clock's initial reading in milliseconds.
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

/// The per-key overshoot budget of adaptive leasing: how many tokens all
/// instances together may hold unspent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// A token count.
    Tokens(u64),
    /// Parts per million of the key's limit (`"2%"` is 20 000), at least one token.
    PerMillion(u64),
}

impl Budget {
    /// The budget in tokens for a key's limit.
    pub fn tokens(&self, limit: u64) -> u64 {
        match *self {
            Budget::Tokens(t) => t.max(1),
            Budget::PerMillion(ppm) => ((limit as u128 * ppm as u128).div_ceil(1_000_000) as u64).max(1),
        }
    }
}

impl FromStr for Budget {
    type Err = Error;
    /// `"2%"`, `"0.5%"` or a token count such as `"40"`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::config(
                "overshoot_budget",
                format!("must be a token count (at least 1) or a percentage of the limit such as \"2%\" (got {s:?})"),
            )
        };
        let t = s.trim();
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

/// Every option a limiter takes. `Config::default()` plus a `limit` is a
/// working configuration on the embedded `memory://` authority. Its `Debug`
/// prints `url` without credentials ([`crate::redact_url`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// `memory://` (default, private to this limiter), `memory://NAME` (shared
    /// by every limiter of this process with that NAME), `redis://`,
    /// `rediss://` (TLS), `redis+cluster://host:port[,host:port...]`.
    pub url: String,
    /// Tokens per window for every key (required; `set_limit` overrides per key).
    pub limit: u64,
    /// Window in milliseconds (default 60 000).
    pub window_ms: u64,
    /// Tokens borrowed per lease. `None` (default): adaptive leasing, leases
    /// sized by demand under `overshoot_budget`. `Some(n)`: fixed leases of `n`.
    pub lease_size: Option<u64>,
    /// Adaptive leasing's per-key budget of tokens held unspent by all
    /// instances together (default 2 % of the limit, at least 1).
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            url: "memory://".to_string(),
            limit: 0,
            window_ms: 60_000,
            lease_size: None,
            overshoot_budget: Budget::PerMillion(20_000),
            refill_threshold: None,
            lease_ttl_ms: 2_000,
            on_backend_failure: FailurePolicy::StaticShare,
            expected_replicas: 1,
            backend_timeout_ms: 250,
            key_prefix: "ql".to_string(),
            max_keys: 100_000,
            mode: Mode::Lease,
            clock: ClockKind::System,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &RedactedUrl(&self.url))
            .field("limit", &self.limit)
            .field("window_ms", &self.window_ms)
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
            .finish()
    }
}

/// Where the authoritative buckets live. `Debug` redacts every URL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum BackendSpec {
    /// In-process; `Some(name)` is shared by name within the process.
    Memory(Option<String>),
    /// One Redis server (`redis://` or `rediss://`).
    Redis(String),
    /// A Redis Cluster, given as seed node URLs.
    Cluster(Vec<String>),
}

impl BackendSpec {
    /// Every URL this backend connects with (their credentials are the secrets to keep out of text).
    pub fn urls(&self) -> Vec<&str> {
        match self {
            BackendSpec::Memory(_) => Vec::new(),
            BackendSpec::Redis(u) => vec![u.as_str()],
            BackendSpec::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
        }
    }
}

impl std::fmt::Debug for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSpec::Memory(name) => f.debug_tuple("Memory").field(name).finish(),
            BackendSpec::Redis(u) => f.debug_tuple("Redis").field(&RedactedUrl(u)).finish(),
            BackendSpec::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|u| RedactedUrl(u)).collect::<Vec<_>>())
                .finish(),
        }
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
}

impl Resolved {
    pub fn policy(&self) -> Policy {
        Policy {
            limit: self.cfg.limit,
            window_ms: self.cfg.window_ms,
        }
    }
}

/// Default lease size for a limit: 2 % of it, between 1 and 20.
pub fn default_lease_size(limit: u64) -> u64 {
    (limit / 50).clamp(1, 20)
}

/// Check that (limit, window) is a usable policy.
pub fn validate_policy(limit: u64, window_ms: u64) -> Result<Policy> {
    if limit == 0 {
        return Err(Error::config("limit", "must be at least 1"));
    }
    if window_ms == 0 {
        return Err(Error::config("window_ms", "must be at least 1"));
    }
    if limit.checked_mul(window_ms).is_none_or(|u| u > MAX_CAPACITY_UNITS) {
        return Err(Error::config(
            "limit",
            format!(
                "times window_ms must be at most 2^52 ({limit} * {window_ms} is larger); \
                 use a shorter window or a smaller limit"
            ),
        ));
    }
    Ok(Policy { limit, window_ms })
}

/// Check a key: non-empty, at most [`MAX_KEY_LEN`] bytes.
#[inline]
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey("the key is empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey(format!(
            "the key is {} bytes long; at most {MAX_KEY_LEN} are allowed",
            key.len()
        )));
    }
    Ok(())
}

/// The limiter key an HTTP middleware uses for a raw key (a header, an
/// address, a user id): the raw key when it fits in [`MAX_KEY_LEN`] bytes,
/// else `"sha256:"` and the 64 hex digits of its SHA-256. A long header then
/// never turns a request into an error, and equal raw keys share one bucket
/// in every process and language. Every middleware uses this rule.
pub fn http_key(raw: &str) -> std::borrow::Cow<'_, str> {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    if raw.len() <= MAX_KEY_LEN {
        return raw.into();
    }
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in Sha256::digest(raw.as_bytes()) {
        let _ = write!(out, "{b:02x}");
    }
    out.into()
}

/// Parse a rate such as `"600/min"`, `"10/s"`, `"5000/hour"`, `"100/30s"` into
/// `(limit, window_ms)`.
pub fn parse_rate(rate: &str) -> Result<(u64, u64)> {
    let bad = || {
        Error::config(
            "rate",
            format!("must look like \"600/min\", \"10/s\", \"100/30s\" or \"5000/hour\" (got {rate:?})"),
        )
    };
    let (n, per) = rate.trim().split_once('/').ok_or_else(bad)?;
    let limit: u64 = n.trim().parse().map_err(|_| bad())?;
    let per = per.trim();
    let digits = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
    let count: u64 = if digits == 0 {
        1
    } else {
        per[..digits].parse().map_err(|_| bad())?
    };
    let unit_ms: u64 = match per[digits..].trim() {
        "ms" => 1,
        "s" | "sec" | "second" | "seconds" => 1_000,
        "m" | "min" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return Err(bad()),
    };
    let window_ms = count.checked_mul(unit_ms).ok_or_else(bad)?;
    validate_policy(limit, window_ms)?;
    Ok((limit, window_ms))
}

#[cfg(feature = "redis")]
fn check_redis_url(url: &str) -> std::result::Result<(), String> {
    redis::Client::open(url).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(not(feature = "redis"))]
fn check_redis_url(_url: &str) -> std::result::Result<(), String> {
    Err("this build of quotalease has no Redis support (enable the crate's `redis` feature)".into())
}

/// The backend a URL names. Every message prints the URL redacted
/// ([`crate::redact_url`]), and the `redis` crate's reasons with the URL's
/// credentials removed.
fn parse_url(url: &str) -> Result<BackendSpec> {
    let bad = |why: String| Error::config("url", why);
    let shown = RedactedUrl(url);
    if let Some(rest) = url.strip_prefix("memory://") {
        let name = rest.trim_end_matches('/');
        return Ok(BackendSpec::Memory(if name.is_empty() {
            None
        } else {
            Some(name.to_string())
        }));
    }
    for (scheme, plain) in [("redis+cluster://", "redis://"), ("rediss+cluster://", "rediss://")] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((a, h)) => (format!("{a}@"), h),
                None => (String::new(), rest),
            };
            let (hosts, tail) = match hosts.find(['/', '?']) {
                Some(i) => (&hosts[..i], &hosts[i..]),
                None => (hosts, ""),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{plain}{auth}{h}{tail}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad(format!(
                    "{shown:?} names no cluster node (expected {scheme}host:port[,host:port...])"
                )));
            }
            for n in &nodes {
                check_redis_url(n).map_err(|e| {
                    bad(format!(
                        "{shown:?} is not a valid cluster URL: {}",
                        redact_secrets(&e, url)
                    ))
                })?;
            }
            return Ok(BackendSpec::Cluster(nodes));
        }
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        check_redis_url(url).map_err(|e| {
            bad(format!(
                "{shown:?} is not a valid Redis URL: {}",
                redact_secrets(&e, url)
            ))
        })?;
        return Ok(BackendSpec::Redis(url.to_string()));
    }
    Err(bad(format!(
        "{shown:?} has an unknown scheme; use memory://, memory://NAME, redis://, rediss:// or redis+cluster://"
    )))
}

impl Config {
    /// Validate every option and resolve the derived defaults.
    pub(crate) fn resolve(&self) -> Result<Resolved> {
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
        if let Budget::Tokens(0) | Budget::PerMillion(0) = self.overshoot_budget {
            return Err(Error::config("overshoot_budget", "must be at least 1 token"));
        }
        let backend = parse_url(&self.url)?;
        // `refill_threshold` only tunes fixed leases (adaptive ones prefetch
        // from demand x round trip).
        let adaptive = self.mode == Mode::Lease && self.lease_size.is_none();
        Ok(Resolved {
            cfg: self.clone(),
            backend,
            lease_size,
            refill_threshold,
            adaptive,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(limit: u64) -> Config {
        Config {
            limit,
            ..Config::default()
        }
    }

    fn field_of(r: Result<Resolved>) -> &'static str {
        match r {
            Err(Error::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
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
    #[cfg(feature = "redis")]
    fn urls_parse() {
        let r = |u: &str| {
            Config {
                url: u.into(),
                ..cfg(5)
            }
            .resolve()
            .unwrap()
            .backend
        };
        assert_eq!(r("memory://shared"), BackendSpec::Memory(Some("shared".into())));
        assert_eq!(
            r("redis://127.0.0.1:6379/0"),
            BackendSpec::Redis("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            r("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001"),
            BackendSpec::Cluster(vec![
                "redis://:pw@127.0.0.1:7000".into(),
                "redis://:pw@127.0.0.1:7001".into()
            ])
        );
    }

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("a").is_ok());
        assert_eq!(validate_key("").unwrap_err().kind(), crate::ErrorKind::InvalidKey);
        assert!(validate_key(&"x".repeat(MAX_KEY_LEN + 1)).is_err());
    }

    #[test]
    fn http_keys_stay_within_the_limit() {
        assert_eq!(http_key("1.2.3.4"), "1.2.3.4");
        let max = "k".repeat(MAX_KEY_LEN);
        assert_eq!(http_key(&max), max.as_str());
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let h = http_key(&long);
        assert!(h.starts_with("sha256:") && h.len() == 71, "{h}");
        assert!(validate_key(&h).is_ok());
        assert_eq!(h, http_key(&long), "stable");
        // the SHA-256 of "abc" repeated, checked against Python's hashlib
        let abc = "abc".repeat(200);
        assert_eq!(
            http_key(&abc),
            "sha256:1318642cb851c27771f76b674b229a3e49b577f6ed728e2beef0c27c38602d35"
        );
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("600/min").unwrap(), (600, 60_000));
        assert_eq!(parse_rate("10/s").unwrap(), (10, 1_000));
        assert_eq!(parse_rate("100/30s").unwrap(), (100, 30_000));
        assert_eq!(parse_rate(" 5000 / hour ").unwrap(), (5000, 3_600_000));
        for bad in ["", "10", "x/min", "10/fortnight", "0/min", "10/0s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(Mode::Exact.as_str(), "exact");
        assert_eq!(FailurePolicy::StaticShare.as_str(), "static-share");
    }
}
