//! A Redis URL's credentials are never printed: `Debug` of the limiter and
//! its config, config errors, a failing connection's error text, the
//! degraded event's message and the `tracing` log lines all show the URL as
//! `redact_url` gives it (`redis://***@host:port`). Each test feeds a URL
//! whose user name and password are distinctive strings through one path and
//! asserts neither appears; each also checks that the host is still shown,
//! so an empty string cannot pass.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{await_cond, RedisServer};
use quotalease::{Error, ErrorKind, EventKind, Limiter, Reason};

const USER: &str = "alice-user-QRS";
const PW: &str = "s3cret-pw-XYZ";

fn assert_clean(what: &str, text: &str) {
    assert!(!text.contains(PW), "{what} shows the password: {text}");
    assert!(!text.contains(USER), "{what} shows the user name: {text}");
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Everything `tracing` writes in this test binary, from every thread
/// (the broker's included).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per test binary");
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

fn limiter(url: &str) -> (Limiter, Receiver<(EventKind, String)>) {
    let l = Limiter::builder()
        .url(url)
        .limit(100)
        .window_ms(60_000)
        .backend_timeout_ms(300)
        .key_prefix(common::unique("sec"))
        .build()
        .unwrap();
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    l.on_event(move |e| {
        let _ = tx.lock().unwrap().send((e.kind, e.message.clone()));
    });
    (l, rx)
}

fn degraded(rx: &Receiver<(EventKind, String)>) -> String {
    // A hang guard, not a timing assertion.
    let (kind, message) = rx.recv_timeout(Duration::from_secs(30)).expect("a degraded event");
    assert_eq!(kind, EventKind::Degraded, "{message}");
    message
}

/// A misconfiguration error's text, in both of its printed forms.
fn misconfigured_text<T: std::fmt::Debug>(r: quotalease::Result<T>) -> String {
    match r {
        Err(e @ Error::Misconfigured { .. }) => format!("{e} / {e:?}"),
        other => panic!("expected a misconfiguration error, got {other:?}"),
    }
}

/// A backend error's text, in both of its printed forms.
fn backend_error_text(r: quotalease::Result<quotalease::Inspection>) -> String {
    match r {
        Err(e @ Error::Backend(_)) => format!("{e} / {e:?}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn debug_of_the_limiter_and_its_config() {
    let url = format!("redis://{USER}:{PW}@127.0.0.1:6379/0");
    let (l, _rx) = limiter(&url);
    for (what, text) in [
        ("Debug of Limiter", format!("{l:?}")),
        ("pretty Debug of Limiter", format!("{l:#?}")),
        ("Debug of Config", format!("{:?}", l.config())),
    ] {
        assert_clean(what, &text);
        assert!(text.contains("redis://***@127.0.0.1:6379/0"), "{what}: {text}");
    }
    // The config itself keeps the real URL: only printing redacts.
    assert_eq!(l.config().url, url);
}

#[test]
fn config_errors() {
    for url in [
        format!("redis://{USER}:{PW}@127.0.0.1:notaport"),
        format!("redis://{USER}:{PW}@127.0.0.1:6379/notadb"),
        format!("redis://{USER}:{PW}@127.0.0.1:6379/?protocol={PW}"),
        format!("rediss://{USER}:{PW}@127.0.0.1:6379/#{PW}"),
        format!("redis+cluster://{USER}:{PW}@"),
        format!("redis+cluster://{USER}:{PW}@127.0.0.1:1,127.0.0.1:x"),
        format!("unix:///run/redis.sock?user={USER}&pass={PW}"),
        format!("redis+sentinel://{USER}:{PW}@127.0.0.1:26379"),
        format!("redis+sentinel://{USER}:{PW}@127.0.0.1:26379/svc?sentinel_password={PW}&bogus={PW}"),
        format!("rediss+sentinel://{USER}:{PW}@127.0.0.1:26379/svc"),
        format!("rediss://{USER}:{PW}@127.0.0.1:6379/?ssl_certfile=/{PW}.pem"),
        format!("{USER}:{PW}@127.0.0.1:6379"),
        format!("redis://{USER}:{PW}"),
    ] {
        let e = Limiter::builder().url(url.as_str()).limit(5).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        assert_clean(&format!("the error for {url}"), &format!("{e} / {e:?}"));
        assert!(e.to_string().contains("`url`"), "{e}");
    }
    // The URL given to another option is printed redacted too.
    let mut o = quotalease::Options::new();
    let e = o
        .set(
            "limit",
            quotalease::OptionValue::Str(&format!("redis://{USER}:{PW}@h:1")),
        )
        .unwrap_err();
    assert_clean("a URL given as limit", &e.to_string());
}

#[test]
fn a_failing_connection_its_event_its_error_and_its_logs() {
    let port = closed_port();
    let url = format!("redis://{USER}:{PW}@127.0.0.1:{port}/0");
    logs();
    let (l, rx) = limiter(&url);
    let d = l.acquire("k", 1).unwrap();
    assert_eq!(d.reason, Reason::Fallback, "the failure policy decides: {d:?}");
    let message = degraded(&rx);
    assert_clean("the degraded event", &message);
    assert!(message.contains("backend unreachable"), "{message}");
    let text = backend_error_text(l.inspect("k"));
    assert_clean("the inspect error", &text);
    // The log line is written before listeners hear of it.
    let shown = format!("redis://***@127.0.0.1:{port}/0");
    let logs = logged();
    assert!(logs.contains("quotalease degraded"), "{logs}");
    assert!(logs.contains(&shown), "{logs}");
    assert_clean("the tracing output", &logs);
}

#[test]
fn a_failing_cluster_connection() {
    let (a, b) = (closed_port(), closed_port());
    let url = format!("redis+cluster://{USER}:{PW}@127.0.0.1:{a},127.0.0.1:{b}");
    let (l, rx) = limiter(&url);
    assert_clean("Debug of a cluster limiter", &format!("{l:?}"));
    assert!(format!("{l:?}").contains(&format!("redis+cluster://***@127.0.0.1:{a},127.0.0.1:{b}")));
    l.acquire("k", 1).unwrap();
    assert_clean("the degraded event", &degraded(&rx));
    assert_clean("the inspect error", &backend_error_text(l.inspect("k")));
    assert_clean("the tracing output", &logged());
}

#[test]
fn a_failing_sentinel_connection() {
    let (a, b) = (closed_port(), closed_port());
    let url = format!("redis+sentinel://{USER}:{PW}@127.0.0.1:{a},127.0.0.1:{b}/svc?sentinel_password={PW}");
    let (l, rx) = limiter(&url);
    assert_clean("Debug of a sentinel limiter", &format!("{l:?}"));
    assert!(format!("{l:?}").contains(&format!(
        "redis+sentinel://***@127.0.0.1:{a},127.0.0.1:{b}/svc?sentinel_password=***"
    )));
    l.acquire("k", 1).unwrap();
    assert_clean("the degraded event", &degraded(&rx));
    assert_clean("the inspect error", &backend_error_text(l.inspect("k")));
    assert_clean("the tracing output", &logged());
}

#[test]
fn a_primary_refusing_the_password_behind_sentinel() {
    let group = common::redis_or_skip!(common::SentinelGroup::start());
    let primary = group.primary(None);
    group.cli(
        primary,
        &["ACL", "SETUSER", USER, "on", ">another-password", "~*", "+@all"],
    );
    let (l, rx) = limiter(&group.url_with(&format!("{USER}:{PW}@"), ""));
    let text = misconfigured_text(l.acquire("k", 1));
    assert_clean("the acquire error", &text);
    assert!(text.contains("authentication failed"), "{text}");
    let message = degraded(&rx);
    assert_clean("the degraded event", &message);
    assert!(message.contains("Sentinel"), "{message}");
    assert_clean("the inspect error", &misconfigured_text(l.inspect("k")));
    assert_clean("the check error", &misconfigured_text(l.check()));
    assert_clean("the tracing output", &logged());
}

#[test]
fn a_wrong_password_on_a_real_server() {
    // Redis refuses the credentials (WRONGPASS, which the redis crate
    // reports as AuthenticationFailed): a configuration error, whose every
    // printed form is as clean as a backend error's.
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&["ACL", "SETUSER", USER, "on", ">another-password", "~*", "+@all"]);
    let url = format!("redis://{USER}:{PW}@127.0.0.1:{}", redis.port);
    let (l, rx) = limiter(&url);
    let text = misconfigured_text(l.acquire("k", 1));
    assert_clean("the acquire error", &text);
    assert!(text.contains(&format!("127.0.0.1:{}", redis.port)), "{text}");
    let message = degraded(&rx);
    assert_clean("the degraded event", &message);
    assert!(message.contains("AuthenticationFailed"), "{message}");
    assert_clean("the inspect error", &misconfigured_text(l.inspect("k")));
    assert_clean("the check error", &misconfigured_text(l.check()));
    assert_clean("the tracing output", &logged());
    // With the right password the same user leases (the URL is used as given).
    let good = format!("redis://{USER}:another-password@127.0.0.1:{}", redis.port);
    let (ok, _rx) = limiter(&good);
    await_cond("a lease with the right password", || {
        ok.acquire("k", 1).unwrap().reason == quotalease::Reason::Lease
    });
    assert!(!format!("{ok:?}").contains("another-password"));
}

/// A Redis URL given to another string option (`rate`, `mode`, `tiers`,
/// `default_tier`, `overshoot_budget`, `policy_file`, a tier's rules) is
/// echoed back redacted in the config error: the error says what it got.
/// So is one without its scheme (`user:pw@host:port`).
#[test]
fn a_url_given_to_another_option_is_shown_redacted() {
    let url = format!("redis://{USER}:{PW}@db.example:6379/0");
    url_given_to_another_option(&url);
    url_given_to_another_option(&format!("{USER}:{PW}@db.example:6379"));
}

fn url_given_to_another_option(url: &str) {
    use quotalease::{OptionValue, Options};
    for name in [
        "rate",
        "mode",
        "tiers",
        "default_tier",
        "overshoot_budget",
        "on_backend_failure",
        "clock",
    ] {
        let mut o = Options::new();
        let set = o.set(name, OptionValue::Str(url)).map(|_| ());
        let built = set
            .and_then(|()| o.into_config())
            .and_then(|c| Limiter::new(c).map(|_| ()));
        let e = match built {
            Err(e) => e,
            Ok(()) => panic!("{name}: a URL was accepted"),
        };
        let text = format!("{e} {e:?}");
        assert_clean(name, &text);
        assert_eq!(e.kind(), ErrorKind::Config, "{name}: {e}");
    }
    let e = Limiter::builder().rate(url).build().unwrap_err();
    assert_clean("builder rate", &format!("{e} {e:?}"));
    assert!(e.to_string().contains("db.example"), "the host is still shown: {e}");
    let l = Limiter::builder().url("memory://").rate("10/s").build().unwrap();
    let e = l.policy_assign("k", url).unwrap_err();
    assert_clean("policy_assign", &format!("{e} {e:?}"));
    assert!(e.to_string().contains("db.example"), "the host is still shown: {e}");
}
