//! Every limiter of a process shares one broker thread and, per Redis
//! backend (URL + backend_timeout_ms), one connection for leases and, when a
//! limiter follows the policy store, one for the store (so a slow store call
//! never holds a lease up), however
//! many limiters there are: counted with Redis `CLIENT LIST` and the
//! process' thread names.
//! One test function, so no other test of this binary starts limiters meanwhile.

mod common;

use common::RedisServer;
use quotalease::Limiter;

/// Connections the server sees, less the redis-cli asking.
fn clients(server: &RedisServer) -> usize {
    server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.starts_with("id="))
        .count()
        - 1
}

fn broker_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        // /proc shows the first 15 bytes of a thread name
        .filter(|name| name.trim() == "quotalease-brok")
        .count()
}

#[test]
fn one_thread_and_two_connections_per_backend_for_any_number_of_limiters() {
    let server = common::redis_or_skip!(RedisServer::start());
    assert_eq!(clients(&server), 0);
    let mut limiters = Vec::new();
    for n in [1usize, 20, 100] {
        while limiters.len() < n {
            let i = limiters.len();
            let l = Limiter::builder()
                .url(server.url())
                .key_prefix(format!("route{i}"))
                .policy_refresh_ms(1_000)
                .limit(1_000)
                .build()
                .unwrap();
            assert!(l.acquire("k", 1).unwrap().allowed);
            limiters.push(l);
        }
        // Every limiter leased (and its inspect runs on the same connection).
        for l in &limiters {
            assert!(l.inspect("k").unwrap().authority_tokens.is_some());
        }
        assert_eq!(clients(&server), 2, "{n} limiters: {}", server.cli(&["CLIENT", "LIST"]));
        assert_eq!(broker_threads(), 1, "{n} limiters");
        assert_eq!(quotalease::internals::connections_open(), 2, "{n} limiters");
    }
    // A different round-trip bound is a different backend: its own lease
    // connection (it follows no policy store, the default: no store connection).
    let other = Limiter::builder()
        .url(server.url())
        .backend_timeout_ms(999)
        .limit(10)
        .build()
        .unwrap();
    assert!(other.acquire("k", 1).unwrap().allowed);
    assert_eq!(clients(&server), 3);
    assert_eq!(broker_threads(), 1);
    // Closing limiters gives their tokens back over the shared connection.
    for l in &limiters {
        l.close().unwrap();
    }
    assert!(limiters.iter().all(|l| l.acquire("k", 1).is_err()));
    assert_eq!(clients(&server), 3);
    // Another backend again, following the store: both of its connections.
    let plain = Limiter::builder()
        .url(server.url())
        .backend_timeout_ms(777)
        .policy_refresh_ms(1_000)
        .limit(10)
        .build()
        .unwrap();
    assert!(plain.acquire("k", 1).unwrap().allowed);
    assert_eq!(clients(&server), 5);
}
