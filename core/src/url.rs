//! Backend URLs: which authority a `url` option names (`parse_url` into a
//! [`BackendSpec`]), including a `redis+sentinel://` URL's sentinels and
//! credentials (`SentinelSpec`) and a `rediss://` URL's certificate files
//! (`tls_files`). Every message prints the URL redacted.

use crate::error::{Error, Result};
use crate::redact::{redact_secrets, RedactedUrl};

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

#[cfg(feature = "redis")]
fn check_redis_url(url: &str) -> std::result::Result<(), String> {
    redis::Client::open(url).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(not(feature = "redis"))]
fn check_redis_url(_url: &str) -> std::result::Result<(), String> {
    Err("this build of quotalease has no Redis support (enable the crate's `redis` feature)".into())
}

/// What is wrong with a host entry's port of a `redis://`-like URL: not a
/// number from 1 to 65535 (`None`: every port is one, or absent). Names the
/// host when printing it cannot show a user name
/// ([`crate::redact::host_of_bad_port`]), never the port as written (it may
/// be a password, the `@` forgotten).
fn bad_port(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let (userinfo, hosts) = rest.rsplit_once('@').unwrap_or(("", rest));
    if userinfo.contains(['/', '?', '#']) {
        return None; // the redact rule's "unsure" case: say nothing more
    }
    let hosts = hosts.split(['/', '?', '#']).next().unwrap_or("");
    for seed in hosts.split(',') {
        let port = match seed.strip_prefix('[') {
            Some(inner) => inner.split_once(']').and_then(|(_, p)| p.strip_prefix(':')),
            None => seed.split_once(':').map(|(_, p)| p),
        };
        let Some(port) = port.filter(|p| !p.is_empty()) else {
            continue;
        };
        if port.parse::<u16>().is_ok_and(|p| p > 0) {
            continue;
        }
        let which = match crate::redact::host_of_bad_port(seed) {
            Some(host) => format!("host {host}"),
            None if port.bytes().all(|b| b.is_ascii_digit()) => {
                format!("host {}", seed.rsplit_once(':').map_or(seed, |(h, _)| h))
            }
            None => "a host entry".to_string(),
        };
        return Some(format!(
            "the port of {which} is not a number from 1 to 65535 (after the scheme comes [[USER]:PASSWORD@]HOST:PORT[/DB])"
        ));
    }
    None
}

/// The backend a URL names. Every message prints the URL redacted
/// ([`crate::redact_url`]), and the `redis` crate's reasons with the URL's
/// credentials removed.
pub(crate) fn parse_url(url: &str) -> Result<BackendSpec> {
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
            if let Some(why) = bad_port(url) {
                return Err(bad(format!("{shown:?} is not a valid cluster URL: {why}")));
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
        if let Some(why) = bad_port(url) {
            return Err(bad(format!("{shown:?} is not a valid Redis URL: {why}")));
        }
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

// Every test parses with the `redis` crate (`check_redis_url`).
#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let r = |u: &str| parse_url(u).unwrap();
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

    /// A port that is not one is named as such, with the host when it is
    /// an address or a dotted name; the text as written never shows (it
    /// may be a password with its `@` forgotten).
    #[test]
    fn a_bad_port_is_named() {
        let err = |u: &str| parse_url(u).unwrap_err().to_string();
        let e = err("redis://127.0.0.1:notaport");
        assert_eq!(
            e,
            "invalid configuration: `url` \"redis://127.0.0.1:***\" is not a valid Redis URL: the port of \
             host 127.0.0.1 is not a number from 1 to 65535 (after the scheme comes [[USER]:PASSWORD@]HOST:PORT[/DB])"
        );
        assert!(err("redis://db.example:70000/0").contains("the port of host db.example is not a number"));
        assert!(err("redis+cluster://a.example:1,b.example:x").contains("the port of host b.example"));
        assert!(err("rediss://localhost:0").contains("the port of host localhost"));
        // `redis://user:pass`, the @ forgotten: neither part shows.
        let e = err("redis://alice-user:s3cret-pw");
        assert!(e.contains("the port of a host entry is not a number"), "{e}");
        assert!(!e.contains("alice-user") && !e.contains("s3cret-pw"), "{e}");
        assert!(parse_url("redis://h:6379").is_ok() && parse_url("redis://[::1]:6379/2").is_ok());
    }

    #[test]
    fn sentinel_urls_parse() {
        let r = parse_url;
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
    fn tls_file_options() {
        let dir = std::env::temp_dir();
        let file = dir.join(format!("ql-tls-opt-{}.pem", std::process::id()));
        std::fs::write(&file, "x").unwrap();
        let f = file.display();
        let r = |u: String| parse_url(&u);
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
}
