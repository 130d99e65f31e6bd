"""Concurrency limits (``concurrency=N``, Limiter.acquire_concurrent /
acquire_concurrent_async and Permit) on memory://NAME and a real redis-server,
two limiters on one authority, manual clocks: at most N permits of a key in
flight across limiters, a release frees one, released permits reach the other
limiter once given back, a long request keeps its permits far past a
commitment's life (7 s), a dead instance's come back after its commitment, the
context managers, the asyncio form, and the typed errors. The core's
core/tests/concurrency.rs is the model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from conftest import PATIENT, RedisServer, unique
from quotalease import (
    ClosedError,
    ConfigError,
    Decision,
    InvalidKeyError,
    Limiter,
    Permit,
    QuotaLeaseError,
    ReservationError,
)

#: A commitment's life at the authority and its expiry margin (the core's
#: ledger TUNING: commit_ms 7000, expiry_margin_ms 1000).
COMMIT_MS = 7_000
MARGIN_MS = 1_000


@pytest.fixture(params=["memory", "redis"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """memory://NAME of its own, and the session's real redis-server."""
    if request.param == "memory":
        yield f"memory://{unique('inflight')}"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url


def pair(url: str, concurrency: int = 3) -> tuple[Limiter, Limiter]:
    """Two limiters on one authority and key prefix (two instances of a
    service), each with a manual clock."""
    prefix = unique("inflight")

    def make() -> Limiter:
        return Limiter(
            url, limit=1000, concurrency=concurrency, key_prefix=prefix, clock="manual", backend_timeout_ms=PATIENT
        )

    return make(), make()


def take_all(lim: Limiter, key: str) -> list[Permit]:
    """Permits taken at once until the first denial (the admitted ones, kept)."""
    out: list[Permit] = []
    while True:
        p = lim.acquire_concurrent(key)
        if not p.allowed:
            d = p.decision
            assert (d.allowed, d.reason, d.remaining) == (False, "exhausted", 0), d
            # a permit denial stays local recheck_ms (250) from when it was decided
            assert 1 <= d.retry_after_ms <= 250, d
            return out
        out.append(p)
        assert len(out) <= 100, "never denied"


def advance(limiters: list[Limiter], ms: int) -> None:
    """Every clock moves `ms`, in steps of half a second, each followed by the
    limiter's maintenance (what the broker's ticker does on a system clock)."""
    left = ms
    while left > 0:
        step = min(left, 500)
        for lim in limiters:
            lim.advance_clock(step)
            lim.settle()
        left -= step


def test_at_most_the_limit_is_in_flight_and_a_release_frees_one(url: str) -> None:
    lim, _ = pair(url)
    held = take_all(lim, "k")
    assert len(held) == 3
    p = held[0]
    assert isinstance(p, Permit) and isinstance(p.decision, Decision)
    assert (p.allowed, p.key, p.released) == (True, "k", False)
    assert p.decision.limit == 3 and p.decision.reason == "lease"
    assert [h.decision.remaining for h in held] == [2, 1, 0]
    assert repr(p) == "Permit(key='k', allowed=True, released=False)"
    p.release()
    assert p.released
    assert repr(p) == "Permit(key='k', allowed=True, released=True)"
    again = lim.acquire_concurrent("k")
    assert again.allowed, "the released permit is taken again"
    denied = lim.acquire_concurrent("k")
    assert not denied.allowed and not denied.released
    assert repr(denied) == "Permit(key='k', allowed=False, released=False)"
    assert denied.decision.headers()["Retry-After"] == "1"
    # other keys have their own permits
    assert len(take_all(lim, "other")) == 3


def test_permits_are_shared_by_the_fleet(url: str) -> None:
    l1, l2 = pair(url)
    mine = take_all(l1, "k")
    assert len(mine) == 3
    assert take_all(l2, "k") == [], "l1 holds all 3"
    for p in mine:
        p.release()
    # released, the permits go back to the authority at once; l2's last
    # denial stays local for a recheck (250 ms), then it asks again
    assert take_all(l2, "k") == [], "l2's denial is still local"
    advance([l1, l2], 1_000)
    theirs = take_all(l2, "k")
    assert len(theirs) == 3
    assert take_all(l1, "k") == [], "l2 holds all 3 now"


def test_a_dropped_permit_is_released(url: str) -> None:
    lim, _ = pair(url, concurrency=1)
    assert lim.acquire_concurrent("k").allowed  # dropped at once
    p = lim.acquire_concurrent("k")
    assert p.allowed, "the dropped permit was released"
    assert not lim.acquire_concurrent("k").allowed


def test_a_long_request_keeps_its_permit(url: str) -> None:
    l1, l2 = pair(url)
    mine = take_all(l1, "k")
    assert len(mine) == 3
    # far past a commitment's life (7 s): l1's maintenance renews it
    advance([l1, l2], 30_000)
    assert take_all(l2, "k") == [], "the permits are still in flight"
    assert not any(p.released for p in mine)
    for p in mine:
        p.release()
    l1.flush()
    advance([l1, l2], 1_000)
    assert len(take_all(l2, "k")) == 3


def test_a_dead_instances_permits_come_back_after_its_commitment(url: str) -> None:
    l1, l2 = pair(url)
    mine = take_all(l1, "k")
    assert len(mine) == 3
    # l1 "dies" holding them: it never runs again (no release, renewal or give-back)
    advance([l2], COMMIT_MS - MARGIN_MS)
    assert take_all(l2, "k") == [], "still committed"
    advance([l2], MARGIN_MS + 1_000)
    assert len(take_all(l2, "k")) == 3, "back after the expiry"
    del mine


def test_a_with_block_releases_an_admitted_permit(url: str) -> None:
    lim, _ = pair(url, concurrency=1)
    with lim.acquire_concurrent("k") as p:
        assert p.allowed and not p.released
        assert not lim.acquire_concurrent("k").allowed, "held inside the block"
    assert p.released
    # an exception in the block goes on (__exit__ returns False); the permit is released
    with pytest.raises(RuntimeError, match="export failed"), lim.acquire_concurrent("k") as failed:
        assert failed.allowed
        raise RuntimeError("export failed")
    assert failed.released
    # released inside the block: leaving it does not release it again (no error)
    with lim.acquire_concurrent("k") as early:
        early.release()
    assert early.released
    # a denied permit's block holds nothing: leaving it is no error
    with lim.acquire_concurrent("k") as held:
        with lim.acquire_concurrent("k") as denied:
            assert not denied.allowed
        assert not denied.released
        assert held.allowed and not held.released
    assert held.released
    assert lim.acquire_concurrent("k").allowed


async def test_acquire_concurrent_async_and_async_with(url: str) -> None:
    lim, _ = pair(url, concurrency=2)
    async with await lim.acquire_concurrent_async("k") as a:
        assert isinstance(a, Permit) and a.allowed and a.decision.limit == 2
        b = await lim.acquire_concurrent_async("k")
        assert b.allowed
        c = await lim.acquire_concurrent_async("k")
        assert not c.allowed and 1 <= c.decision.retry_after_ms <= 250
        b.release()
    assert a.released and b.released
    with pytest.raises(RuntimeError, match="stream failed"):
        async with await lim.acquire_concurrent_async("k") as failed:
            raise RuntimeError("stream failed")
    assert failed.released
    got = [await lim.acquire_concurrent_async("k") for _ in range(3)]
    assert [p.allowed for p in got] == [True, True, False]


async def test_acquire_concurrent_async_awaits_a_pending_lease_with_the_loop_free(own_redis: RedisServer) -> None:
    """A cold key on a stopped server: the permit is pending on a future while
    the loop runs other work, and is taken once the server is back."""
    lim = Limiter(
        own_redis.url, limit=100, concurrency=2, backend_timeout_ms=60_000, key_prefix=unique("cz"), clock="manual"
    )
    own_redis.pause()
    task = asyncio.create_task(lim.acquire_concurrent_async("k"))
    for _ in range(50):
        await asyncio.sleep(0)  # the loop turns: nothing is blocked on the lease
        assert not task.done()
    own_redis.resume()
    p = await asyncio.wait_for(task, timeout=60)  # a hang guard
    assert p.allowed and p.decision.reason == "lease" and p.decision.limit == 2
    p.release()


def test_bad_options() -> None:
    # no concurrency (0, the default): acquire_concurrent is a config error
    for lim in (Limiter(limit=10), Limiter(limit=10, concurrency=0), Limiter(limit=10, concurrency=None)):
        with pytest.raises(ConfigError, match="`concurrency` is 0"):
            lim.acquire_concurrent("k")
    for bad in (-1, 2**64, 2**52):
        with pytest.raises(ConfigError, match="concurrency"):
            Limiter(limit=10, concurrency=bad)
    for wrong in (1.5, "three"):
        with pytest.raises(ConfigError, match="concurrency"):
            Limiter(limit=10, concurrency=wrong)  # type: ignore[arg-type]
    for wrong_type in (True, [2], {"n": 2}):
        with pytest.raises(TypeError, match="`concurrency` must be an int"):
            Limiter(limit=10, concurrency=wrong_type)  # type: ignore[arg-type]
    # permits need adaptive leasing
    for options in ({"mode": "exact"}, {"mode": "local"}, {"lease_size": 2}):
        with pytest.raises(ConfigError, match="needs adaptive leasing"):
            Limiter(limit=10, concurrency=2, **options)
    assert Limiter(limit=10, concurrency=2).acquire_concurrent("k").allowed


def test_bad_keys() -> None:
    lim = Limiter(limit=10, concurrency=1)
    for bad in ("", "a\x1fb", "k" * 513):
        with pytest.raises(InvalidKeyError):
            lim.acquire_concurrent(bad)
    with pytest.raises(TypeError):
        lim.acquire_concurrent(5)  # type: ignore[arg-type]
    assert lim.acquire_concurrent("k").allowed, "no bad key took a permit of k"


async def test_bad_keys_async() -> None:
    lim = Limiter(limit=10, concurrency=1)
    with pytest.raises(InvalidKeyError):
        await lim.acquire_concurrent_async("")
    with pytest.raises(ConfigError, match="`concurrency` is 0"):
        await Limiter(limit=10).acquire_concurrent_async("k")


def test_releasing_twice_or_a_denied_permit_is_a_reservation_error(url: str) -> None:
    lim, _ = pair(url, concurrency=1)
    p = lim.acquire_concurrent("k")
    p.release()
    with pytest.raises(ReservationError, match="released already"):
        p.release()
    held = lim.acquire_concurrent("k")
    denied = lim.acquire_concurrent("k")
    assert held.allowed and not denied.allowed
    with pytest.raises(ReservationError, match="no permit was taken"):
        denied.release()
    assert not denied.released
    # neither error released anything: the key's one permit is still held
    assert not lim.acquire_concurrent("k").allowed
    held.release()
    assert lim.acquire_concurrent("k").allowed


def test_a_closed_limiter(url: str) -> None:
    lim, _ = pair(url)
    p = lim.acquire_concurrent("k")
    lim.close()
    with pytest.raises(ClosedError):
        p.release()
    with pytest.raises(ClosedError):
        lim.acquire_concurrent("k")


def test_permit_type() -> None:
    assert issubclass(ReservationError, QuotaLeaseError) and issubclass(ReservationError, ValueError)
    assert ReservationError.__doc__ and "Permit.release" in ReservationError.__doc__
    with pytest.raises(TypeError):
        Permit()
    p = Limiter(limit=10, concurrency=1).acquire_concurrent("k")
    with pytest.raises(AttributeError):
        p.released = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):

        class Sub(Permit):  # type: ignore[misc]
            pass
