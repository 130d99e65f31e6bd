//! The per-request GCRA script `quotalease bench` compares against, on a real
//! redis-server: it admits exactly the burst, then one request per emission
//! interval, and reloads itself after SCRIPT FLUSH.
#![cfg(feature = "redis")]

mod common;

use common::RedisServer;
use quotalease_cli::gcra::{Gcra, GcraDecision};
use quotalease_cli::redis_util;

const T0: u64 = 1_800_000_000_000_000; // a caller-supplied "now", microseconds since the Unix epoch

fn admitted(d: GcraDecision) -> bool {
    d.allowed
}

#[test]
fn admits_the_burst_then_one_per_emission_interval() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let mut c = redis_util::connect(&redis.url()).unwrap();
    // 10 per second: burst 10, emission interval 100 ms = 100 000 us.
    let g = Gcra::new(10, 1000).unwrap();
    assert_eq!(g.burst(), 10);
    let k = "gcra:{a}";
    for i in 0..10 {
        let d = g.acquire_at(&mut c, k, 1, T0).unwrap();
        assert!(d.allowed, "request {i} of the burst");
        assert_eq!(d.remaining, 9 - i, "request {i}");
    }
    let d = g.acquire_at(&mut c, k, 1, T0).unwrap();
    assert_eq!(
        d,
        GcraDecision {
            allowed: false,
            remaining: 0,
            retry_after_us: 100_000
        }
    );
    // A denial changes nothing: one microsecond early is still denied.
    assert!(!admitted(g.acquire_at(&mut c, k, 1, T0 + 99_999).unwrap()));
    // Exactly one per emission interval.
    assert!(admitted(g.acquire_at(&mut c, k, 1, T0 + 100_000).unwrap()));
    assert!(!admitted(g.acquire_at(&mut c, k, 1, T0 + 100_000).unwrap()));
    // 3.5 intervals after the burst: two more (at 2 and 3 intervals' worth of credit).
    let n = (0..5)
        .filter(|_| admitted(g.acquire_at(&mut c, k, 1, T0 + 350_000).unwrap()))
        .count();
    assert_eq!(n, 2);
    let d = g.acquire_at(&mut c, k, 1, T0 + 350_000).unwrap();
    assert_eq!(d.retry_after_us, 50_000);
    // Idle for a whole window and more: the burst again, not more.
    let later = T0 + 10_000_000;
    let n = (0..15)
        .filter(|_| admitted(g.acquire_at(&mut c, k, 1, later).unwrap()))
        .count();
    assert_eq!(n, 10);
    // A cost of 3 takes three intervals; another key is independent.
    let d = g.acquire_at(&mut c, k, 3, later + 300_000).unwrap();
    assert!(d.allowed);
    assert!(!admitted(g.acquire_at(&mut c, k, 1, later + 300_000).unwrap()));
    assert!(admitted(g.acquire_at(&mut c, "gcra:{b}", 1, later).unwrap()));
}

#[test]
fn with_redis_time_the_burst_is_exact_and_the_key_expires() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let mut c = redis_util::connect(&redis.url()).unwrap();
    // 5 per hour: nothing refills while the test runs (one per 720 s).
    let g = Gcra::new(5, 3_600_000).unwrap();
    let results: Vec<GcraDecision> = (0..8).map(|_| g.acquire(&mut c, "gcra:{t}", 1).unwrap()).collect();
    assert_eq!(results.iter().filter(|d| d.allowed).count(), 5);
    assert!(results[..5].iter().all(|d| d.allowed) && results[5..].iter().all(|d| !d.allowed));
    for d in &results[5..] {
        // Redis TIME moved by less than a second since the burst.
        assert!(
            (719_000_000..=720_000_000).contains(&d.retry_after_us),
            "{}",
            d.retry_after_us
        );
    }
    // The TAT key expires when the bucket would be full again (5 x 720 s).
    let ttl = redis_util::pttl(&mut c, "gcra:{t}").unwrap().unwrap();
    assert!((3_599_000..=3_600_000).contains(&ttl), "{ttl}");
}

#[test]
fn reloads_the_script_after_noscript_and_rejects_bad_input() {
    let redis = common::redis_or_skip!(RedisServer::start());
    let mut c = redis_util::connect(&redis.url()).unwrap();
    let g = Gcra::new(100, 1000).unwrap();
    assert!(g.acquire(&mut c, "gcra:{r}", 1).unwrap().allowed);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut c).unwrap();
    assert!(
        g.acquire(&mut c, "gcra:{r}", 1).unwrap().allowed,
        "NOSCRIPT -> load -> retry"
    );
    let stats = redis_util::commandstats(&mut c).unwrap();
    assert!(stats.get("script|load").copied().unwrap_or(0) >= 1, "{stats:?}");

    assert_eq!(g.acquire(&mut c, "gcra:{r}", 0).unwrap_err(), "cost must be at least 1");
    assert!(Gcra::new(0, 1000)
        .unwrap_err()
        .starts_with("--limit must be at least 1"));
    assert!(Gcra::new(10, 0).unwrap_err().starts_with("--window-ms"));
    // A key holding something else: Redis' error, as an error.
    let _: i64 = redis::cmd("LPUSH").arg("gcra:{s}").arg("x").query(&mut c).unwrap();
    let e = g.acquire(&mut c, "gcra:{s}", 1).unwrap_err();
    assert!(
        e.starts_with("the GCRA script failed") && e.contains("WRONGTYPE"),
        "{e}"
    );
}
