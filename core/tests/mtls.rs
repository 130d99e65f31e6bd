//! Mutual TLS: `rediss://…?ssl_certfile=…&ssl_keyfile=…&ssl_ca_certs=…` against
//! a real redis-server that asks every TLS client for a certificate signed by
//! its CA (tests/harness/redisctl start-mtls, certificates made with the
//! openssl CLI). With the client certificate the limiter leases; without
//! one, or with a certificate the server's CA did not sign (made here with
//! openssl), the handshake fails and the failure policy applies, never a
//! plaintext fallback. The CA comes from `ssl_ca_certs`, not the
//! environment, so this binary can run its tests in parallel.

mod common;

use std::process::Command;

use common::{stored_tokens, unique, MtlsRedisServer};
use quotalease::{Limiter, Reason};

fn limiter(url: &str, prefix: &str, timeout_ms: u64) -> Limiter {
    Limiter::builder()
        .url(url)
        .key_prefix(prefix)
        .limit(10)
        .window_ms(60_000)
        .lease_size(5)
        .backend_timeout_ms(timeout_ms)
        .build()
        .unwrap()
}

#[test]
fn leases_with_a_client_certificate_and_only_with_one_the_ca_signed() {
    let server = common::redis_or_skip!(MtlsRedisServer::start());
    let base = format!(
        "rediss://127.0.0.1:{}/?ssl_ca_certs={}",
        server.tls_port, server.ca_file
    );
    let p = unique("mtls");
    let good = limiter(
        &format!(
            "{base}&ssl_certfile={}&ssl_keyfile={}",
            server.client_cert, server.client_key
        ),
        &p,
        2_000,
    );
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let e2 = errors.clone();
    good.on_event(move |e| e2.lock().unwrap().push(e.message.clone()));
    let d = good.acquire("k", 1).unwrap();
    assert!(
        d.allowed && d.reason == Reason::Lease,
        "{d:?} {:?}",
        errors.lock().unwrap()
    );
    assert_eq!(good.metrics().backend_errors, 0);
    assert_eq!(stored_tokens(&server.plain.cli(&["GET", &format!("{p}:{{k}}")])), 5);
    good.close().unwrap();

    // No client certificate: the server ends the handshake.
    let none = limiter(&base, &p, 2_001);
    assert_eq!(none.acquire("k2", 1).unwrap().reason, Reason::Fallback);
    assert!(none.metrics().backend_errors >= 1);

    // A certificate of a stranger (self-signed, made now).
    let dir = std::env::temp_dir().join(unique("ql-mtls-stranger"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let ok = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=stranger", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl")
        .status
        .success();
    assert!(ok, "openssl could not make a certificate");
    let stranger = limiter(
        &format!("{base}&ssl_certfile={}&ssl_keyfile={}", cert.display(), key.display()),
        &p,
        2_002,
    );
    assert_eq!(stranger.acquire("k3", 1).unwrap().reason, Reason::Fallback);
    assert!(stranger.metrics().backend_errors >= 1);
    // Nothing was written by the refused ones.
    assert_eq!(
        server
            .plain
            .cli(&["EXISTS", &format!("{p}:{{k2}}"), &format!("{p}:{{k3}}")]),
        "0"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
