"""Reserve, then settle (Limiter.reserve / reserve_async and Reservation), on
memory:// and a real redis-server, with a manual clock: what goes back, what is
owed, what an unsettled reservation keeps, the typed errors, and the FastAPI
streaming example (examples/fastapi_stream_settle.py)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import PATIENT, ROOT, RedisServer, unique
from quotalease import (
    ClosedError,
    ConfigError,
    Decision,
    InvalidCostError,
    Limiter,
    QuotaLeaseError,
    Reservation,
    ReservationError,
)

MINUTE = 60_000


@pytest.fixture(params=["memory", "redis"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs on a memory://NAME of its own and on the shared redis-server."""
    if request.param == "memory":
        yield f"memory://{unique('rsv')}"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url


def limiter(url: str, **options: Any) -> Limiter:
    """A limiter on `url` with a manual clock (nothing refills unless told) and
    keys no other test uses."""
    options.setdefault("window_ms", MINUTE)
    return Limiter(url, backend_timeout_ms=PATIENT, key_prefix=unique("rsv"), clock="manual", **options)


def drain(lim: Limiter, key: str, tier: str | None = None) -> int:
    """Requests of cost 1 admitted at this instant until the first denial."""
    n = 0
    while lim.acquire(key, tier=tier).allowed:
        n += 1
        assert n <= 10_000, "never denied"
    return n


def test_settled_below_its_estimate_the_rest_goes_back(url: str) -> None:
    lim = limiter(url, limit=100)
    r = lim.reserve("k", 40)
    assert isinstance(r, Reservation)
    assert (r.allowed, r.estimate, r.key, r.settled) == (True, 40, "k", False)
    assert isinstance(r.decision, Decision) and r.decision.allowed and r.decision.limit == 100
    assert repr(r) == "Reservation(key='k', estimate=40, allowed=True, settled=False)"
    r.settle(10)
    assert r.settled
    assert repr(r) == "Reservation(key='k', estimate=40, allowed=True, settled=True)"
    assert drain(lim, "k") == 90, "the key spent what was used, 10"
    assert lim.metrics()["tokens_debited"] == 0


def test_settled_above_its_estimate_the_key_is_in_debt(url: str) -> None:
    lim = limiter(url, limit=100)
    r = lim.reserve("k", 10)
    assert r.allowed
    r.settle(150)
    assert lim.metrics()["tokens_debited"] == 140
    assert "quotalease_tokens_debited_total 140\n" in lim.metrics_prometheus()
    lim.settle()  # the debit has reached the authority
    d = lim.acquire("k")
    assert not d.allowed and d.reason == "exhausted", d
    # 50 tokens owed at 100 a minute: paid after 30 s, a token refilled 0.6 s later
    lim.advance_clock(29_000)
    assert not lim.acquire("k").allowed, "48 of 50 paid"
    lim.advance_clock(2_000)
    assert lim.acquire("k").allowed, "paid, and a token refilled"


def test_settled_at_its_estimate_or_at_zero(url: str) -> None:
    lim = limiter(url, limit=100)
    lim.reserve("exact", 30).settle(30)
    assert drain(lim, "exact") == 70
    lim.reserve("nothing", 30).settle(0)
    assert drain(lim, "nothing") == 100, "a request that used nothing cost nothing"


def test_a_reservation_dropped_unsettled_keeps_its_estimate(url: str) -> None:
    lim = limiter(url, limit=100)
    lim.reserve("k", 40)  # dropped at once
    assert drain(lim, "k") == 60
    assert lim.inspect("k")["local_tokens"] == 0
    r = lim.reserve("gc", 25)
    del r
    gc.collect()
    assert drain(lim, "gc") == 75


def test_a_with_block_exited_unsettled_keeps_its_estimate(url: str) -> None:
    lim = limiter(url, limit=100)
    with lim.reserve("k", 40) as r:
        assert r.allowed
    assert not r.settled
    assert drain(lim, "k") == 60
    # an exception in the block goes on (__exit__ returns False); the estimate stands
    with pytest.raises(RuntimeError, match="model failed"), lim.reserve("e", 40) as failed:
        raise RuntimeError("model failed")
    assert not failed.settled
    assert drain(lim, "e") == 60
    with lim.reserve("s", 40) as settled:
        settled.settle(5)
    assert drain(lim, "s") == 95


def test_reserve_with_a_tier(url: str) -> None:
    lim = limiter(url, limit=100, tiers="two=100/min, 120/hour")
    r = lim.reserve("m", 40, tier="two")
    assert r.allowed and r.decision.rules == ((100, MINUTE), (120, 3_600_000))
    r.settle(10)
    assert drain(lim, "m", tier="two") == 90, "every rule of the tier got its 30 back"
    lim.advance_clock(MINUTE)
    # the hour rule spent 100 of 120 (not 130), plus its 2 a minute refill (a
    # token of its lease may lapse with its commitment meanwhile)
    assert 20 <= drain(lim, "m", tier="two") <= 22
    # no tier named: the limiter's limit, on a bucket of its own
    assert lim.reserve("m", 40).decision.rules == ((100, MINUTE),)
    with pytest.raises(ConfigError, match="tier"):
        lim.reserve("m", 1, tier="nope")
    with pytest.raises(TypeError, match="`tier` must be a str or None"):
        lim.reserve("m", 1, tier=2)  # type: ignore[arg-type]


def test_settling_twice_or_a_denied_reservation_is_a_reservation_error(url: str) -> None:
    lim = limiter(url, limit=10)
    r = lim.reserve("k", 10)
    r.settle(10)
    with pytest.raises(ReservationError, match="settled already"):
        r.settle(5)
    denied = lim.reserve("k", 1)
    assert not denied.allowed and not denied.decision
    assert denied.decision.reason == "exhausted" and denied.decision.retry_after_ms > 0
    assert repr(denied) == "Reservation(key='k', estimate=1, allowed=False, settled=False)"
    with pytest.raises(ReservationError, match="denied"):
        denied.settle(0)


def test_bad_estimates_and_actuals(url: str) -> None:
    lim = limiter(url, limit=10)
    # an estimate is a cost: at least 1, at most the limit
    for bad in (0, 11):
        with pytest.raises(InvalidCostError, match=f"invalid cost {bad}: must be at least 1"):
            lim.reserve("k", bad)
    for bad in (-1, 2**64):
        with pytest.raises(InvalidCostError, match="invalid cost"):
            lim.reserve("k", bad)
    for wrong in (1.0, "1", True, None):
        with pytest.raises(TypeError, match="`estimate` must be an int"):
            lim.reserve("k", wrong)  # type: ignore[arg-type]
    r = lim.reserve("k", 4)
    with pytest.raises(ReservationError) as e:
        r.settle(-3)
    assert str(e.value) == "invalid settle: actual must be a whole number of tokens, 0 or more (got -3)"
    for wrong in (1.0, 2.5, "1", True, False, None):
        with pytest.raises(TypeError, match=r"`actual` must be an int \(got "):
            r.settle(wrong)  # type: ignore[arg-type]
    with pytest.raises(OverflowError, match="below 2"):
        r.settle(2**64)
    # none of those settled it
    assert not r.settled
    r.settle(1)
    assert drain(lim, "k") == 9


def test_a_closed_limiter(url: str) -> None:
    lim = limiter(url, limit=10)
    r = lim.reserve("k", 2)
    lim.close()
    with pytest.raises(ClosedError):
        r.settle(1)
    with pytest.raises(ClosedError):
        lim.reserve("k", 1)


async def test_reserve_async_and_async_with(url: str) -> None:
    lim = limiter(url, limit=100)
    async with await lim.reserve_async("k", 40) as r:
        assert isinstance(r, Reservation) and r.allowed
        r.settle(10)
    assert drain(lim, "k") == 90
    async with await lim.reserve_async("unsettled", 40) as u:
        assert u.allowed
    assert not u.settled
    assert drain(lim, "unsettled") == 60
    with pytest.raises(RuntimeError, match="model failed"):
        async with await lim.reserve_async("e", 40):
            raise RuntimeError("model failed")
    assert drain(lim, "e") == 60
    tiered = limiter(url, limit=100, tiers="two=100/min, 120/hour")
    t = await tiered.reserve_async("m", 40, tier="two")
    assert t.decision.rules == ((100, MINUTE), (120, 3_600_000))


async def test_reserve_async_errors(url: str) -> None:
    lim = limiter(url, limit=10)
    with pytest.raises(InvalidCostError):
        await lim.reserve_async("k", 0)
    with pytest.raises(TypeError, match="`estimate` must be an int"):
        await lim.reserve_async("k", 1.5)  # type: ignore[arg-type]
    r = await lim.reserve_async("k", 10)
    r.settle(10)
    with pytest.raises(ReservationError, match="settled already"):
        r.settle(1)
    denied = await lim.reserve_async("k", 1)
    assert not denied.allowed
    lim.close()
    with pytest.raises(ClosedError):
        await lim.reserve_async("k", 1)


async def test_reserve_async_awaits_a_pending_lease_with_the_loop_free(own_redis: RedisServer) -> None:
    """A cold key on a stopped server: the reservation is pending on a future
    while the loop runs other work, and completes once the server is back."""
    lim = Limiter(
        own_redis.url, limit=100, window_ms=MINUTE, backend_timeout_ms=60_000, key_prefix=unique("rz"), clock="manual"
    )
    own_redis.pause()
    task = asyncio.create_task(lim.reserve_async("k", 40))
    for _ in range(50):
        await asyncio.sleep(0)  # the loop turns: nothing is blocked on the lease
        assert not task.done()
    own_redis.resume()
    r = await asyncio.wait_for(task, timeout=60)  # a hang guard
    assert r.allowed and r.decision.reason == "lease"
    r.settle(10)
    assert drain(lim, "k") == 90


def test_reservation_types() -> None:
    assert issubclass(ReservationError, QuotaLeaseError) and issubclass(ReservationError, ValueError)
    assert ReservationError.__module__ == "quotalease"
    assert ReservationError.__doc__ and "settled already" in ReservationError.__doc__
    with pytest.raises(TypeError):
        Reservation()
    r = Limiter(limit=10).reserve("k", 1)
    with pytest.raises(AttributeError):
        r.estimate = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        r.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):

        class Sub(Reservation):  # type: ignore[misc]
            pass


# ---------------------------------------------------------------------------
# The FastAPI streaming example.


def load_example() -> ModuleType:
    path = ROOT / "bindings" / "python" / "examples" / "fastapi_stream_settle.py"
    spec = importlib.util.spec_from_file_location("fastapi_stream_settle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_streaming_example_charges_what_was_streamed() -> None:
    example = load_example()
    assert example.ESTIMATE == 50
    lim = Limiter(f"memory://{unique('stream')}", limit=1000, window_ms=3_600_000, clock="manual")
    with TestClient(example.create_app(lim)) as client:
        r = client.get("/generate", params={"words": 7}, headers={"x-api-key": "ann"})
        assert r.status_code == 200 and r.text == "".join(f"word{i} " for i in range(7))
        assert r.headers["ratelimit-policy"] == '"default";q=1000;w=3600'
        # above the estimate: the key pays the 80 it streamed, 30 more than reserved
        r = client.get("/generate", params={"words": 80}, headers={"x-api-key": "bob"})
        assert r.status_code == 200 and len(r.text.split()) == 80
    assert lim.metrics()["tokens_debited"] == 30
    assert drain(lim, "ann") == 1000 - 7, "ann was charged the 7 tokens streamed, not the estimate"
    assert drain(lim, "bob") == 1000 - 80
    # the module's own app runs as written
    with TestClient(example.app) as client:
        assert client.get("/generate", params={"words": 3}).text == "word0 word1 word2 "


def test_streaming_example_denies_a_key_that_cannot_afford_the_estimate() -> None:
    example = load_example()
    lim = Limiter(f"memory://{unique('stream')}", limit=100, window_ms=3_600_000, clock="manual")
    with TestClient(example.create_app(lim)) as client:
        assert client.get("/generate", params={"words": 60}, headers={"x-api-key": "k"}).status_code == 200
        denied = client.get("/generate", headers={"x-api-key": "k"})
        assert denied.status_code == 429, denied.text
        assert denied.json()["retry_after_ms"] > 0 and "retry-after" in denied.headers
    assert drain(lim, "k") == 40, "a denied request charged nothing"


async def test_streaming_example_settles_a_stream_closed_early() -> None:
    """The client went away after 2 tokens: the generator is closed, and the
    reservation is settled at 2."""
    example = load_example()
    lim = Limiter(f"memory://{unique('stream')}", limit=100, window_ms=3_600_000, clock="manual")
    r = await lim.reserve_async("k", example.ESTIMATE)
    stream = example.settled_stream(r, example.model("w", 10))
    assert [await anext(stream), await anext(stream)] == ["w0 ", "w1 "]
    assert not r.settled
    await stream.aclose()
    assert r.settled
    assert drain(lim, "k") == 98
