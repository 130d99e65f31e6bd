//! Engine properties on the embedded memory authority: bounded memory under a
//! flood of distinct keys, many threads on one limiter, events and inspect.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quotalease::{ClockKind, Limiter, Reason};

#[test]
fn a_flood_of_distinct_keys_stays_within_max_keys() {
    let l = Limiter::builder()
        .limit(100)
        .window_ms(60_000)
        .lease_size(10)
        .max_keys(1_000)
        .clock(ClockKind::Manual { start_ms: 0 })
        .build()
        .unwrap();
    for i in 0..50_000 {
        assert!(l.acquire(&format!("flood-{i}"), 1).unwrap().allowed);
        if i % 1000 == 0 {
            assert!(l.metrics().keys_tracked <= 1_000);
        }
    }
    let m = l.metrics();
    assert!(m.keys_tracked <= 1_000, "{m:?}");
    // Evicted keys gave their tokens back; what is held is bounded by the table.
    assert!(m.overshoot_bound <= 1_000 * 9, "{m:?}");
    assert_eq!(m.tokens_returned, m.tokens_expired);
    assert_eq!(m.admitted, 50_000);
}

#[test]
fn many_threads_on_one_limiter_admit_exactly_the_budget() {
    // 8 threads hammer 4 keys of a shared limiter; with a manual clock no
    // refill happens, so exactly limit per key is admitted, never more.
    let l = Arc::new(
        Limiter::builder()
            .limit(5_000)
            .window_ms(60_000)
            .lease_size(20)
            .clock(ClockKind::Manual { start_ms: 0 })
            .build()
            .unwrap(),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (l, admitted) = (l.clone(), admitted.clone());
            std::thread::spawn(move || {
                for i in 0..4_000 {
                    let key = format!("k{}", (t + i) % 4);
                    if l.acquire(&key, 1).unwrap().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 4 * 5_000);
    let m = l.metrics();
    assert_eq!(m.admitted, 20_000);
    assert_eq!(m.denied, 32_000 - 20_000);
    assert_eq!(m.overshoot_bound, 0);
}

#[test]
fn inspect_explains_a_denial() {
    let l = Limiter::builder()
        .limit(3)
        .window_ms(3_000)
        .lease_size(3)
        .clock(ClockKind::Manual { start_ms: 0 })
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(l.acquire("k", 1).unwrap().allowed);
    }
    let d = l.acquire("k", 1).unwrap();
    assert_eq!(d.reason, Reason::Exhausted);
    let i = l.inspect("k").unwrap();
    assert_eq!(i.authority_tokens, Some(0));
    assert_eq!(i.local_tokens, 0);
    assert_eq!((i.admitted, i.denied), (3, 1));
    assert_eq!(i.exhausted_for_ms, d.retry_after_ms);
    assert!(l.inspect("").is_err());
    assert_eq!(l.inspect("never-seen").unwrap().authority_tokens, None);
}

#[test]
fn limiters_sharing_a_memory_name_share_buckets() {
    let mk = || {
        Limiter::builder()
            .url("memory://shared-test")
            .limit(4)
            .window_ms(60_000)
            .lease_size(1)
            .clock(ClockKind::Manual { start_ms: 0 })
            .build()
            .unwrap()
    };
    let (a, b) = (mk(), mk());
    let admitted = (0..4).filter(|_| a.acquire("k", 1).unwrap().allowed).count()
        + (0..4).filter(|_| b.acquire("k", 1).unwrap().allowed).count();
    assert_eq!(admitted, 4);
    // A private memory:// does not share.
    let c = Limiter::builder().limit(4).window_ms(60_000).build().unwrap();
    assert!(c.acquire("k", 1).unwrap().allowed);
}

#[test]
fn closed_limiter_refuses_every_call() {
    let l = Limiter::builder().limit(4).build().unwrap();
    assert!(l.acquire("k", 1).unwrap().allowed);
    l.close().unwrap();
    l.close().unwrap();
    assert_eq!(l.acquire("k", 1).unwrap_err(), quotalease::Error::Closed);
    assert_eq!(l.try_acquire("k", 1).unwrap_err(), quotalease::Error::Closed);
    assert_eq!(l.flush().unwrap_err(), quotalease::Error::Closed);
    assert_eq!(l.set_limit("k", 1, 1).unwrap_err(), quotalease::Error::Closed);
}
