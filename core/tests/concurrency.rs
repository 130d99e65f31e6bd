//! Concurrency limits (`concurrency` = N, `Limiter::acquire_concurrent`)
//! on the memory authority and a real redis-server, with manual clocks: at
//! most N permits of a key in flight across limiters, released permits
//! come back, long requests keep theirs, a dead instance's come back after
//! its commitment expires, and the typed errors. The bound under random
//! schedules is `ledger_bound`'s `permits_*` property.

mod common;

use common::{unique, RedisServer};
use quotalease::{ClockKind, ErrorKind, Limiter, Permit, Reason};

const START: u64 = 1_000_000;

/// Two limiters on one authority per authority the test runs on:
/// `memory://NAME` always, and a redis-server when one is there.
fn each_authority(test: impl Fn(&str, Limiter, Limiter)) {
    let make = |url: &str, prefix: &str| {
        Limiter::builder()
            .url(url)
            .key_prefix(prefix)
            .limit(1000)
            .concurrency(3)
            .clock(ClockKind::Manual { start_ms: START })
            .build()
            .unwrap()
    };
    let url = format!("memory://{}", unique("inflight"));
    test("memory", make(&url, "p"), make(&url, "p"));
    if let Some(server) = common::redis_or_none(RedisServer::start) {
        let prefix = unique("inflight");
        test("redis", make(&server.url(), &prefix), make(&server.url(), &prefix));
    }
}

/// Permits taken at once until the first denial (kept).
fn take_all(l: &Limiter, key: &str) -> Vec<Permit> {
    let mut out = Vec::new();
    loop {
        let p = l.acquire_concurrent(key, None).unwrap();
        if !p.allowed() {
            assert_eq!(p.decision().reason, Reason::Exhausted);
            assert!(p.decision().retry_after_ms > 0);
            return out;
        }
        out.push(p);
        assert!(out.len() <= 100, "never denied");
    }
}

/// Both clocks move `ms`, in steps of half a second, each followed by the
/// limiters' maintenance (what the broker's ticker does on a system clock).
fn advance(ls: &[&Limiter], ms: u64) {
    let mut left = ms;
    while left > 0 {
        let step = left.min(500);
        for l in ls {
            l.advance_clock(step).unwrap();
            l.settle().unwrap();
        }
        left -= step;
    }
}

#[test]
fn at_most_the_limit_is_in_flight_and_a_release_frees_one() {
    each_authority(|name, l, _| {
        let held = take_all(&l, "k");
        assert_eq!(held.len(), 3, "{name}");
        assert_eq!(held[0].decision().limit, 3, "{name}");
        assert_eq!(held[0].key(), "k", "{name}");
        held[0].release().unwrap();
        assert!(held[0].is_released(), "{name}");
        let again = l.acquire_concurrent("k", None).unwrap();
        assert!(again.allowed(), "{name}: the released permit is taken again");
        assert!(!l.acquire_concurrent("k", None).unwrap().allowed(), "{name}");
        // Other keys have their own permits.
        assert_eq!(take_all(&l, "other").len(), 3, "{name}");
    });
}

#[test]
fn permits_are_shared_by_the_fleet() {
    each_authority(|name, l1, l2| {
        let mine = take_all(&l1, "k");
        assert!(take_all(&l2, "k").is_empty(), "{name}: l1 holds all {}", mine.len());
        // Released at l1, then given back (flush: as the lease TTL would).
        drop(mine);
        l1.flush().unwrap();
        advance(&[&l1, &l2], 1_000);
        assert_eq!(take_all(&l2, "k").len(), 3, "{name}");
    });
}

#[test]
fn a_long_request_keeps_its_permit() {
    each_authority(|name, l1, l2| {
        let mine = take_all(&l1, "k");
        assert_eq!(mine.len(), 3, "{name}");
        // Far past a commitment's life (7 s): the holder renews it.
        advance(&[&l1, &l2], 30_000);
        assert!(take_all(&l2, "k").is_empty(), "{name}: the permits are still in flight");
        drop(mine);
    });
}

#[test]
fn a_dead_instances_permits_come_back_after_its_commitment() {
    each_authority(|name, l1, l2| {
        let mine = take_all(&l1, "k");
        assert_eq!(mine.len(), 3, "{name}");
        // l1 dies holding them: no release, no renewal, no give-back.
        std::mem::forget(mine);
        std::mem::forget(l1);
        let t = quotalease::internals::TUNING;
        advance(&[&l2], t.commit_ms - t.expiry_margin_ms);
        assert!(take_all(&l2, "k").is_empty(), "{name}: still committed");
        advance(&[&l2], t.expiry_margin_ms + 1_000);
        assert_eq!(take_all(&l2, "k").len(), 3, "{name}: back after the expiry");
    });
}

#[test]
fn bad_use_is_a_typed_error() {
    let l = Limiter::builder().limit(10).build().unwrap();
    let e = l.acquire_concurrent("k", None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("`concurrency` is 0"), "{e}");
    let l = Limiter::builder().limit(10).concurrency(1).build().unwrap();
    assert_eq!(
        l.acquire_concurrent("", None).unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    assert_eq!(
        l.acquire_concurrent("a\u{1f}b", None).unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    let p = l.acquire_concurrent("k", None).unwrap();
    p.release().unwrap();
    let e = p.release().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Reservation);
    assert!(e.to_string().contains("released already"), "{e}");
    let _held = l.acquire_concurrent("k", None).unwrap();
    let denied = l.acquire_concurrent("k", None).unwrap();
    assert!(!denied.allowed());
    let e = denied.release().unwrap_err();
    assert!(e.to_string().contains("no permit was taken"), "{e}");
    for b in [
        Limiter::builder().limit(10).concurrency(2).lease_size(2),
        Limiter::builder()
            .limit(10)
            .concurrency(2)
            .mode(quotalease::Mode::Exact),
    ] {
        let e = b.build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("needs adaptive leasing"), "{e}");
    }
}

#[test]
fn permits_are_taken_awaiting_on_redis_with_the_system_clock() {
    let server = common::redis_or_skip!(RedisServer::start());
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(unique("inflight"))
        .limit(100)
        .concurrency(2)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let a = rt.block_on(l.acquire_concurrent_async("k", None)).unwrap();
    let b = rt.block_on(l.acquire_concurrent_async("k", None)).unwrap();
    assert!(a.allowed() && b.allowed());
    assert!(!rt.block_on(l.acquire_concurrent_async("k", None)).unwrap().allowed());
    a.release().unwrap();
    assert!(rt.block_on(l.acquire_concurrent_async("k", None)).unwrap().allowed());
}

#[test]
fn a_tier_sets_its_keys_concurrency() {
    let url = format!("memory://{}", unique("inflight"));
    let l = Limiter::builder()
        .url(&url)
        .limit(100)
        .concurrency(3)
        .tier("free", "100/min, 1 concurrent")
        .tier("pro", "6000/min")
        .default_tier("free")
        .policy_refresh_ms(1_000)
        .clock(ClockKind::Manual { start_ms: START })
        .build()
        .unwrap();
    let held = take_all(&l, "a");
    assert_eq!(held.len(), 1, "the default tier's 1");
    // A key the store puts in "pro" (no concurrency of its own): the limiter's 3.
    l.policy_assign("b", "tier:pro").unwrap();
    assert_eq!(take_all(&l, "b").len(), 3);
    // Raised in the store: the key's next permits follow.
    l.policy_set_tier("free", "100/min, 2 concurrent").unwrap();
    l.refresh_policies().unwrap();
    let a = take_all(&l, "a");
    assert_eq!(a.len(), 1, "one more, beside the one held");
    assert_eq!(a[0].decision().limit, 2);
    let tiers = l.tiers();
    let free = tiers.iter().find(|t| t.0 == "free").unwrap();
    assert_eq!(free.1.to_string(), "100/min, 2 concurrent");
    assert_eq!(free.1.concurrency(), Some(2));
    drop(held);
}

#[test]
fn a_callers_tier_sets_the_concurrency_of_its_call() {
    let l = Limiter::builder()
        .url(format!("memory://{}", unique("inflight")))
        .limit(100)
        .concurrency(3)
        .tier("free", "100/min, 1 concurrent")
        .tier("pro", "6000/min, 2 concurrent")
        .policy_refresh_ms(1_000)
        .clock(ClockKind::Manual { start_ms: START })
        .build()
        .unwrap();
    let take = |key: &str, tier: Option<&str>| {
        let mut held = Vec::new();
        loop {
            let p = l.acquire_concurrent(key, tier).unwrap();
            if !p.allowed() {
                return held;
            }
            held.push(p);
        }
    };
    let free = take("a", Some("free"));
    assert_eq!(free.len(), 1);
    assert_eq!(free[0].decision().limit, 1);
    let pro = take("b", Some("pro"));
    assert_eq!(pro.len(), 2);
    assert_eq!(take("c", None).len(), 3, "no tier: the limiter's concurrency");
    // Released under its tier, the permit is free again for that tier.
    drop(free);
    assert_eq!(take("a", Some("free")).len(), 1);
    let e = l.acquire_concurrent("a", Some("gold")).unwrap_err();
    assert!(matches!(e, quotalease::Error::UnknownTier { .. }), "{e}");
    // A key with an entry of its own keeps it whatever tier the call names.
    l.policy_assign("d", "10/s, 4 concurrent").unwrap();
    l.refresh_policies().unwrap();
    assert_eq!(take("d", Some("free")).len(), 4);
    drop(pro);
}

#[test]
fn a_key_with_no_concurrency_anywhere_takes_no_permits() {
    let l = Limiter::builder()
        .limit(10)
        .tier("pro", "100/min, 2 concurrent")
        .build()
        .unwrap();
    let e = l.acquire_concurrent("k", None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("the key's rules set none"), "{e}");
    for bad in [
        "100/min, 0 concurrent",
        "100/min, x concurrent",
        "100/min, 1 concurrent, 2 concurrent",
    ] {
        let e = Limiter::builder().limit(10).tier("t", bad).build().unwrap_err();
        assert!(
            e.to_string().contains("a concurrency limit is a whole number"),
            "{bad}: {e}"
        );
    }
    let e = Limiter::builder()
        .limit(10)
        .tier("t", "100/min, 2 concurrent")
        .lease_size(2)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("needs adaptive leasing"), "{e}");
}

#[test]
fn the_longest_key_takes_permits_and_a_longer_one_is_refused() {
    let l = Limiter::builder().limit(10).concurrency(1).build().unwrap();
    let longest = "x".repeat(quotalease::MAX_KEY_LEN);
    assert!(l.acquire(&longest, 1).unwrap().allowed);
    assert!(l.acquire_concurrent(&longest, None).unwrap().allowed());
    for len in [quotalease::MAX_KEY_LEN + 1, quotalease::MAX_KEY_LEN + 9] {
        let e = l.acquire_concurrent(&"x".repeat(len), None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidKey);
        assert!(e.to_string().contains(&format!("the key is {len} bytes long")), "{e}");
        let e = l.acquire(&"x".repeat(len), 1).unwrap_err();
        assert!(e.to_string().contains(&format!("the key is {len} bytes long")), "{e}");
    }
}

#[test]
fn a_released_permit_goes_to_the_instance_waiting_first() {
    each_authority(|name, l1, l2| {
        // l1 takes the three (asking for no fourth: it is not in line).
        let mut mine: Vec<Permit> = (0..3).map(|_| l1.acquire_concurrent("k", None).unwrap()).collect();
        assert!(mine.iter().all(Permit::allowed), "{name}");
        // l2 asks and is denied: it waits in line.
        assert!(take_all(&l2, "k").is_empty(), "{name}");
        // l1 releases one and asks again at once: the permit went back,
        // and l2 is ahead of it in line.
        mine.pop().unwrap().release().unwrap();
        assert!(
            !l1.acquire_concurrent("k", None).unwrap().allowed(),
            "{name}: l2 waits first"
        );
        // l2's next ask (after its denial's recheck) takes it.
        advance(&[&l1, &l2], 500);
        let theirs = take_all(&l2, "k");
        assert_eq!(theirs.len(), 1, "{name}");
        drop(mine);
    });
}
