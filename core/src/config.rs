//! Configuration, its defaults and its validation.

use std::str::FromStr;

use crate::bucket::{Policy, MAX_CAPACITY_UNITS};
use crate::error::{Error, Result};
use crate::redact::{redact_secrets, RedactedUrl};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
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
    /// `rediss://` (TLS; `?ssl_certfile=&ssl_keyfile=` for a client
    /// certificate, `?ssl_ca_certs=` for a private CA),
    /// `redis+cluster://host:port[,host:port...]`,
    /// `redis+sentinel://host:port[,host:port...]/service_name[/db]`.
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
            tiers: Vec::new(),
            default_tier: None,
            policy_file: None,
            policy_refresh_ms: 0,
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
            .field("tiers", &self.tiers)
            .field("default_tier", &self.default_tier)
            .field("policy_file", &self.policy_file)
            .field("policy_refresh_ms", &self.policy_refresh_ms)
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
    /// A Redis primary found through Sentinel (`redis+sentinel://`; boxed,
    /// it is far larger than the other variants).
    Sentinel(Box<SentinelSpec>),
}

/// `redis+sentinel://[user:pass@]host:port[,host:port...]/service[/db][?options]`,
/// parsed. `Debug` prints only the redacted URL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct SentinelSpec {
    /// The URL as configured (its credentials are secrets to keep out of text).
    pub url: String,
    /// `host:port` of each sentinel (port 26379 when the URL gives none).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub service: String,
    /// The primary's (and replicas') user name and password: the URL's user info, decoded.
    pub username: Option<String>,
    pub password: Option<String>,
    /// The database to select on the primary.
    pub db: i64,
    /// `?protocol=3` (or `resp3`): RESP3 to the primary.
    pub resp3: bool,
    /// The sentinels' own credentials (`?sentinel_username=`, `?sentinel_password=`).
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for SentinelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SentinelSpec").field(&RedactedUrl(&self.url)).finish()
    }
}

/// The default port of a Redis Sentinel.
pub(crate) const SENTINEL_PORT: u16 = 26379;

/// Client certificate, key and trusted CA files of a `rediss://` URL
/// (`?ssl_certfile=&ssl_keyfile=&ssl_ca_certs=`, the names redis-py uses),
/// read each time the connection is made (so a rotated certificate is
/// picked up on the next reconnect).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub certfile: Option<String>,
    pub keyfile: Option<String>,
    pub ca_certs: Option<String>,
}

/// The query parameters of a URL that name TLS files.
const TLS_PARAMS: [&str; 3] = ["ssl_certfile", "ssl_keyfile", "ssl_ca_certs"];

/// The TLS files a URL names (None when it names none). Errors: a file
/// parameter on a URL other than `rediss://`, a certificate without its key
/// (or the reverse), a parameter given twice. Messages never quote a value.
pub(crate) fn tls_files(url: &str) -> std::result::Result<Option<TlsFiles>, String> {
    let query = url
        .split_once('#')
        .map_or(url, |(u, _)| u)
        .split_once('?')
        .map(|(_, q)| q);
    let mut files = TlsFiles::default();
    let mut any = false;
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "ssl_certfile" => &mut files.certfile,
            "ssl_keyfile" => &mut files.keyfile,
            "ssl_ca_certs" => &mut files.ca_certs,
            _ => continue,
        };
        if !url.starts_with("rediss://") {
            return Err(format!("`{name}` is supported on rediss:// URLs only"));
        }
        if value.is_empty() {
            return Err(format!("`{name}` needs a file path"));
        }
        if slot.replace(crate::redact::percent_decode(value)).is_some() {
            return Err(format!("`{name}` is given twice"));
        }
        any = true;
    }
    if files.certfile.is_some() != files.keyfile.is_some() {
        return Err("`ssl_certfile` and `ssl_keyfile` go together (a client certificate and its private key)".into());
    }
    Ok(any.then_some(files))
}

impl BackendSpec {
    /// Every URL this backend connects with (their credentials are the secrets to keep out of text).
    pub fn urls(&self) -> Vec<&str> {
        match self {
            BackendSpec::Memory(_) => Vec::new(),
            BackendSpec::Redis(u) => vec![u.as_str()],
            BackendSpec::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
            BackendSpec::Sentinel(s) => vec![s.url.as_str()],
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
            BackendSpec::Sentinel(s) => f.debug_tuple("Sentinel").field(&RedactedUrl(&s.url)).finish(),
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
    /// The policy file as read when the limiter was built.
    pub file: Option<crate::policy::file::PolicyFile>,
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

/// Check a key: non-empty, at most [`MAX_KEY_LEN`] bytes, and free of
/// [`crate::policy::RULE_SEPARATOR`] (U+001F), which names the buckets of a
/// key's further rules (`key`, U+001F, window in ms).
pub fn validate_key(key: &str) -> Result<()> {
    validate_key_len(key)?;
    if key.as_bytes().contains(&0x1f) {
        return Err(Error::InvalidKey(
            "the key contains U+001F (unit separator), which names the buckets of a key's further rules".into(),
        ));
    }
    Ok(())
}

/// The admit path's check: non-empty, at most [`MAX_KEY_LEN`] bytes. (A key
/// with U+001F finds no entry it may use there and is refused on the cold
/// path, by [`validate_key`].)
#[inline]
pub fn validate_key_len(key: &str) -> Result<()> {
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
/// address, a user id): the raw key when it fits in [`MAX_KEY_LEN`] bytes and
/// holds no U+001F, else `"sha256:"` and the 64 hex digits of its SHA-256. A long header then
/// never turns a request into an error, and equal raw keys share one bucket
/// in every process and language. Every middleware uses this rule.
pub fn http_key(raw: &str) -> std::borrow::Cow<'_, str> {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    if raw.len() <= MAX_KEY_LEN && !raw.as_bytes().contains(&0x1f) {
        return raw.into();
    }
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in Sha256::digest(raw.as_bytes()) {
        let _ = write!(out, "{b:02x}");
    }
    out.into()
}

/// The units [`parse_rate`] accepts, as its error lists them.
const RATE_UNITS: &str = "ms, s (sec, secs, second, seconds), m (min, mins, minute, minutes), \
                          h (hr, hrs, hour, hours), d (day, days)";

/// Parse a rate such as `"600/min"`, `"10/s"`, `"5000/hour"`, `"100/30s"` into
/// `(limit, window_ms)`.
pub fn parse_rate(rate: &str) -> Result<(u64, u64)> {
    let bad = || {
        Error::config(
            "rate",
            format!(
                "must look like \"600/min\", \"10/s\", \"100/30s\" or \"5000/hour\": a whole number of tokens, \
                 \"/\", an optional whole count and a lowercase unit, one of {RATE_UNITS} (got {rate:?})"
            ),
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
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
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
            // (A client certificate for a cluster is not supported yet.)
            if tls_files(&nodes[0]) != Ok(None) {
                return Err(bad(format!(
                    "{shown:?}: `ssl_certfile`, `ssl_keyfile` and `ssl_ca_certs` are supported on rediss:// URLs only"
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
    if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        return parse_sentinel(url, rest)
            .map(|s| BackendSpec::Sentinel(Box::new(s)))
            .map_err(bad);
    }
    if url.starts_with("rediss+sentinel://") {
        return Err(bad(format!(
            "{shown:?}: Sentinel over TLS is not supported yet (use redis+sentinel://)"
        )));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        check_redis_url(url).map_err(|e| {
            bad(format!(
                "{shown:?} is not a valid Redis URL: {}",
                redact_secrets(&e, url)
            ))
        })?;
        if let Some(files) = tls_files(url).map_err(|why| bad(format!("{shown:?}: {why}")))? {
            for (name, path) in TLS_PARAMS
                .iter()
                .zip([&files.certfile, &files.keyfile, &files.ca_certs])
            {
                if let Some(path) = path {
                    std::fs::metadata(path)
                        .map_err(|e| bad(format!("{shown:?}: cannot read the `{name}` file: {e}")))?;
                }
            }
        }
        return Ok(BackendSpec::Redis(url.to_string()));
    }
    Err(bad(format!(
        "{shown:?} has an unknown scheme; use memory://, memory://NAME, redis://, rediss://, \
         redis+cluster:// or redis+sentinel://"
    )))
}

/// `redis+sentinel://[user:pass@]host[:port][,host[:port]...]/service[/db][?options]`
/// (`rest` is what follows the scheme). The user info authenticates to the
/// primary; options: `sentinel_username`, `sentinel_password` (the
/// sentinels' own credentials) and `protocol` (the primary's). Messages
/// print the URL redacted and never quote a credential.
fn parse_sentinel(url: &str, rest: &str) -> std::result::Result<SentinelSpec, String> {
    let shown = RedactedUrl(url);
    let form = "expected redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]";
    let (userinfo, after) = match rest.rsplit_once('@') {
        Some((u, a)) => (u, a),
        None => ("", rest),
    };
    if userinfo.contains(['/', '?', '#']) {
        return Err(format!(
            "{shown:?}: an `@` after the host list (percent-encode it as %40 in a value) ({form})"
        ));
    }
    if after.contains('#') {
        return Err(format!("{shown:?}: a fragment is not supported here ({form})"));
    }
    let (after, query) = match after.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (after, None),
    };
    let (hosts, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let sentinels: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            // A port is there unless the entry is a bare name, an IPv4
            // address or a bracketed IPv6 address.
            let has_port = match h.rfind(']') {
                Some(close) => h[close..].contains(':'),
                None => h.contains(':'),
            };
            if has_port {
                h.to_string()
            } else {
                format!("{h}:{SENTINEL_PORT}")
            }
        })
        .collect();
    if sentinels.is_empty() {
        return Err(format!("{shown:?} names no sentinel ({form})"));
    }
    let mut segments = path.strip_prefix('/').unwrap_or("").split('/');
    let service = segments.next().unwrap_or("");
    if service.is_empty() || service.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{shown:?} names no service ({form})"));
    }
    let db = match segments.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("{shown:?}: the database must be a number ({form})"))?,
    };
    if segments.next().is_some() {
        return Err(format!("{shown:?} has too many path segments ({form})"));
    }
    let decode = |v: &str| crate::redact::percent_decode(v);
    let (username, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(decode(p))),
        None => (userinfo, None),
    };
    let username = (!username.is_empty()).then(|| decode(username));
    let mut spec = SentinelSpec {
        url: url.to_string(),
        sentinels,
        service: service.to_string(),
        username,
        password,
        db,
        resp3: false,
        sentinel_username: None,
        sentinel_password: None,
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "sentinel_username" => spec.sentinel_username = Some(decode(value)),
            "sentinel_password" => spec.sentinel_password = Some(decode(value)),
            "protocol" => {
                spec.resp3 = match value {
                    "2" | "resp2" => false,
                    "3" | "resp3" => true,
                    _ => return Err(format!("{shown:?}: `protocol` must be 2, 3, resp2 or resp3")),
                }
            }
            _ => {
                return Err(format!(
                    "{shown:?}: unknown option `{}` (redis+sentinel:// takes sentinel_username, \
                     sentinel_password and protocol)",
                    redact_secrets(name, url)
                ))
            }
        }
    }
    // Every address must be one the redis crate connects to.
    for s in &spec.sentinels {
        check_redis_url(&format!("redis://{s}"))
            .map_err(|e| format!("{shown:?} is not a valid Sentinel URL: {}", redact_secrets(&e, url)))?;
    }
    Ok(spec)
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
                (this.limit, this.window_ms) = (tier.rules.first().limit, tier.rules.first().window_ms);
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
        Ok(Resolved {
            cfg: self.clone(),
            backend,
            lease_size,
            refill_threshold,
            adaptive,
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
    #[cfg(feature = "redis")]
    fn sentinel_urls_parse() {
        let r = |u: &str| {
            Config {
                url: u.into(),
                ..cfg(5)
            }
            .resolve()
            .map(|r| r.backend)
        };
        let Ok(BackendSpec::Sentinel(s)) = r("redis+sentinel://al%40ice:p%3Aw@10.0.0.1:5000,h2,[::1]/mymaster/3\
             ?sentinel_username=sen&sentinel_password=s%26p&protocol=resp3")
        else {
            panic!("not a sentinel spec");
        };
        assert_eq!(s.sentinels, ["10.0.0.1:5000", "h2:26379", "[::1]:26379"]);
        assert_eq!(s.service, "mymaster");
        assert_eq!(
            (s.username.as_deref(), s.password.as_deref()),
            (Some("al@ice"), Some("p:w"))
        );
        assert_eq!((s.db, s.resp3), (3, true));
        assert_eq!(
            (s.sentinel_username.as_deref(), s.sentinel_password.as_deref()),
            (Some("sen"), Some("s&p"))
        );
        assert!(!format!("{s:?}").contains("p%3Aw"), "{s:?}");
        let Ok(BackendSpec::Sentinel(s)) = r("redis+sentinel://:pw@h:1/svc") else {
            panic!("not a sentinel spec");
        };
        assert_eq!(
            (s.username, s.password.as_deref(), s.db, s.resp3),
            (None, Some("pw"), 0, false)
        );
        for bad in [
            "redis+sentinel://",
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:1/svc/x",
            "redis+sentinel://h:1/svc/0/extra",
            "redis+sentinel://h:1/svc?db=2",
            "redis+sentinel://h:1/svc?protocol=4",
            "redis+sentinel://h:notaport/svc",
            "redis+sentinel://h:1/svc#insecure",
            "redis+sentinel://u:p@h:1/svc?sentinel_password=a@b",
            "rediss+sentinel://h:1/svc",
        ] {
            match r(bad) {
                Err(Error::Config { field: "url", .. }) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    #[cfg(feature = "redis")]
    fn tls_file_options() {
        let dir = std::env::temp_dir();
        let file = dir.join(format!("ql-tls-opt-{}.pem", std::process::id()));
        std::fs::write(&file, "x").unwrap();
        let f = file.display();
        let r = |u: String| Config { url: u, ..cfg(5) }.resolve();
        assert_eq!(
            tls_files(&format!(
                "rediss://h:1/0?ssl_certfile={f}&ssl_keyfile={f}&ssl_ca_certs={f}"
            ))
            .unwrap(),
            Some(TlsFiles {
                certfile: Some(f.to_string()),
                keyfile: Some(f.to_string()),
                ca_certs: Some(f.to_string()),
            })
        );
        assert_eq!(tls_files("rediss://h:1").unwrap(), None);
        assert!(r(format!("rediss://h:1?ssl_certfile={f}&ssl_keyfile={f}")).is_ok());
        assert!(r(format!("rediss://h:1?ssl_ca_certs={f}")).is_ok());
        for bad in [
            format!("rediss://h:1?ssl_certfile={f}"),
            format!("rediss://h:1?ssl_keyfile={f}"),
            format!("rediss://h:1?ssl_ca_certs={f}&ssl_ca_certs={f}"),
            format!("rediss://h:1?ssl_ca_certs={f}.missing"),
            "rediss://h:1?ssl_ca_certs=".to_string(),
            format!("redis://h:1?ssl_ca_certs={f}"),
            format!("rediss+cluster://a:1,b:2?ssl_ca_certs={f}"),
        ] {
            match r(bad.clone()) {
                Err(Error::Config { field: "url", reason }) => {
                    assert!(
                        !reason.contains(&f.to_string()),
                        "{bad}: the message quotes the path: {reason}"
                    )
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("a").is_ok());
        assert_eq!(validate_key("").unwrap_err().kind(), crate::ErrorKind::InvalidKey);
        assert!(validate_key(&"x".repeat(MAX_KEY_LEN + 1)).is_err());
        let sep = validate_key("k\u{1f}60000").unwrap_err();
        assert_eq!(sep.kind(), crate::ErrorKind::InvalidKey);
        assert!(sep.to_string().contains("U+001F"), "{sep}");
        assert!(
            validate_key_len("k\u{1f}60000").is_ok(),
            "the admit path's check is the length's"
        );
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
        // A raw value holding the rule separator is hashed (a valid key).
        let sep = http_key("user\u{1f}86400000");
        assert!(sep.starts_with("sha256:") && validate_key(&sep).is_ok(), "{sep}");
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("600/min").unwrap(), (600, 60_000));
        assert_eq!(parse_rate("10/s").unwrap(), (10, 1_000));
        assert_eq!(parse_rate("100/30s").unwrap(), (100, 30_000));
        assert_eq!(parse_rate(" 5000 / hour ").unwrap(), (5000, 3_600_000));
        assert_eq!(parse_rate("10/hr").unwrap(), (10, 3_600_000));
        assert_eq!(parse_rate("10/2hrs").unwrap(), (10, 7_200_000));
        assert_eq!(parse_rate("5/mins").unwrap(), (5, 60_000));
        assert_eq!(parse_rate("5/30secs").unwrap(), (5, 30_000));
        for bad in ["", "10", "x/min", "10/fortnight", "0/min", "10/0s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        // A unit in capitals or a fractional count: the error lists the units.
        for bad in ["10/MIN", "1.5/s", "10/fortnight"] {
            let e = parse_rate(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("invalid configuration: `rate` must look like \"600/min\"")
                    && e.contains("one of ms, s (sec, secs, second, seconds), m (min, mins, minute, minutes), h (hr, hrs, hour, hours), d (day, days)")
                    && e.ends_with(&format!("(got {bad:?})")),
                "{e}"
            );
        }
        assert_eq!(Mode::Exact.as_str(), "exact");
        assert_eq!(FailurePolicy::StaticShare.as_str(), "static-share");
    }
}
