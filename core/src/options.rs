//! Options by name: the one place where an option's name, the type of its
//! value and the rules between options live. Every binding (Python keyword
//! arguments, a Node options object, the C ABI's `lease_options_set`, Go)
//! hands names and values to [`Options::set`] and builds with
//! [`Options::into_config`], so the same mistake reads the same way in
//! every language.
//!
//! Names are snake_case (`lease_size`); camelCase (`leaseSize`) is accepted
//! too, for Node and Go. Rules kept here:
//! - `rate` ("600/min") and `limit`/`window_ms` are alternatives: giving both
//!   is an error (never a silent override).
//! - One option under two spellings (`window_ms` and `windowMs`) is an error
//!   naming both (never a silent override); setting the same spelling again
//!   replaces the value, as a C caller may do.
//! - `clock = "manual"` starts at [`MANUAL_CLOCK_START_MS`] unless
//!   `clock_start_ms` says otherwise; `clock_start_ms` needs the manual clock.
//! - A null value (Python `None`, JS `undefined`/`null`) leaves the default.

use crate::config::{ClockKind, Config};
use crate::error::{Error, Result};
pub use crate::option_names::OPTION_NAMES;

/// Where a manual clock starts unless told otherwise (as in the
/// conformance vectors; non-zero, so no reading is ever mistaken for "never").
pub const MANUAL_CLOCK_START_MS: u64 = 1_000_000;

/// An option's value as a binding received it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionValue<'a> {
    /// Leave the default (None, undefined, null).
    Null,
    /// An integer (Python int, a Go/C integer). Negative values are rejected
    /// with the option's name.
    Int(i128),
    /// A number that may not be whole (JavaScript): accepted when whole.
    Float(f64),
    /// A string.
    Str(&'a str),
    /// A boolean (Python, JavaScript, Go `bool`).
    Bool(bool),
}

impl OptionValue<'_> {
    fn describe(&self) -> String {
        match self {
            OptionValue::Null => "null".into(),
            OptionValue::Int(i) => i.to_string(),
            OptionValue::Float(f) => f.to_string(),
            OptionValue::Bool(b) => b.to_string(),
            // A URL given to the wrong option is still printed redacted.
            OptionValue::Str(s) if s.contains(['@', ':']) => format!("{:?}", crate::RedactedUrl(s)),
            OptionValue::Str(s) => format!("{s:?}"),
        }
    }
}

/// A configuration being assembled option by option.
#[derive(Clone, Debug)]
pub struct Options {
    cfg: Config,
    rate: Option<String>,
    limit_set: bool,
    window_set: bool,
    manual_clock: bool,
    clock_start_ms: Option<u64>,
    /// The spelling each option was first given in (canonical name, as given).
    spelled: Vec<(&'static str, Box<str>)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cfg: Config::defaults(),
            rate: None,
            limit_set: false,
            window_set: false,
            manual_clock: false,
            clock_start_ms: None,
            spelled: Vec::new(),
        }
    }
}

/// The option's canonical (snake_case) name, if it is one.
fn canonical(name: &str) -> Option<&'static str> {
    let snake = to_snake(name);
    OPTION_NAMES.iter().copied().find(|n| *n == snake)
}

fn to_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn to_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut up = false;
    for c in name.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.push(c.to_ascii_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Edit distance (insertions, deletions, substitutions), for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known option closest to `name` (within a third of its length), in
/// `name`'s spelling style.
pub fn suggest(name: &str) -> Option<String> {
    let snake = to_snake(name).to_ascii_lowercase().replace('-', "_");
    // A name that is part of an option ("timeout") or holds one.
    let part = OPTION_NAMES
        .iter()
        .copied()
        .filter(|n| snake.len() >= 4 && (n.contains(&snake) || snake.contains(n)))
        .min_by_key(|n| n.len());
    let near = || {
        OPTION_NAMES
            .iter()
            .map(|n| (*n, distance(&snake, n)))
            .min_by_key(|(_, d)| *d)
            .filter(|(n, d)| *d <= (n.len() / 3).max(2))
            .map(|(n, _)| n)
    };
    let best = part.or_else(near)?;
    Some(if name.contains('_') || !name.chars().any(|c| c.is_ascii_uppercase()) {
        best.to_string()
    } else {
        to_camel(best)
    })
}

fn int(field: &'static str, v: OptionValue<'_>) -> Result<u64> {
    let n = match v {
        OptionValue::Int(i) => i,
        OptionValue::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 2f64.powi(64) => f as i128,
        other => {
            return Err(Error::config(
                field,
                format!("must be a whole number (got {})", other.describe()),
            ))
        }
    };
    u64::try_from(n).map_err(|_| Error::config(field, format!("must be a non-negative integer below 2^64 (got {n})")))
}

/// A yes/no option: a boolean, 0 or 1 (C), or `"true"`/`"false"` (an
/// environment variable's text).
fn boolean(field: &'static str, v: OptionValue<'_>) -> Result<bool> {
    match v {
        OptionValue::Bool(b) => Ok(b),
        OptionValue::Int(0) | OptionValue::Str("false") => Ok(false),
        OptionValue::Int(1) | OptionValue::Str("true") => Ok(true),
        other => Err(Error::config(
            field,
            format!("must be true or false (got {})", other.describe()),
        )),
    }
}

fn string<'a>(field: &'static str, v: OptionValue<'a>) -> Result<&'a str> {
    match v {
        OptionValue::Str(s) => Ok(s),
        other => Err(Error::config(
            field,
            format!("must be a string (got {})", other.describe()),
        )),
    }
}

impl Options {
    /// Every option at its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set one option by name (snake_case or camelCase). A null value
    /// leaves the default. Unknown names fail with a suggestion.
    pub fn set(&mut self, name: &str, value: OptionValue<'_>) -> Result<&mut Self> {
        let Some(field) = canonical(name) else {
            return Err(Error::UnknownOption {
                name: name.into(),
                suggestion: suggest(name).map(String::into_boxed_str),
            });
        };
        if value == OptionValue::Null {
            return Ok(self);
        }
        let seen = match self.spelled.iter().find(|(f, _)| *f == field) {
            Some((_, first)) if **first != *name => {
                return Err(Error::config(
                    field,
                    format!(
                        "was given twice, as `{first}` and as `{name}` (two spellings of one option): give it once"
                    ),
                ));
            }
            Some(_) => true,
            None => false,
        };
        let c = &mut self.cfg;
        match field {
            "url" => c.url = string(field, value)?.to_string(),
            "limit" => {
                c.limit = int(field, value)?;
                self.limit_set = true;
            }
            "window_ms" => {
                c.window_ms = int(field, value)?;
                self.window_set = true;
            }
            "rate" => self.rate = Some(string(field, value)?.to_string()),
            "lease_size" => c.lease_size = Some(int(field, value)?),
            "overshoot_budget" => {
                c.overshoot_budget = match value {
                    OptionValue::Str(s) => s.parse()?,
                    v => crate::config::Budget::Tokens(int(field, v)?),
                }
            }
            "refill_threshold" => c.refill_threshold = Some(int(field, value)?),
            "lease_ttl_ms" => c.lease_ttl_ms = int(field, value)?,
            "on_backend_failure" => c.on_backend_failure = string(field, value)?.parse()?,
            "expected_replicas" => c.expected_replicas = int(field, value)?,
            "concurrency" => c.concurrency = int(field, value)?,
            "backend_timeout_ms" => c.backend_timeout_ms = int(field, value)?,
            "key_prefix" => c.key_prefix = string(field, value)?.to_string(),
            "max_keys" => {
                c.max_keys = usize::try_from(int(field, value)?)
                    .map_err(|_| Error::config("max_keys", "is too large for this platform"))?
            }
            "mode" => c.mode = string(field, value)?.parse()?,
            "clock" => {
                self.manual_clock = match string(field, value)? {
                    "system" => false,
                    "manual" => true,
                    other => {
                        return Err(Error::config(
                            "clock",
                            format!("must be one of \"system\" \"manual\" (got {other:?})"),
                        ))
                    }
                }
            }
            "clock_start_ms" => self.clock_start_ms = Some(int(field, value)?),
            "tiers" => c.tiers = crate::policy::parse_tiers(string(field, value)?)?,
            "default_tier" => c.default_tier = Some(string(field, value)?.to_string()),
            "policy_file" => c.policy_file = Some(string(field, value)?.to_string()),
            "policy_refresh_ms" => c.policy_refresh_ms = int(field, value)?,
            "shadow" => c.shadow = boolean(field, value)?,
            _ => unreachable!("every name in OPTION_NAMES is handled"),
        }
        // Only once the value is accepted: a failed set changes nothing.
        if !seen {
            self.spelled.push((field, name.into()));
        }
        Ok(self)
    }

    /// Add plan tier `name` with `rules` (`"6000/min, 1000000/day"`) to
    /// those of the `tiers` option.
    pub fn tier(&mut self, name: &str, rules: &str) -> Result<&mut Self> {
        let name = name.trim();
        crate::policy::validate_tier_name(name)?;
        if self.cfg.tiers.iter().any(|t| t.name == name) {
            return Err(Error::config("tiers", format!("names tier {name:?} twice")));
        }
        self.cfg.tiers.push(crate::policy::Tier {
            name: name.to_string(),
            rules: crate::policy::Rules::parse(rules, "tiers")?,
        });
        Ok(self)
    }

    /// Apply the rules between options and return the configuration (not
    /// yet validated: [`crate::Limiter::new`] does that).
    pub fn into_config(self) -> Result<Config> {
        let mut cfg = self.cfg;
        if let Some(rate) = &self.rate {
            if self.limit_set || self.window_set {
                return Err(Error::config(
                    "rate",
                    "cannot be combined with `limit` or `window_ms`: give either `rate` (\"600/min\") or `limit` and `window_ms`",
                ));
            }
            let q = crate::rate::parse_quota(rate)?;
            (cfg.limit, cfg.window_ms, cfg.calendar) = (q.limit, q.window_ms, q.calendar);
        }
        match (self.manual_clock, self.clock_start_ms) {
            (true, start) => {
                cfg.clock = ClockKind::Manual {
                    start_ms: start.unwrap_or(MANUAL_CLOCK_START_MS),
                }
            }
            (false, Some(_)) => {
                return Err(Error::config("clock_start_ms", "needs `clock` = \"manual\""));
            }
            (false, None) => cfg.clock = ClockKind::System,
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FailurePolicy, Mode};
    use crate::ErrorKind;
    use OptionValue::*;

    fn build(pairs: &[(&str, OptionValue<'_>)]) -> Result<Config> {
        let mut o = Options::new();
        for (n, v) in pairs {
            o.set(n, *v)?;
        }
        o.into_config()
    }

    #[test]
    fn shadow_takes_a_boolean_in_any_language_form() {
        for (v, want) in [
            (Bool(true), true),
            (Int(1), true),
            (Str("true"), true),
            (Bool(false), false),
            (Int(0), false),
            (Str("false"), false),
            (Null, false),
        ] {
            let c = build(&[("limit", Int(5)), ("shadow", v)]).unwrap();
            assert_eq!(c.shadow, want, "{v:?}");
        }
        for bad in [Int(2), Str("yes"), Float(0.5)] {
            let e = build(&[("limit", Int(5)), ("shadow", bad)]).unwrap_err();
            assert!(e.to_string().contains("`shadow` must be true or false"), "{e}");
        }
    }

    #[test]
    fn every_option_is_set_by_name_in_either_case() {
        let c = build(&[
            ("url", Str("memory://x")),
            ("limit", Int(10)),
            ("windowMs", Float(2000.0)),
            ("lease_size", Int(3)),
            ("refillThreshold", Int(1)),
            ("lease_ttl_ms", Int(500)),
            ("on_backend_failure", Str("deny")),
            ("expectedReplicas", Int(4)),
            ("backend_timeout_ms", Int(100)),
            ("key_prefix", Str("p")),
            ("maxKeys", Int(7)),
            ("mode", Str("exact")),
            ("clock", Str("manual")),
            ("tiers", Str("free=10/s; pro=100/s, 1000/day")),
            ("defaultTier", Str("free")),
            ("policy_file", Str("/etc/quotalease.toml")),
            ("policyRefreshMs", Int(250)),
            ("shadow", Bool(true)),
            ("concurrency", Int(5)),
        ])
        .unwrap();
        assert!(c.shadow);
        assert_eq!(c.concurrency, 5);
        assert_eq!(c.url, "memory://x");
        assert_eq!(c.tiers.len(), 2);
        assert_eq!(c.tiers[1].rules.to_string(), "100/s, 1000/day");
        assert_eq!(c.default_tier.as_deref(), Some("free"));
        assert_eq!(c.policy_file.as_deref(), Some("/etc/quotalease.toml"));
        assert_eq!(c.policy_refresh_ms, 250);
        assert_eq!((c.limit, c.window_ms), (10, 2000));
        assert_eq!((c.lease_size, c.refill_threshold), (Some(3), Some(1)));
        assert_eq!(c.lease_ttl_ms, 500);
        assert_eq!(c.on_backend_failure, FailurePolicy::Deny);
        assert_eq!((c.expected_replicas, c.backend_timeout_ms), (4, 100));
        assert_eq!((c.key_prefix.as_str(), c.max_keys, c.mode), ("p", 7, Mode::Exact));
        assert_eq!(
            c.clock,
            ClockKind::Manual {
                start_ms: MANUAL_CLOCK_START_MS
            }
        );
        assert_eq!(OPTION_NAMES.len(), 22);
    }

    #[test]
    fn two_spellings_of_one_option_are_an_error_naming_both() {
        let e = build(&[("limit", Int(10)), ("windowMs", Int(2000)), ("window_ms", Int(1000))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(
            e.to_string(),
            "invalid configuration: `window_ms` was given twice, as `windowMs` and as `window_ms` \
             (two spellings of one option): give it once"
        );
        let e = build(&[("lease_size", Int(3)), ("leaseSize", Int(4))]).unwrap_err();
        assert!(e.to_string().contains("as `lease_size` and as `leaseSize`"), "{e}");
        // A null value sets nothing, so the other spelling is the only one.
        assert_eq!(
            build(&[("window_ms", Null), ("windowMs", Int(2000)), ("limit", Int(1))])
                .unwrap()
                .window_ms,
            2000
        );
        // The same spelling again replaces the value (a C caller's second set).
        assert_eq!(build(&[("limit", Int(1)), ("limit", Int(5))]).unwrap().limit, 5);
        // A rejected value records no spelling: the other one is still free.
        let mut o = Options::new();
        assert!(o.set("windowMs", Str("soon")).is_err());
        o.set("window_ms", Int(1000)).unwrap();
        o.set("limit", Int(1)).unwrap();
        assert_eq!(o.into_config().unwrap().window_ms, 1000);
    }

    #[test]
    fn rate_and_limit_are_alternatives() {
        let c = build(&[("rate", Str("600/min"))]).unwrap();
        assert_eq!((c.limit, c.window_ms), (600, 60_000));
        for other in ["limit", "window_ms"] {
            let e = build(&[("rate", Str("600/min")), (other, Int(5))]).unwrap_err();
            assert!(matches!(e, Error::Config { field: "rate", .. }), "{e}");
        }
        // null leaves the default and does not count as given
        assert!(build(&[("rate", Str("6/s")), ("limit", Null)]).is_ok());
    }

    #[test]
    fn manual_clock_start() {
        let c = build(&[("limit", Int(1)), ("clock", Str("manual")), ("clock_start_ms", Int(0))]).unwrap();
        assert_eq!(c.clock, ClockKind::Manual { start_ms: 0 });
        let e = build(&[("limit", Int(1)), ("clock_start_ms", Int(5))]).unwrap_err();
        assert!(matches!(
            e,
            Error::Config {
                field: "clock_start_ms",
                ..
            }
        ));
        let e = build(&[("clock", Str("sundial"))]).unwrap_err();
        assert!(matches!(e, Error::Config { field: "clock", .. }));
    }

    #[test]
    fn bad_values_name_their_option() {
        for (name, v) in [
            ("limit", Int(-1)),
            ("limit", Float(1.5)),
            ("limit", Str("10")),
            ("limit", Float(f64::NAN)),
            ("url", Int(3)),
            ("mode", Str("sideways")),
            ("max_keys", Int(i128::from(u64::MAX) + 1)),
        ] {
            let e = build(&[(name, v)]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{name} {v:?}");
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn unknown_names_get_a_suggestion_in_their_own_style() {
        let e = build(&[("lease_sise", Int(3))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(
            e.to_string(),
            "invalid configuration: unknown option `lease_sise`; did you mean `lease_size`?"
        );
        assert_eq!(suggest("leaseSise").as_deref(), Some("leaseSize"));
        assert_eq!(suggest("timeout").as_deref(), Some("backend_timeout_ms"));
        assert_eq!(suggest("limt").as_deref(), Some("limit"));
        let e = build(&[("banana", Int(3))]).unwrap_err();
        assert!(e.to_string().contains("the options are url, limit"), "{e}");
    }
}
