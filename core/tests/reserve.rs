//! Reserve, then settle (`Limiter::reserve`), on the memory authority and
//! a real redis-server, with manual clocks: what goes back, what is owed,
//! and the typed errors. The bound under random schedules is
//! `ledger_bound`'s `reservations_*` properties.

mod common;

use common::{unique, RedisServer};
use quotalease::{ClockKind, ErrorKind, Limiter, Mode, Reason};

const START: u64 = 1_000_000;

/// One limiter per authority the test runs on: `memory://` always, and a
/// redis-server when one is there (`QUOTALEASE_REQUIRE_REDIS=1` makes it
/// required).
fn each_authority(test: impl Fn(&str, quotalease::Builder)) {
    common::each_authority(START, test)
}

/// Requests of cost 1 admitted at this instant until the first denial.
fn drain(l: &Limiter, key: &str) -> u64 {
    let mut n = 0;
    while l.acquire(key, 1).unwrap().allowed {
        n += 1;
        assert!(n <= 10_000, "never denied");
    }
    n
}

#[test]
fn a_reservation_settled_below_its_estimate_gives_the_rest_back() {
    each_authority(|name, b| {
        let l = b.limit(100).window_ms(60_000).build().unwrap();
        let r = l.reserve("k", 40, None).unwrap();
        assert!(r.allowed(), "{name}");
        assert_eq!((r.estimate(), r.key()), (40, "k"));
        r.settle(10).unwrap();
        assert!(r.is_settled());
        assert_eq!(drain(&l, "k"), 90, "{name}: the key spent what was used, 10");
    });
}

#[test]
fn a_reservation_dropped_unsettled_keeps_its_estimate() {
    each_authority(|name, b| {
        let l = b.limit(100).window_ms(60_000).build().unwrap();
        drop(l.reserve("k", 40, None).unwrap());
        assert_eq!(drain(&l, "k"), 60, "{name}");
        assert_eq!(l.inspect("k").unwrap().local_tokens, 0, "{name}");
    });
}

/// Settled above its estimate, the rest is taken even into debt: the key
/// admits nothing until its refill has paid it (50 tokens at 100 a minute:
/// 30 s).
#[test]
fn a_reservation_settled_above_its_estimate_leaves_a_debt_the_refill_pays() {
    each_authority(|name, b| {
        let l = b.limit(100).window_ms(60_000).build().unwrap();
        let r = l.reserve("k", 10, None).unwrap();
        assert!(r.allowed());
        r.settle(150).unwrap();
        assert_eq!(l.metrics().tokens_debited, 140, "{name}");
        l.settle().unwrap();
        let d = l.acquire("k", 1).unwrap();
        assert!(!d.allowed, "{name}: in debt: {d:?}");
        l.advance_clock(29_000).unwrap();
        assert!(!l.acquire("k", 1).unwrap().allowed, "{name}: 48 of 50 paid");
        l.advance_clock(2_000).unwrap();
        assert!(l.acquire("k", 1).unwrap().allowed, "{name}: paid, and a token refilled");
    });
}

#[test]
fn settling_twice_or_a_denied_reservation_is_a_typed_error() {
    each_authority(|name, b| {
        let l = b.limit(10).window_ms(60_000).build().unwrap();
        let r = l.reserve("k", 10, None).unwrap();
        r.settle(10).unwrap();
        let e = r.settle(5).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Reservation, "{name}: {e}");
        assert!(e.to_string().contains("settled already"), "{e}");
        let denied = l.reserve("k", 1, None).unwrap();
        assert!(!denied.allowed(), "{name}");
        assert_eq!(denied.decision().reason, Reason::Exhausted);
        let e = denied.settle(0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Reservation);
        assert!(e.to_string().contains("denied"), "{e}");
        // an estimate is a cost: at least 1, at most the limit
        for bad in [0, 11] {
            let e = l.reserve("k", bad, None).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidCost, "{name}: {bad}");
        }
        assert_eq!(
            quotalease::Reservation::negative_actual(-3).to_string(),
            "invalid settle: actual must be a whole number of tokens, 0 or more (got -3)"
        );
        // a debt the bucket could not count exactly is refused, and the
        // reservation can still be settled
        let big = l.reserve("big", 1, None).unwrap();
        let e = big.settle(1 << 57).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Reservation, "{name}: {e}");
        assert!(e.to_string().contains("more than this key can owe"), "{e}");
        // the deepest debt allowed is counted, and the key is in debt (not
        // a failed authority call: no fallback)
        let most = (1u64 << 52) / 60_000 - 10;
        big.settle(1 + most).unwrap();
        l.settle().unwrap();
        let d = l.acquire("big", 1).unwrap();
        assert_eq!((d.allowed, d.reason), (false, Reason::Exhausted), "{name}: {d:?}");
        assert_eq!(l.metrics().fallback_active, 0, "{name}");
        let r = l.reserve("other", 2, None).unwrap();
        l.close().unwrap();
        assert_eq!(r.settle(1).unwrap_err().kind(), ErrorKind::Closed);
    });
}

/// Fixed leases, mode exact and several rules per key settle the same way.
#[test]
fn every_mode_and_every_rule_of_a_key_is_settled() {
    each_authority(|name, b| {
        let fixed = b.clone().limit(100).window_ms(60_000).lease_size(20).build().unwrap();
        fixed.reserve("f", 40, None).unwrap().settle(10).unwrap();
        assert_eq!(drain(&fixed, "f"), 90, "{name}: fixed leases");
        let exact = b
            .clone()
            .limit(100)
            .window_ms(60_000)
            .mode(Mode::Exact)
            .build()
            .unwrap();
        let r = exact.reserve("x", 40, None).unwrap();
        assert_eq!(r.decision().reason, Reason::Exact);
        r.settle(10).unwrap();
        exact.settle().unwrap();
        assert_eq!(drain(&exact, "x"), 90, "{name}: mode exact");
        exact.reserve("y", 10, None).unwrap().settle(60).unwrap();
        exact.settle().unwrap();
        assert_eq!(drain(&exact, "y"), 40, "{name}: mode exact, over");
        let rules = b
            .limit(100)
            .window_ms(60_000)
            .tier("two", "100/min, 120/hour")
            .build()
            .unwrap();
        rules.reserve("m", 40, Some("two")).unwrap().settle(10).unwrap();
        let admitted = (0..200)
            .filter(|_| rules.acquire_with("m", 1, Some("two")).unwrap().allowed)
            .count();
        assert_eq!(admitted, 90, "{name}: the minute rule got its 30 back");
        rules.advance_clock(60_000).unwrap();
        let admitted = (0..200)
            .filter(|_| rules.acquire_with("m", 1, Some("two")).unwrap().allowed)
            .count();
        // 120 - 100 spent, and the 2 a minute refills (a token of the
        // hour rule's lease may lapse with its commitment meanwhile)
        assert!(
            (20..=22).contains(&admitted),
            "{name}: {admitted}: the hour rule spent 100 of 120, not 130"
        );
    });
}

/// An allow entry's admission spends nothing: settling it does nothing.
#[test]
fn an_unlimited_key_settles_to_nothing() {
    let name = format!("memory://{}", unique("rsv"));
    let l = Limiter::builder()
        .url(&name)
        .clock(ClockKind::Manual { start_ms: START })
        .limit(10)
        .window_ms(60_000)
        .policy_refresh_ms(1_000)
        .build()
        .unwrap();
    l.policy_assign("vip", "unlimited").unwrap();
    common::await_cond("the allow entry applies", || {
        l.advance_clock(1_000).unwrap();
        l.acquire("vip", 1).unwrap().reason == Reason::Unlimited
    });
    let r = l.reserve("vip", 5, None).unwrap();
    assert_eq!(r.decision().reason, Reason::Unlimited);
    r.settle(500).unwrap();
    assert_eq!(l.metrics().tokens_debited, 0);
}

#[test]
fn a_reservation_awaited_on_redis_settles_like_a_blocking_one() {
    let Some(server) = common::redis_or_none(RedisServer::start) else {
        return;
    };
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(unique("rsv"))
        .limit(100)
        .window_ms(60_000)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(l.reserve_async("k", 40, None)).unwrap();
    assert!(r.allowed());
    r.settle(10).unwrap();
    assert_eq!(drain(&l, "k"), 90);
}
