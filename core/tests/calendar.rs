//! Calendar quotas (`"1000/month@Europe/Berlin"`) on the memory authority
//! and a real redis-server, with manual clocks set to dates: the whole
//! quota comes back at the period's start in the zone, not before; the
//! reset is the true one; bad rules are typed configuration errors. The
//! bound under random schedules is `ledger_bound`'s `calendar_*` property.

mod common;

use quotalease::{ErrorKind, Limiter, Mode, Reason};

/// Unix ms of an RFC 3339 instant.
fn at(text: &str) -> u64 {
    // (a small parser: the tests name whole seconds in UTC)
    let (date, time) = text.trim_end_matches('Z').split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let t: Vec<i64> = time.split(':').map(|x| x.parse().unwrap()).collect();
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era_day = 365 * y + y / 4 - y / 100 + y / 400 + (153 * m + 2) / 5 + d[2] - 1 - 719_468;
    ((era_day * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]) * 1000) as u64
}

/// One limiter per authority: `memory://` always, and a redis-server when
/// one is there (`QUOTALEASE_REQUIRE_REDIS=1` makes it required).
fn each_authority(start: &str, test: impl Fn(&str, quotalease::Builder)) {
    common::each_authority(at(start), test)
}

/// Requests of cost 1 admitted at this instant until the first denial.
fn drain(l: &Limiter, key: &str) -> u64 {
    let mut n = 0;
    while l.acquire(key, 1).unwrap().allowed {
        n += 1;
        assert!(n <= 100_000, "never denied");
    }
    n
}

#[test]
fn a_daily_quota_comes_back_at_midnight_in_its_zone() {
    // 22:00 UTC on 2026-12-04 is 23:00 in Berlin: midnight there is an hour away.
    each_authority("2026-12-04T22:00:00Z", |name, b| {
        let l = b.rate("50/day@Europe/Berlin").build().unwrap();
        assert_eq!(drain(&l, "k"), 50, "{name}");
        let d = l.acquire("k", 1).unwrap();
        assert!(!d.allowed, "{name}");
        assert_eq!(d.reason, Reason::Exhausted, "{name}");
        assert_eq!(d.retry_after_ms, 3_600_000, "{name}: until midnight in Berlin");
        assert_eq!(d.reset_after_ms, 3_600_000, "{name}");
        // Nothing refills within the day, however long it waits.
        l.advance_clock(3_600_000 - 1).unwrap();
        assert!(
            !l.acquire("k", 1).unwrap().allowed,
            "{name}: a token bucket would have refilled"
        );
        l.advance_clock(1).unwrap();
        assert_eq!(drain(&l, "k"), 50, "{name}: the next day's quota");
        let d = l.acquire("k", 1).unwrap();
        assert_eq!(d.reset_after_ms, 86_400_000, "{name}");
    });
}

#[test]
fn a_monthly_quota_on_a_billing_day_resets_on_that_day() {
    each_authority("2026-12-14T23:59:00Z", |name, b| {
        let l = b.rate("30/month@billing-day-15").build().unwrap();
        let d = l.acquire("k", 1).unwrap();
        assert!(d.allowed, "{name}");
        assert_eq!(d.reset_after_ms, 60_000, "{name}: the 15th starts the month");
        assert_eq!(d.window_ms, 30 * 86_400_000, "{name}: the nominal month");
        assert_eq!(d.rules().to_string(), "30/month@billing-day-15 UTC", "{name}");
        assert_eq!(drain(&l, "k"), 29, "{name}");
        l.advance_clock(60_000).unwrap();
        assert_eq!(drain(&l, "k"), 30, "{name}");
        let d = l.acquire("k", 1).unwrap();
        // 2026-12-15 to 2027-01-15: 31 days.
        assert_eq!(d.retry_after_ms, 31 * 86_400_000, "{name}");
    });
}

#[test]
fn a_calendar_quota_is_one_rule_among_several() {
    each_authority("2026-12-04T12:00:00Z", |name, b| {
        let l = b
            .limit(1)
            .tier("pro", "10/s, 25/day@UTC")
            .default_tier("pro")
            .build()
            .unwrap();
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += drain(&l, "k");
            l.advance_clock(1_000).unwrap();
        }
        assert_eq!(admitted, 25, "{name}: ten seconds of 10/s, held to 25 a day");
        let d = l.acquire("k", 1).unwrap();
        assert!(!d.allowed, "{name}");
        assert_eq!(d.rule, 1, "{name}: the daily rule denies");
        assert_eq!(d.rule_name(), "1day", "{name}");
        assert_eq!(d.retry_after_ms, 12 * 3_600_000 - 10_000, "{name}");
        let h = d.headers();
        assert!(h[0].1.contains("\"1day\";q=25;w=86400"), "{name}: {h:?}");
    });
}

#[test]
fn leases_and_give_backs_keep_the_quota_across_instances() {
    each_authority("2026-12-04T12:00:00Z", |name, b| {
        // Two limiters on one authority (a shared memory:// name or one Redis).
        let l1 = b.rate("40/day@UTC").build().unwrap();
        let l2 = l1.config().clone();
        let l2 = Limiter::new(l2).unwrap();
        let mut total = 0;
        for _ in 0..30 {
            total += u64::from(l1.acquire("k", 1).unwrap().allowed);
            total += u64::from(l2.acquire("k", 1).unwrap().allowed);
        }
        l1.flush().unwrap();
        l2.flush().unwrap();
        total += drain(&l1, "k") + drain(&l2, "k");
        assert_eq!(total, 40, "{name}: exactly the day's quota, leases given back");
    });
}

#[test]
fn bad_calendar_rules_are_typed_configuration_errors() {
    for (rate, want) in [
        ("10/month@Mars/Olympus", "does not know"),
        ("10/month", "needs a time zone"),
        ("10/day@billing-day-3", "only months have one"),
        ("10/month@billing-day-40", "1 to 31"),
        ("10/fortnight@UTC", "one of day, week, month, year"),
        ("9999999/month@UTC", "at most 1737499 per month"),
    ] {
        let e = Limiter::builder().rate(rate).build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{rate}");
        assert!(e.to_string().contains(want), "{rate}: {e}");
    }
    for b in [
        Limiter::builder().rate("10/day@UTC").mode(Mode::Exact),
        Limiter::builder().rate("10/day@UTC").lease_size(2),
        Limiter::builder().limit(5).tier("t", "10/day@UTC").mode(Mode::Local),
    ] {
        let e = b.build().unwrap_err();
        assert!(e.to_string().contains("needs adaptive leasing"), "{e}");
    }
}

/// On the system clock the script reads Redis `TIME` (Unix ms) and the
/// engine the time of day: a daily quota's wait runs to the next UTC
/// midnight by both. (The margin bounds how far the two clocks and the
/// test's own reading may disagree, not a speed.)
#[test]
fn on_the_system_clock_redis_resets_at_the_real_midnight() {
    let server = common::redis_or_skip!(common::RedisServer::start());
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // A zone whose midnight is hours away (UTC, else UTC-12), so the day
    // cannot turn while the test runs.
    let (zone, offset) = match now() % 86_400_000 {
        t if (3_600_000..82_800_000).contains(&t) => ("UTC", 0),
        _ => ("Etc/GMT+12", 43_200_000),
    };
    let l = Limiter::builder()
        .url(server.url())
        .key_prefix(common::unique("cal"))
        .rate(&format!("5/day@{zone}"))
        .build()
        .unwrap();
    for _ in 0..5 {
        assert!(l.acquire("k", 1).unwrap().allowed);
    }
    let d = l.acquire("k", 1).unwrap();
    assert!(!d.allowed);
    let to_midnight = 86_400_000 - (now() + 86_400_000 - offset) % 86_400_000;
    for (what, ms) in [
        ("retry_after_ms", d.retry_after_ms),
        ("reset_after_ms", d.reset_after_ms),
    ] {
        assert!(
            ms.abs_diff(to_midnight) < 60_000,
            "{what} {ms}, midnight in {to_midnight} ({zone})"
        );
    }
}
