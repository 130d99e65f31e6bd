//! The engine against a real redis-server (started by tests/harness/redisctl):
//! grants, exhaustion, lease TTL, limit changes, and Redis restarted, killed
//! and paused under each failure policy.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{await_cond, stored_tokens, unique, RedisServer};
use quotalease::{EventKind, FailurePolicy, Limiter, Reason};

fn limiter(server: &RedisServer, prefix: &str) -> quotalease::Builder {
    Limiter::builder()
        .url(server.url())
        .key_prefix(prefix)
        .backend_timeout_ms(200)
}

fn events(l: &Limiter) -> Arc<Mutex<Vec<EventKind>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    l.on_event(move |e| s.lock().unwrap().push(e.kind));
    seen
}

fn stored(server: &RedisServer, prefix: &str, key: &str) -> u64 {
    stored_tokens(&server.cli(&["GET", &format!("{prefix}:{{{key}}}")]))
}

#[test]
fn grants_exhaustion_and_local_denials() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("g");
    let l = limiter(&server, &p)
        .limit(5)
        .window_ms(60_000)
        .lease_size(5)
        .build()
        .unwrap();
    for i in 0..5 {
        let d = l.acquire("k", 1).unwrap();
        assert!(d.allowed, "request {i}: {d:?}");
        assert_eq!(d.reason, Reason::Lease);
    }
    let d = l.acquire("k", 1).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::Exhausted);
    // One token refills in 12 s, and an exhausted instance waits for half a
    // lease more (2 tokens) before leasing again: the hint says 36 s at most.
    assert!(d.retry_after_ms > 24_000 && d.retry_after_ms <= 36_000, "{d:?}");
    let calls = l.metrics().backend_calls;
    for _ in 0..100 {
        assert!(!l.acquire("k", 1).unwrap().allowed);
    }
    assert_eq!(
        l.metrics().backend_calls,
        calls,
        "denials while exhausted must stay local"
    );
    assert_eq!(l.metrics().denied, 101);
    // The key is hash-tagged and expires by itself.
    let ttl: i64 = server.cli(&["PTTL", &format!("{p}:{{k}}")]).parse().unwrap();
    assert!(ttl > 0, "the bucket key must carry a PEXPIRE, got {ttl}");
}

#[test]
fn lease_ttl_gives_idle_tokens_back() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("t");
    let l = limiter(&server, &p)
        .limit(100)
        .window_ms(3_600_000)
        .lease_size(10)
        .lease_ttl_ms(50)
        .build()
        .unwrap();
    assert!(l.acquire("k", 1).unwrap().allowed);
    assert_eq!(l.metrics().overshoot_bound, 9);
    assert_eq!(stored(&server, &p, "k"), 90);
    await_cond("idle tokens given back", || l.metrics().tokens_returned == 9);
    let m = l.metrics();
    assert_eq!((m.overshoot_bound, m.tokens_expired), (0, 9));
    assert_eq!(stored(&server, &p, "k"), 99);
}

#[test]
fn set_limit_clamps_the_authority() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("s");
    let l = limiter(&server, &p)
        .limit(100)
        .window_ms(3_600_000)
        .lease_size(10)
        .build()
        .unwrap();
    assert!(l.acquire("k", 1).unwrap().allowed);
    l.set_limit("k", 5, 3_600_000).unwrap();
    // Under a lower limit every local token went back (9 -> 0), and the stored
    // bucket is clamped to the new capacity by the give-back: the key admits
    // what one bucket of the new limit holds (before: 5 kept locally beside 5
    // in the bucket, 10 where the new limit allows 5).
    assert_eq!(l.metrics().overshoot_bound, 0);
    l.settle().unwrap();
    assert_eq!(stored(&server, &p, "k"), 5);
    let admitted = (0..20).filter(|_| l.acquire("k", 1).unwrap().allowed).count();
    assert_eq!(admitted, 5, "the clamped bucket's 5");
    assert_eq!(l.acquire("k", 1).unwrap().limit, 5);
}

#[test]
fn an_answer_sent_under_a_higher_limit_is_held_to_the_lower() {
    let server = common::redis_or_skip!(RedisServer::start());
    for (name, lease) in [("fixed", Some(10)), ("adaptive", None)] {
        let p = unique("o");
        let mut b = limiter(&server, &p)
            .limit(100)
            .window_ms(3_600_000)
            .backend_timeout_ms(60_000);
        if let Some(n) = lease {
            b = b.lease_size(n);
        }
        let l = b.build().unwrap();
        // Every write waits at the server: the lease call that goes out under
        // limit 100 is answered only after the limit is lowered to 5.
        server.cli(&["CLIENT", "PAUSE", "60000", "WRITE"]);
        let d = l.try_acquire("k", 1).unwrap();
        assert_eq!((d.allowed, d.reason), (false, Reason::Pending), "{name}: {d:?}");
        l.set_limit("k", 5, 3_600_000).unwrap();
        server.cli(&["CLIENT", "UNPAUSE"]);
        l.settle().unwrap();
        // What the old limit granted (10 on fixed leases) landed after the
        // change and went back whole: without that a fixed lease kept its 10
        // and admitted 15 (checked). The ledger holds either way: it counts
        // the chunk out and holds its credit to 5 less what is out (I2).
        let admitted = (0..20).filter(|_| l.acquire("k", 1).unwrap().allowed).count();
        assert_eq!(admitted, 5, "{name}: one bucket of the new limit holds 5");
    }
}

#[test]
fn redis_restarted_empty_recovers_by_itself() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("r");
    let l = limiter(&server, &p)
        .limit(1000)
        .window_ms(60_000)
        .lease_size(5)
        .build()
        .unwrap();
    let seen = events(&l);
    assert!(l.acquire("k", 1).unwrap().allowed);
    server.restart();
    // Keep serving; after the restart the limiter reconnects and leases again.
    await_cond("leasing again after the restart", || {
        let d = l.acquire("k", 1).unwrap();
        assert!(d.allowed, "static share of 1000 must admit: {d:?}");
        d.reason == Reason::Lease && l.metrics().tokens_leased > 5
    });
    // The restarted server holds a fresh bucket for the key.
    assert!(server.cli(&["EXISTS", &format!("{p}:{{k}}")]) == "1");
    let kinds = seen.lock().unwrap().clone();
    if kinds.contains(&EventKind::Degraded) {
        assert!(kinds.contains(&EventKind::Recovered), "{kinds:?}");
    }
}

fn killed_with_policy(server: RedisServer, policy: FailurePolicy) -> (Vec<bool>, Vec<Reason>) {
    let p = unique("k");
    let l = limiter(&server, &p)
        .limit(10)
        .window_ms(3_600_000)
        .lease_size(4)
        .refill_threshold(0)
        .expected_replicas(2)
        .on_backend_failure(policy)
        .build()
        .unwrap();
    let seen = events(&l);
    assert!(l.acquire("k", 1).unwrap().allowed); // holds 3
    server.kill();
    let mut allowed = Vec::new();
    let mut reasons = Vec::new();
    for _ in 0..10 {
        let d = l.acquire("k", 1).unwrap();
        allowed.push(d.allowed);
        reasons.push(d.reason);
    }
    assert_eq!(seen.lock().unwrap().first(), Some(&EventKind::Degraded));
    let m = l.metrics();
    assert_eq!(m.fallback_active, 1);
    assert!(m.backend_errors >= 1 && m.fallback_transitions >= 1, "{m:?}");
    server.restart();
    await_cond("recovered after Redis came back", || {
        let d = l.acquire("k2", 1).unwrap();
        d.reason == Reason::Lease
    });
    assert!(seen.lock().unwrap().contains(&EventKind::Recovered));
    assert_eq!(l.metrics().fallback_active, 0);
    (allowed, reasons)
}

#[test]
fn redis_killed_static_share() {
    let server = common::redis_or_skip!(RedisServer::start());
    let (allowed, reasons) = killed_with_policy(server, FailurePolicy::StaticShare);
    // 3 leased tokens first, then the static share (10 / 2 = 5 per hour)
    // starting with its part of what the bucket held at the last answer
    // (6 of 10: 3), then denials.
    assert_eq!(&reasons[..3], &[Reason::Lease; 3]);
    assert!(reasons[3..].iter().all(|r| *r == Reason::Fallback), "{reasons:?}");
    assert_eq!(allowed.iter().filter(|a| **a).count(), 6, "{allowed:?}");
}

#[test]
fn redis_killed_allow() {
    let server = common::redis_or_skip!(RedisServer::start());
    let (allowed, reasons) = killed_with_policy(server, FailurePolicy::Allow);
    assert_eq!(&reasons[..3], &[Reason::Lease; 3]);
    assert!(allowed.iter().all(|a| *a));
}

#[test]
fn redis_killed_deny() {
    let server = common::redis_or_skip!(RedisServer::start());
    let (allowed, reasons) = killed_with_policy(server, FailurePolicy::Deny);
    assert_eq!(&reasons[..3], &[Reason::Lease; 3]);
    assert_eq!(allowed.iter().filter(|a| **a).count(), 3);
}

#[test]
fn redis_paused_timeout_honoured_and_admit_path_unaffected() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("p");
    let l = limiter(&server, &p)
        .limit(1000)
        .window_ms(60_000)
        .lease_size(20)
        .backend_timeout_ms(100)
        .expected_replicas(10)
        .build()
        .unwrap();
    assert!(l.acquire("warm", 1).unwrap().allowed);
    server.pause();
    // A cold key waits for the backend at most about backend_timeout: a
    // first silence is denied as `pending` (the server may only be slow),
    // and once the silence lasts a timeout more the circuit opens and the
    // failure policy decides. (The bound is a hang guard, not a timing test.)
    let t = Instant::now();
    let d = l.acquire("cold", 1).unwrap();
    assert_eq!((d.allowed, d.reason), (false, Reason::Pending), "{d:?}");
    assert_eq!(l.metrics().fallback_active, 0);
    await_cond("the circuit opens when the silence lasts", || {
        l.acquire("cold", 1).unwrap().reason == Reason::Fallback
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "acquire hung for {:?}",
        t.elapsed()
    );
    // The warm key keeps admitting from its lease with no network call.
    for _ in 0..15 {
        let d = l.acquire("warm", 1).unwrap();
        assert!(d.allowed);
        assert_eq!(d.reason, Reason::Lease);
    }
    // try_acquire never waits either.
    assert!(l.try_acquire("cold2", 1).is_ok());
    server.resume();
    await_cond("leasing again after resume", || {
        l.acquire("cold", 1).unwrap().reason == Reason::Lease
    });
}

#[test]
fn exact_mode_calls_redis_per_request() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("e");
    let l = limiter(&server, &p)
        .limit(3)
        .window_ms(60_000)
        .mode(quotalease::Mode::Exact)
        .build()
        .unwrap();
    let ds: Vec<_> = (0..4).map(|_| l.acquire("k", 1).unwrap()).collect();
    assert_eq!(ds.iter().filter(|d| d.allowed).count(), 3);
    assert!(ds.iter().all(|d| d.reason == Reason::Exact));
    assert_eq!(l.metrics().backend_calls, 4);
    assert_eq!(l.metrics().overshoot_bound, 0);
}

#[test]
fn inspect_reads_an_adaptive_keys_ledger() {
    // An adaptive key is the ledger's hash, not the bucket string: inspect
    // reads its `c t w` with the stored-format codec, a debt as 0 tokens.
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("ia");
    let l = limiter(&server, &p).limit(100).window_ms(60_000).build().unwrap();
    assert!(l.acquire("k", 1).unwrap().allowed);
    let rk = format!("{p}:{{k}}");
    assert_eq!(server.cli(&["TYPE", &rk]), "hash");
    let field = |f: &str| -> i64 { server.cli(&["HGET", &rk, f]).parse().unwrap() };
    await_cond("inspect agrees with the hash", || {
        let (c, t, w) = (field("c"), field("t"), field("w"));
        let i = l.inspect("k").unwrap();
        let want = (Some(c.max(0) as u64 / w.max(1) as u64), Some(t as u64));
        i.authority_ttl_ms.is_some() && (i.authority_tokens, i.authority_refilled_at_ms) == want
    });
    server.cli(&["HSET", &rk, "c", "-2500"]);
    assert_eq!(
        l.inspect("k").unwrap().authority_tokens,
        Some(0),
        "a debt holds no tokens"
    );
    server.cli(&["DEL", &rk]);
    let i = l.inspect("k").unwrap();
    assert_eq!((i.authority_tokens, i.authority_refilled_at_ms), (None, None));
}

#[test]
fn acquire_async_waits_on_its_own_runtime() {
    let server = common::redis_or_skip!(RedisServer::start());
    let p = unique("a");
    let l = limiter(&server, &p)
        .limit(10)
        .window_ms(60_000)
        .lease_size(5)
        .build()
        .unwrap();
    // A plain executor with no tokio context: the wait runs on the limiter's runtime.
    let ds: Vec<_> = futures_lite_block_on(async {
        let mut v = Vec::new();
        for _ in 0..12 {
            v.push(l.acquire_async("k", 1).await.unwrap());
        }
        v
    });
    assert_eq!(ds.iter().filter(|d| d.allowed).count(), 10);
    assert_eq!(ds.last().unwrap().reason, Reason::Exhausted);
}

/// A minimal single-future executor (std only), to prove no tokio context is needed.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Thread(std::thread::Thread);
    impl Wake for Thread {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Thread(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
