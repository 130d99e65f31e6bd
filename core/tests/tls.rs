//! `rediss://`: the limiter leases over TLS from a real redis-server, trusting
//! the server's certificate through the system trust store (here pointed at
//! the harness' self-signed CA with SSL_CERT_FILE, as a private CA would be).

mod common;

use common::{stored_tokens, unique, TlsRedisServer};
use quotalease::{Limiter, Reason};

#[test]
fn leases_over_tls() {
    let server = common::redis_or_skip!(TlsRedisServer::start());
    // The only test in this binary: no other thread reads the environment.
    std::env::set_var("SSL_CERT_FILE", &server.ca_file);
    let p = unique("tls");
    let l = Limiter::builder()
        .url(format!("rediss://127.0.0.1:{}", server.tls_port))
        .key_prefix(&p)
        .limit(10)
        .window_ms(60_000)
        .lease_size(5)
        .backend_timeout_ms(2_000)
        .build()
        .unwrap();
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let e2 = errors.clone();
    l.on_event(move |e| e2.lock().unwrap().push(e.message.clone()));
    let d = l.acquire("k", 1).unwrap();
    assert!(
        d.allowed && d.reason == Reason::Lease,
        "{d:?} {:?}",
        errors.lock().unwrap()
    );
    assert_eq!(l.metrics().backend_errors, 0);
    // The bucket is in the server (read back over the plain port).
    assert_eq!(stored_tokens(&server.plain.cli(&["GET", &format!("{p}:{{k}}")])), 5);
    // A server whose certificate is not trusted is a backend failure, never a
    // silent plaintext fallback. (Another round-trip bound makes it another
    // backend: limiters on one URL and bound share one connection.)
    std::env::set_var("SSL_CERT_FILE", "/nonexistent");
    let untrusted = Limiter::builder()
        .url(format!("rediss://127.0.0.1:{}", server.tls_port))
        .key_prefix(&p)
        .limit(10)
        .backend_timeout_ms(2_001)
        .build()
        .unwrap();
    let d = untrusted.acquire("k2", 1).unwrap();
    assert_eq!(d.reason, Reason::Fallback);
    assert!(untrusted.metrics().backend_errors >= 1);
}
