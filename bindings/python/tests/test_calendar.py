"""Calendar quotas ("50/day@Europe/Berlin", "30/month@billing-day-15") through
the Python API, with manual clocks set to dates (a manual clock reads Unix ms):
the whole quota comes back at the period's start in its zone and not a
millisecond before, the decision's times are the true ones, a calendar rule
sits in a tier beside a rate (and names itself "1day" in the headers), the
asyncio API agrees, and bad rules are the binding's ConfigError. The core's
core/tests/calendar.rs is the model."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from conftest import PATIENT, RedisServer, unique
from quotalease import ConfigError, Decision, Limiter

HOUR = 3_600_000
DAY = 24 * HOUR


def at(text: str) -> int:
    """Unix ms of a UTC instant written "2026-12-04T22:00:00"."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1000


def drain(lim: Limiter, key: str) -> int:
    """Requests of cost 1 admitted at this instant until the first denial."""
    n = 0
    while lim.acquire(key):
        n += 1
        assert n <= 100_000, "never denied"
    return n


async def drain_async(lim: Limiter, key: str) -> int:
    n = 0
    while await lim.acquire_async(key):
        n += 1
        assert n <= 100_000, "never denied"
    return n


@pytest.fixture(params=["memory", "redis"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """memory://NAME, and the session's real redis-server."""
    if request.param == "memory":
        yield f"memory://{unique('cal')}"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url


def limiter(url: str, start: str, **options: Any) -> Limiter:
    return Limiter(
        url,
        clock="manual",
        clock_start_ms=at(start),
        key_prefix=unique("cal"),
        backend_timeout_ms=PATIENT,
        **options,
    )


def test_a_daily_quota_comes_back_at_midnight_in_its_zone(url: str) -> None:
    # 22:00 UTC on 2026-12-04 is 23:00 in Berlin: midnight there is an hour away.
    with limiter(url, "2026-12-04T22:00:00", rate="50/day@Europe/Berlin") as lim:
        assert drain(lim, "k") == 50
        d = lim.acquire("k")
        assert (d.allowed, d.reason, d.limit, d.remaining) == (False, "exhausted", 50, 0)
        assert d.retry_after_ms == HOUR, "until midnight in Berlin"
        assert d.reset_after_ms == HOUR
        assert d.window_ms == DAY, "the nominal day"
        assert (d.rule, d.rules) == (0, ((50, DAY),))
        assert d.headers() == {
            "RateLimit-Policy": '"default";q=50;w=86400',
            "RateLimit": '"default";r=0;t=3600',
            "Retry-After": "3600",
        }
        # Nothing refills within the day, however long it waits.
        lim.advance_clock(HOUR - 1)
        d = lim.acquire("k")
        assert not d.allowed, "a token bucket would have refilled"
        assert (d.retry_after_ms, d.reset_after_ms) == (1, 1)
        lim.advance_clock(1)
        assert drain(lim, "k") == 50, "the next day's quota, all of it"
        d = lim.acquire("k")
        assert (d.allowed, d.retry_after_ms, d.reset_after_ms) == (False, DAY, DAY)


async def test_acquire_async_crosses_midnight_the_same_way() -> None:
    lim = limiter(f"memory://{unique('cal')}", "2026-12-04T22:00:00", rate="50/day@Europe/Berlin")
    assert await drain_async(lim, "k") == 50
    d = await lim.acquire_async("k")
    assert isinstance(d, Decision)
    assert (d.allowed, d.retry_after_ms, d.reset_after_ms) == (False, HOUR, HOUR)
    lim.advance_clock(HOUR - 1)
    assert not await lim.acquire_async("k")
    lim.advance_clock(1)
    assert await drain_async(lim, "k") == 50
    lim.close()


def test_a_monthly_quota_on_a_billing_day_resets_on_that_day() -> None:
    with limiter(f"memory://{unique('cal')}", "2026-12-14T23:59:00", rate="30/month@billing-day-15") as lim:
        d = lim.acquire("k")
        assert d.allowed
        assert d.reset_after_ms == 60_000, "the 15th starts the month"
        assert d.window_ms == 30 * DAY, "the nominal month"
        assert d.headers()["RateLimit-Policy"] == '"default";q=30;w=2592000'
        assert drain(lim, "k") == 29
        lim.advance_clock(60_000)
        assert drain(lim, "k") == 30
        d = lim.acquire("k")
        # 2026-12-15 to 2027-01-15: 31 days.
        assert (d.allowed, d.retry_after_ms, d.reset_after_ms) == (False, 31 * DAY, 31 * DAY)


def test_a_billing_day_past_a_short_months_end_starts_on_its_last_day() -> None:
    # February 2027 has 28 days: its month of billing day 31 starts on the 28th.
    with limiter(f"memory://{unique('cal')}", "2027-02-27T00:00:00", rate="10/month@billing-day-31") as lim:
        assert drain(lim, "k") == 10
        assert lim.acquire("k").retry_after_ms == DAY, "from January 31st to February 28th"
        lim.advance_clock(DAY)
        assert drain(lim, "k") == 10
        # 2027-02-28 to 2027-03-31: 31 days.
        assert lim.acquire("k").retry_after_ms == 31 * DAY


def test_a_calendar_quota_is_one_rule_among_several() -> None:
    with limiter(
        f"memory://{unique('cal')}", "2026-12-04T12:00:00", limit=1, tiers="pro=10/s, 25/day@UTC", default_tier="pro"
    ) as lim:
        admitted = 0
        for _ in range(10):
            admitted += drain(lim, "k")
            lim.advance_clock(1_000)
        assert admitted == 25, "ten seconds of 10/s, held to 25 a day"
        d = lim.acquire("k")
        assert not d.allowed
        assert d.rule == 1, "the daily rule denies"
        assert d.rules == ((10, 1_000), (25, DAY))
        assert (d.limit, d.remaining, d.window_ms) == (25, 0, DAY)
        assert d.retry_after_ms == 12 * HOUR - 10_000, "until midnight UTC"
        assert d.reset_after_ms == 12 * HOUR - 10_000
        assert d.headers() == {
            "RateLimit-Policy": '"1s";q=10;w=1, "1day";q=25;w=86400',
            "RateLimit": '"1day";r=0;t=43190',
            "Retry-After": "43190",
        }
        assert lim.tiers()["pro"]["rules"] == ((10, 1_000), (25, DAY))
        assert lim.policy("k")["rules"] == ((10, 1_000), (25, DAY))


def test_a_monthly_rule_among_several_is_named_by_its_period() -> None:
    """A month's nominal window is 30 days, but the headers call it "1month"
    and its reset is the true one (31 days of December, less the first)."""
    with limiter(
        f"memory://{unique('cal')}", "2026-12-02T00:00:00", limit=1, tiers="pro=10/s, 3/month@UTC", default_tier="pro"
    ) as lim:
        assert drain(lim, "k") == 3
        d = lim.acquire("k")
        assert (d.allowed, d.rule, d.window_ms) == (False, 1, 30 * DAY)
        assert d.retry_after_ms == 30 * DAY, "December 2nd to January 1st"
        assert d.headers() == {
            "RateLimit-Policy": '"1s";q=10;w=1, "1month";q=3;w=2592000',
            "RateLimit": '"1month";r=0;t=2592000',
            "Retry-After": "2592000",
        }


def test_a_calendar_tier_from_the_store() -> None:
    url = f"memory://{unique('cal')}"
    a = limiter(url, "2026-12-04T22:00:00", limit=100, policy_refresh_ms=1000)
    b = limiter(url, "2026-12-04T22:00:00", limit=100, policy_refresh_ms=1000)
    a.policy_set_tier("daily", "5/day@Europe/Berlin")
    a.policy_assign("k", "tier:daily")
    b.refresh_policies()
    assert b.policy("k")["rules"] == ((5, DAY),)
    assert b.policy_get("k") == "tier:daily"
    assert b.policy_list()["tiers"] == {"daily": "5/day@Europe/Berlin"}
    assert drain(b, "k") == 5
    assert b.acquire("k").retry_after_ms == HOUR
    with pytest.raises(ConfigError, match="does not know"):
        a.policy_set_tier("bad", "5/day@Mars/Olympus")
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("rate", "want"),
    [
        ("10/month@Mars/Olympus", "does not know"),
        ("10/month", "needs a time zone"),
        ("10/day@billing-day-3", "only months have one"),
        ("10/month@billing-day-40", "1 to 31"),
        ("10/fortnight@UTC", "one of day, week, month, year"),
        ("9999999/month@UTC", "at most 1737499 per month"),
    ],
)
def test_bad_calendar_rules_are_config_errors(rate: str, want: str) -> None:
    with pytest.raises(ConfigError, match=want) as e:
        Limiter(rate=rate)
    assert isinstance(e.value, ValueError)
    with pytest.raises(ConfigError, match=want):
        Limiter(limit=5, tiers=f"t={rate}")


@pytest.mark.parametrize(
    "options",
    [
        {"rate": "10/day@UTC", "mode": "exact"},
        {"rate": "10/day@UTC", "mode": "local"},
        {"rate": "10/day@UTC", "lease_size": 2},
        {"limit": 5, "tiers": "t=10/day@UTC", "mode": "exact"},
        {"limit": 5, "tiers": "t=10/day@UTC", "mode": "local"},
    ],
)
def test_a_calendar_rule_needs_adaptive_leasing(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="needs adaptive leasing"):
        Limiter(**options)
