//! The one rule for printing a backend URL: credentials never leave the
//! process in a log line, an event, an error or a `Debug`/`repr` string.
//!
//! [`redact_url`] keeps what makes a log useful (scheme, every host and
//! port, the database or socket path) and replaces what can hold a secret:
//!
//! - user info: everything between `://` and the **last** `@` becomes `***`
//!   (user name and password both, however malformed: a password with an
//!   unescaped `@` or `,` is still inside it). When that part holds `/`,
//!   `?` or `#`, which no URL the `redis` crate accepts does, the `@` may be
//!   in a path or a query value: everything after `://` becomes `***`;
//! - a host entry whose port is not a number (`redis://user:pass` with the
//!   `@` forgotten parses as host `user`, port `pass`) becomes `***`, or
//!   `HOST:***` when the part before the `:` is an address or a dotted
//!   name, which a user name is not (`redis://127.0.0.1:notaport` prints
//!   as `redis://127.0.0.1:***`, so the error can say which port is wrong);
//! - query values other than a valid `protocol` or `db` (`unix://...?pass=`,
//!   which the `redis` crate reads as a password, or any unknown parameter)
//!   become `***`, and a fragment other than `#insecure` becomes `***`.
//!
//! `redis://user:pw@h:6379/0` prints as `redis://***@h:6379/0`;
//! `redis+cluster://:pw@a:1,b:2` as `redis+cluster://***@a:1,b:2`. The rule
//! does not depend on the scheme, so a URL the limiter rejects is printed
//! under it too. [`Secrets`] applies the same rule to free text (an error
//! from the `redis` crate, an event message): it removes the credentials of
//! the configured URL wherever they appear, plus any URL written inside.

use std::fmt;

/// A query parameter printed as given: `protocol` and `db` with the values
/// the `redis` crate accepts (any other value might be something pasted in).
fn plain_param(name: &str, value: &str) -> bool {
    match name {
        "protocol" => matches!(value, "2" | "3" | "resp2" | "resp3"),
        "db" => !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    }
}

/// What replaces a secret.
const MASK: &str = "***";

/// `url` with its credentials replaced by `***` (see the module docs).
pub fn redact_url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let rest = match split_scheme(url) {
        Some((scheme, rest)) => {
            out.push_str(scheme);
            out.push_str("://");
            rest
        }
        None => url,
    };
    let parts = Parts::of(rest);
    if parts.unsure() {
        out.push_str(MASK);
        return out;
    }
    if !parts.userinfo.is_empty() {
        out.push_str(MASK);
        out.push('@');
    }
    for (i, seed) in parts.hosts.split(',').enumerate() {
        if i > 0 {
            out.push(',');
        }
        if host_is_plain(seed) {
            out.push_str(seed);
        } else if let Some(host) = host_of_bad_port(seed) {
            out.push_str(host);
            out.push(':');
            out.push_str(MASK);
        } else {
            out.push_str(MASK);
        }
    }
    out.push_str(parts.path);
    if let Some(q) = parts.query {
        out.push('?');
        for (i, pair) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, v)) if plain_param(name, v) => out.push_str(pair),
                Some((name, _)) => {
                    out.push_str(name);
                    out.push('=');
                    out.push_str(MASK);
                }
                // A bare word could be a value pasted on its own.
                None if pair.is_empty() => {}
                None => out.push_str(MASK),
            }
        }
    }
    if let Some(f) = parts.fragment {
        out.push('#');
        out.push_str(if f == "insecure" { f } else { MASK });
    }
    out
}

/// A URL that formats as [`redact_url`] gives it, with `{}` and `{:?}`
/// (the latter quoted, as `Debug` of a string): for log fields and messages.
#[derive(Clone, Copy)]
pub struct RedactedUrl<'a>(pub &'a str);

impl fmt::Display for RedactedUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(self.0))
    }
}

impl fmt::Debug for RedactedUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(self.0), f)
    }
}

/// `text` with every credential of `url` replaced by `***`, and every URL
/// written in it redacted: for messages that did not come from this crate
/// (errors of the `redis` crate) and may echo what they were given.
pub fn redact_secrets(text: &str, url: &str) -> String {
    Secrets::of([url]).scrub(text)
}

/// The credentials of one or more URLs, to remove from free text.
#[derive(Clone, Debug, Default)]
pub(crate) struct Secrets {
    /// Longest first, so a whole user info goes before its pieces.
    words: Vec<String>,
}

/// User names shorter than this are not searched for in free text (a
/// one-letter name would mask every such letter); passwords always are.
const MIN_NAME_LEN: usize = 3;

impl Secrets {
    pub fn of<'a>(urls: impl IntoIterator<Item = &'a str>) -> Self {
        let mut words = Vec::new();
        let mut add = |w: &str, always: bool| {
            if w.is_empty() || (!always && w.len() < MIN_NAME_LEN) {
                return;
            }
            for v in [w.to_string(), percent_decode(w)] {
                if !words.contains(&v) {
                    words.push(v);
                }
            }
        };
        for url in urls {
            let rest = split_scheme(url).map_or(url, |(_, r)| r);
            let parts = Parts::of(rest);
            if parts.unsure() {
                // The last @ may sit in the path or the query: anything
                // after it may be a secret too.
                add(rest, true);
                for piece in rest.split([':', '@', '/', '?', '#', '&', '=', ',']) {
                    add(piece, false);
                }
            }
            if !parts.userinfo.is_empty() {
                add(parts.userinfo, true);
                match parts.userinfo.split_once(':') {
                    Some((user, pass)) => {
                        add(user, false);
                        add(pass, true);
                    }
                    None => add(parts.userinfo, true),
                }
            }
            for seed in parts.hosts.split(',').filter(|s| !host_is_plain(s)) {
                add(seed, true);
                if let Some((_, port)) = seed.split_once(':') {
                    add(port, true);
                }
            }
            for pair in parts.query.unwrap_or("").split('&') {
                match pair.split_once('=') {
                    Some((name, v)) if !plain_param(name, v) => add(v, true),
                    None => add(pair, true),
                    _ => {}
                }
            }
            if let Some(f) = parts.fragment.filter(|f| *f != "insecure") {
                add(f, true);
            }
        }
        words.sort_by_key(|w| std::cmp::Reverse(w.len()));
        Secrets { words }
    }

    /// `text` with each secret replaced by `***` and each URL in it redacted.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for w in &self.words {
            if out.contains(w.as_str()) {
                out = out.replace(w.as_str(), MASK);
            }
        }
        redact_urls_in(&out)
    }
}

/// Every `scheme://...` token of `text` (up to whitespace or a quote)
/// passed through [`redact_url`].
pub(crate) fn redact_urls_in(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .rfind(|c: char| !is_scheme_char(c))
            .map_or(0, |j| j + rest[j..].chars().next().map_or(1, char::len_utf8));
        let len = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
            .unwrap_or(rest.len() - i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..i + len]));
        rest = &rest[i + len..];
    }
    out.push_str(rest);
    out
}

/// `text` (a configuration error) with every `scheme://...` token redacted
/// ([`redact_urls_in`]) and every `"..."`-quoted value that holds `@`
/// passed through [`redact_url`]: a value the error echoes back may be a
/// Redis URL without its scheme (`user:pw@host:6379`) given to the wrong
/// option. Quotes are Rust's `{:?}` quotes (a `\"` inside does not end one).
pub(crate) fn redact_config_text(text: &str) -> String {
    let text = redact_urls_in(text);
    if !text.contains('@') {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('"') {
        let inner = &rest[open + 1..];
        let mut escaped = false;
        let close = inner.char_indices().find_map(|(i, c)| match (escaped, c) {
            (false, '\\') => {
                escaped = true;
                None
            }
            (false, '"') => Some(i),
            _ => {
                escaped = false;
                None
            }
        });
        let Some(close) = close else { break };
        let value = &inner[..close];
        out.push_str(&rest[..=open]);
        out.push_str(&if value.contains('@') && !is_calendar_rule(value) {
            redact_url(value)
        } else {
            value.to_string()
        });
        out.push('"');
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    out
}

/// `"1000/month@Europe/Berlin"`, `"5/day@UTC, 1/s"`: rules with calendar
/// quotas (each `@` after a count, a `/` and a unit; no `:`), which a
/// configuration error may quote and which hold no credentials.
fn is_calendar_rule(value: &str) -> bool {
    !value.contains(':')
        && value.split(',').all(|rule| match rule.split_once('@') {
            None => true,
            Some((rate, _)) => rate.split_once('/').is_some_and(|(n, unit)| {
                let n = n.trim().trim_start_matches("shadow").trim();
                !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && unit.trim().bytes().all(|b| b.is_ascii_lowercase())
            }),
        })
}

fn is_scheme_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')
}

/// `(scheme, rest)` when `url` starts with a well-formed `scheme://`.
fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(is_scheme_char);
    ok.then_some((scheme, rest))
}

/// What follows `scheme://`, cut where a redis URL can carry a secret.
struct Parts<'a> {
    /// Everything before the last `@` ("" when there is none).
    userinfo: &'a str,
    /// Host entries, `,`-separated (cluster seed lists).
    hosts: &'a str,
    /// From the first `/` after the hosts, up to `?` or `#`.
    path: &'a str,
    query: Option<&'a str>,
    fragment: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn of(rest: &'a str) -> Self {
        let (userinfo, after) = match rest.rfind('@') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => ("", rest),
        };
        let (hosts, tail) = after.split_at(after.find(['/', '?', '#']).unwrap_or(after.len()));
        let (tail, fragment) = match tail.split_once('#') {
            Some((t, f)) => (t, Some(f)),
            None => (tail, None),
        };
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (tail, None),
        };
        Parts {
            userinfo,
            hosts,
            path,
            query,
            fragment,
        }
    }

    /// The user info holds `/`, `?` or `#`: no URL the `redis` crate
    /// accepts looks like this (they end the authority), so the last `@` may
    /// sit in a path or query value and nothing after it is known to be a host.
    fn unsure(&self) -> bool {
        self.userinfo.contains(['/', '?', '#'])
    }
}

/// A host entry that cannot hold a secret: a name or address with no port
/// or a numeric one (`h`, `h:6379`, `[::1]:6379`).
fn host_is_plain(seed: &str) -> bool {
    let port = match seed.strip_prefix('[') {
        Some(inner) => match inner.split_once(']') {
            Some((addr, "")) if is_ip6(addr) => return true,
            Some((addr, rest)) if is_ip6(addr) => match rest.strip_prefix(':') {
                Some(port) => port,
                None => return false,
            },
            _ => return false,
        },
        None => match seed.split_once(':') {
            Some((_, port)) => port,
            None => return true,
        },
    };
    port.bytes().all(|b| b.is_ascii_digit())
}

/// The host of an entry `HOST:PORT` whose port is not a number, when the
/// host is an IP address, `localhost` or a dotted name: a user name written
/// where the host goes (`redis://user:pass`, the `@` forgotten) is none of
/// these, so it stays masked.
pub(crate) fn host_of_bad_port(seed: &str) -> Option<&str> {
    if host_is_plain(seed) {
        return None;
    }
    let (host, _) = match seed.strip_prefix('[') {
        Some(inner) => {
            let (addr, _) = inner.split_once(']')?;
            return is_ip6(addr).then(|| &seed[..addr.len() + 2]);
        }
        None => seed.split_once(':')?,
    };
    let name = |h: &str| {
        !h.is_empty()
            && h.split('.').count() >= 2
            && h.split('.')
                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    (host == "localhost" || name(host)).then_some(host)
}

fn is_ip6(addr: &str) -> bool {
    addr.chars().all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
}

/// `%XX` escapes decoded (invalid ones kept as written).
pub(crate) fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "s3cret-pw-XYZ";
    const USER: &str = "alice-user";

    /// Every URL form the limiter accepts, those the `redis` crate parses
    /// and malformed ones; each must print without its secrets.
    fn forms() -> Vec<(String, &'static str)> {
        vec![
            (
                format!("redis://{USER}:{PW}@h.example:6379/0"),
                "redis://***@h.example:6379/0",
            ),
            (format!("redis://:{PW}@h.example"), "redis://***@h.example"),
            (format!("redis://{USER}@h.example:1"), "redis://***@h.example:1"),
            (
                format!("rediss://{USER}:{PW}@h.example:6380/2"),
                "rediss://***@h.example:6380/2",
            ),
            (
                format!("rediss://{USER}:{PW}@h.example:6380/#insecure"),
                "rediss://***@h.example:6380/#insecure",
            ),
            (
                format!("redis://{USER}:{PW}@h.example:6379/?protocol=resp3"),
                "redis://***@h.example:6379/?protocol=resp3",
            ),
            (
                format!("redis+cluster://{USER}:{PW}@10.0.0.1:7000,10.0.0.2:7001"),
                "redis+cluster://***@10.0.0.1:7000,10.0.0.2:7001",
            ),
            (
                format!("rediss+cluster://:{PW}@a:1,b:2/?protocol=3"),
                "rediss+cluster://***@a:1,b:2/?protocol=3",
            ),
            // Credentials on every seed: all of it goes (hosts before the last @ too).
            (
                format!("redis+cluster://{USER}:{PW}@a:1,{USER}:{PW}@b:2"),
                "redis+cluster://***@b:2",
            ),
            ("redis://[::1]:6379".into(), "redis://[::1]:6379"),
            (format!("redis://{USER}:{PW}@[::1]:6379/3"), "redis://***@[::1]:6379/3"),
            // unix sockets: the redis crate reads ?user= and ?pass=.
            (
                format!("unix:///run/redis.sock?db=1&user={USER}&pass={PW}"),
                "unix:///run/redis.sock?db=1&user=***&pass=***",
            ),
            (
                format!("redis+unix:///run/redis.sock?pass={PW}"),
                "redis+unix:///run/redis.sock?pass=***",
            ),
            (format!("redis://h:1/?password={PW}"), "redis://h:1/?password=***"),
            (
                format!("redis://h:1/?protocol={PW}&db=2"),
                "redis://h:1/?protocol=***&db=2",
            ),
            (format!("unix:///s.sock?db={PW}"), "unix:///s.sock?db=***"),
            (format!("redis://h:1/?{PW}"), "redis://h:1/?***"),
            (format!("redis://h:1/#{PW}"), "redis://h:1/#***"),
            // Malformed: the @ forgotten (host "user", port "pass"), an
            // unescaped @ / # in the password, a bad port, no scheme.
            (format!("redis://{USER}:{PW}"), "redis://***"),
            (format!("redis://:{PW}"), "redis://***"),
            (format!("redis://{USER}:{PW}/0"), "redis://***/0"),
            (format!("redis://{USER}:pa@ss/{PW}@h:1"), "redis://***"),
            (format!("redis://:{PW}#x@h:1/0"), "redis://***"),
            (format!("redis://:{PW}@h:notaport"), "redis://***@***"),
            // A bad port after an address or a dotted name: the host shows.
            ("redis://127.0.0.1:notaport".into(), "redis://127.0.0.1:***"),
            (format!("redis://:{PW}@db.example:{PW}"), "redis://***@db.example:***"),
            ("redis://localhost:6379x".into(), "redis://localhost:***"),
            ("redis://[::1]:x".into(), "redis://[::1]:***"),
            (format!("redis:/:{PW}@h:1"), "***"),
            (format!("{USER}:{PW}@h:1"), "***@h:1"),
            (format!("{USER}:{PW}"), "***"),
            (format!("http://{USER}:{PW}@h"), "http://***@h"),
            (format!("redis://h:1/?x=a@{PW}"), "redis://***"),
            (format!("redis://:{PW}@h:1/?pass=x@{PW}"), "redis://***"),
            (
                format!("redis+sentinel://:{PW}@s1:26379,s2:26379/mymaster"),
                "redis+sentinel://***@s1:26379,s2:26379/mymaster",
            ),
            (
                format!(
                    "redis+sentinel://{USER}:{PW}@10.0.0.1:26379,[::1]:26380,s3/svc/2\
                     ?sentinel_username={USER}&sentinel_password={PW}&protocol=3"
                ),
                "redis+sentinel://***@10.0.0.1:26379,[::1]:26380,s3/svc/2\
                 ?sentinel_username=***&sentinel_password=***&protocol=3",
            ),
            (
                format!("redis+sentinel://h1,h2/svc?sentinel_password={PW}"),
                "redis+sentinel://h1,h2/svc?sentinel_password=***",
            ),
            // Client certificate files of rediss:// (paths, masked as any other value).
            (
                format!("rediss://:{PW}@h:6380?ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_ca_certs=/ca.pem"),
                "rediss://***@h:6380?ssl_certfile=***&ssl_keyfile=***&ssl_ca_certs=***",
            ),
            // No secrets: printed as given.
            ("redis://127.0.0.1:6379".into(), "redis://127.0.0.1:6379"),
            ("redis://h".into(), "redis://h"),
            ("memory://".into(), "memory://"),
            ("memory://shared".into(), "memory://shared"),
            ("memory:/x".into(), "memory:/x"),
            ("".into(), ""),
        ]
    }

    #[test]
    fn every_form_prints_without_its_secrets() {
        for (url, want) in forms() {
            let got = redact_url(&url);
            assert!(!got.contains(PW), "{url} -> {got}");
            assert!(!got.contains(USER), "{url} -> {got}");
            assert_eq!(got, want, "{url}");
            assert_eq!(RedactedUrl(&url).to_string(), want);
            assert_eq!(format!("{:?}", RedactedUrl(&url)), format!("{want:?}"));
        }
    }

    #[test]
    fn secrets_leave_free_text() {
        let url = format!("redis://{USER}:{PW}@h:6379/?pass=q-secret-42");
        let text = format!(
            "failed: auth {PW} for {USER} (encoded s3cret%2Dpw%2DXYZ) at redis://{USER}:{PW}@h:6379 q-secret-42"
        );
        let got = Secrets::of([url.as_str()]).scrub(&text);
        assert!(
            !got.contains(PW) && !got.contains(USER) && !got.contains("q-secret-42"),
            "{got}"
        );
        assert!(got.contains("redis://***@h:6379"), "{got}");
        // Percent-encoded credentials in the URL are found decoded in text.
        let enc = "redis://us%65r:p%40ss-w0rd@h";
        let got = redact_secrets("user p@ss-w0rd", enc);
        assert_eq!(got, "*** ***");
        // A sentinel URL's secrets: the primary's and the sentinels' own.
        let sentinel = format!("redis+sentinel://{USER}:{PW}@s1,s2/svc?sentinel_password=q-secret-42");
        let got = Secrets::of([sentinel.as_str()]).scrub(&format!("AUTH {USER} {PW} then q-secret-42"));
        assert_eq!(got, "AUTH *** *** then ***");
        // Short user names are kept (they would mask every such letter).
        assert_eq!(redact_secrets("a word", "redis://a:zz@h"), "a word");
        assert_eq!(redact_secrets("a zz word", "redis://a:zz@h"), "a *** word");
        // Text without secrets or URLs is unchanged.
        assert_eq!(
            redact_secrets("Connection refused (os error 111)", &url),
            "Connection refused (os error 111)"
        );
    }

    #[test]
    fn urls_inside_text_are_redacted() {
        let got = redact_urls_in(&format!("x \"redis://:{PW}@h:1\" and (rediss://u:{PW}@h2) end"));
        assert_eq!(got, "x \"redis://***@h:1\" and (rediss://***@h2) end");
        assert_eq!(redact_urls_in("no url here"), "no url here");
        assert_eq!(redact_urls_in("://x"), "://x");
    }

    #[test]
    fn quoted_values_with_an_at_sign_are_redacted() {
        let got = redact_config_text(&format!(
            "`rate` must look like \"600/min\" (got \"alice:{PW}@h:6379\"), \"a\\\"b\" and \"redis://u:{PW}@h\""
        ));
        assert_eq!(
            got,
            "`rate` must look like \"600/min\" (got \"***@h:6379\"), \"a\\\"b\" and \"redis://***@h\""
        );
        // An escaped quote does not end the value; an unclosed quote is left as is.
        assert_eq!(redact_config_text(&format!("\"x\\\"{PW}@h\"")), "\"***@h\"");
        assert_eq!(redact_config_text("an \"open quote"), "an \"open quote");
        assert_eq!(redact_config_text("mail me@x"), "mail me@x");
        // Calendar rules quoted in an error are not URLs; a URL still is.
        let rules = "\"10/month@UTC\" or \"shadow 5/day@Europe/Berlin, 1/s\"";
        assert_eq!(redact_config_text(rules), rules);
        assert_eq!(redact_config_text(&format!("\"u:{PW}@h/x\"")), "\"***@h/x\"");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%40b%2"), "a@b%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
        assert_eq!(percent_decode("plain"), "plain");
    }
}
