//! A wrong Redis URL is a configuration error, not an outage (issue 25):
//! against real redis-servers, a wrong password, a password the server
//! wants but the URL lacks, a database index the server does not have, a
//! cluster URL at a standalone server, an ACL user without the scripts'
//! permissions and a port that answers HTTP each make `acquire` (every
//! form) and `check()` return `Error::Misconfigured` naming the host and
//! the reason, never the password, instead of a failure-policy admission.
//! A later successful answer clears it; a server that is merely down is
//! still an outage (the failure policy decides, `check()` says `backend`).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::{await_cond, unique, RedisServer};
use quotalease::{Error, ErrorKind, Limiter, Mode, Reason};

const PW: &str = "s3cret-pw-XYZ";

fn limiter(url: &str) -> Limiter {
    limiter_in(url, Mode::Lease)
}

fn limiter_in(url: &str, mode: Mode) -> Limiter {
    Limiter::builder()
        .url(url)
        .limit(100)
        .window_ms(60_000)
        .mode(mode)
        .backend_timeout_ms(1_000)
        .key_prefix(unique("mis"))
        .build()
        .expect("construction never connects, so it succeeds")
}

/// `r` is `Error::Misconfigured` whose text names `host` and says `why`,
/// without the password.
#[track_caller]
fn assert_misconfigured<T: std::fmt::Debug>(r: quotalease::Result<T>, host: &str, why: &str) {
    match r {
        Err(e @ Error::Misconfigured { .. }) => {
            assert_eq!(e.kind(), ErrorKind::Misconfigured);
            assert_eq!(e.kind().as_str(), "misconfigured");
            let text = format!("{e} / {e:?}");
            assert!(text.contains(host), "no host {host} in: {text}");
            assert!(text.contains(why), "no {why:?} in: {text}");
            assert!(!text.contains(PW), "the password shows: {text}");
        }
        other => panic!("expected Error::Misconfigured ({why}), got {other:?}"),
    }
}

/// Every form of acquire, and check(), report the misconfiguration.
#[track_caller]
fn every_call_says(l: &Limiter, host: &str, why: &str) {
    assert_misconfigured(l.check(), host, why);
    // the first acquire waits for the backend's answer and reports it
    assert_misconfigured(l.acquire("k", 1), host, why);
    // ... and so does every later one, however it is made
    assert_misconfigured(l.acquire("k", 1), host, why);
    assert_misconfigured(l.try_acquire("other", 1), host, why);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_misconfigured(rt.block_on(l.acquire_async("third", 1)), host, why);
    let (tx, rx) = std::sync::mpsc::channel();
    match l.acquire_or_notify("fourth", 1, move |r| tx.send(r).unwrap()) {
        Ok(None) => assert_misconfigured(rx.recv().unwrap(), host, why),
        other => assert_misconfigured(other, host, why),
    }
    let m = l.metrics();
    assert_eq!(
        (m.admitted, m.denied),
        (0, 0),
        "nothing was decided by a failure policy: {m:?}"
    );
}

#[test]
fn a_wrong_password_is_a_configuration_error() {
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    let host = format!("127.0.0.1:{}", redis.port);
    every_call_says(
        &limiter(&format!("redis://:{PW}@{host}")),
        &host,
        "authentication failed",
    );
    // an ACL user with another password
    redis.cli(&["ACL", "SETUSER", "alice", "on", ">another", "~*", "+@all"]);
    every_call_says(
        &limiter(&format!("redis://alice:{PW}@{host}")),
        &host,
        "authentication failed",
    );
    // no password at all
    every_call_says(&limiter(&format!("redis://{host}")), &host, "authentication required");
    // The same server with the right password: check() passes, acquire leases.
    let good = limiter(&format!("redis://:the-right-one@{host}"));
    good.check().unwrap();
    assert_eq!(good.acquire("k", 1).unwrap().reason, Reason::Lease);
}

#[test]
fn the_error_clears_when_the_server_accepts_the_url() {
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&["CONFIG", "SET", "requirepass", PW]);
    let host = format!("127.0.0.1:{}", redis.port);
    let l = limiter(&format!("redis://{host}"));
    assert_misconfigured(l.acquire("k", 1), &host, "authentication required");
    // The operator removes the password: the next probe connects, and
    // acquire leases again.
    redis.cli(&["-a", PW, "--no-auth-warning", "CONFIG", "SET", "requirepass", ""]);
    await_cond(
        "acquire leases again",
        || matches!(l.acquire("k", 1), Ok(d) if d.reason == Reason::Lease),
    );
    l.check().unwrap();
}

#[test]
fn a_database_the_server_lacks_is_a_configuration_error() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let host = format!("127.0.0.1:{}", redis.port);
    every_call_says(&limiter(&format!("redis://{host}/99")), &host, "database");
    every_call_says(
        &limiter_in(&format!("redis://{host}/99"), Mode::Exact),
        &host,
        "database",
    );
}

#[test]
fn a_cluster_url_at_a_standalone_server_is_a_configuration_error() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let host = format!("127.0.0.1:{}", redis.port);
    every_call_says(&limiter(&format!("redis+cluster://{host}")), &host, "cluster mode");
}

#[test]
fn a_user_without_the_scripts_permissions_is_a_configuration_error() {
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&[
        "ACL",
        "SETUSER",
        "noeval",
        "on",
        &format!(">{PW}"),
        "~*",
        "+@all",
        "-evalsha",
        "-eval",
    ]);
    let host = format!("127.0.0.1:{}", redis.port);
    every_call_says(&limiter(&format!("redis://noeval:{PW}@{host}")), &host, "permission");
}

/// A listener answering every connection as an HTTP server does.
fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {
                    if conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn a_port_that_does_not_speak_redis_is_a_configuration_error() {
    // No redis-server needed: the listener is this test's.
    let port = http_server();
    let host = format!("127.0.0.1:{port}");
    every_call_says(&limiter(&format!("redis://:{PW}@{host}")), &host, "Redis protocol");
    every_call_says(
        &limiter(&format!("redis://{host}/?protocol=resp3")),
        &host,
        "Redis protocol",
    );
}

#[test]
fn check_passes_on_a_good_url_and_on_memory() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let l = limiter(&redis.url());
    l.check().unwrap();
    // check() wrote nothing
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    assert_eq!(l.acquire("k", 1).unwrap().reason, Reason::Lease);
    limiter("memory://").check().unwrap();
}

#[test]
fn a_server_that_is_down_is_still_an_outage() {
    // A closed port: the failure policy decides acquire, check() says backend.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let l = limiter(&format!("redis://:{PW}@127.0.0.1:{port}"));
    match l.check() {
        Err(e @ Error::Backend(_)) => assert!(!e.to_string().contains(PW), "{e}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert_eq!(l.acquire("k", 1).unwrap().reason, Reason::Fallback);
}

#[test]
fn a_server_url_at_a_cluster_node_is_a_configuration_error() {
    let cluster = common::redis_or_skip!(common::RedisCluster::start());
    let host = format!("127.0.0.1:{}", cluster.masters()[0]);
    let l = limiter(&format!("redis://{host}"));
    // Two thirds of the keys hash to another master's slots: MOVED.
    let refused = (0..30)
        .find_map(|i| l.acquire(&format!("tenant-{i}"), 1).err())
        .expect("some key is another node's");
    match &refused {
        Error::Misconfigured { .. } => assert!(refused.to_string().contains("redis+cluster://"), "{refused}"),
        other => panic!("expected Error::Misconfigured, got {other:?}"),
    }
}

/// Everything `tracing` writes in this test binary, from every thread.
fn logs() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
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
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber per test binary");
        buf
    })
}

#[test]
fn a_misconfiguration_is_logged_once_not_per_call() {
    let logs = logs();
    let redis = common::redis_or_skip!(RedisServer::start());
    redis.cli(&["CONFIG", "SET", "requirepass", "the-right-one"]);
    let host = format!("127.0.0.1:{}", redis.port);
    let l = limiter(&format!("redis://:{PW}@{host}"));
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    l.on_event(move |e| {
        let _ = tx.lock().unwrap().send(e.kind);
    });
    for i in 0..20 {
        assert_misconfigured(l.acquire(&format!("k{i}"), 1), &host, "authentication failed");
    }
    // A hang guard, not a timing assertion: the transition's event.
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap(),
        quotalease::EventKind::Degraded
    );
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&host)).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("ERROR") && lines[0].contains("misconfigured"),
        "{}",
        lines[0]
    );
    assert!(!text.contains(PW));
}
