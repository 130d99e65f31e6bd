"""acquire_async never blocks the event loop: pending leases are awaited on
an asyncio future completed from the broker thread."""

from __future__ import annotations

import asyncio

import pytest

from conftest import DAY, PATIENT, RedisServer, unique
from quotalease import ClosedError, Decision, InvalidKeyError, Limiter


async def test_memory_acquire_async() -> None:
    lim = Limiter(limit=3, window_ms=DAY)
    got = [await lim.acquire_async("k") for _ in range(4)]
    assert [d.allowed for d in got] == [True, True, True, False]
    assert isinstance(got[0], Decision)


async def test_redis_acquire_async_cold_and_warm(redis_server: RedisServer) -> None:
    lim = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=100, window_ms=DAY, lease_size=10, key_prefix=unique("as")
    )
    first = await lim.acquire_async("k")  # cold: awaits the lease on a future
    assert first.allowed and first.reason == "lease"
    rest = [await lim.acquire_async("k") for _ in range(20)]
    assert all(rest)
    assert lim.metrics()["admitted"] == 21
    lim.close()


async def test_acquire_async_is_a_coroutine_usable_as_a_task(redis_server: RedisServer) -> None:
    lim = Limiter(redis_server.url, backend_timeout_ms=PATIENT, limit=100, window_ms=DAY, key_prefix=unique("task"))
    task = asyncio.create_task(lim.acquire_async("k"))
    assert (await task).allowed


async def test_many_concurrent_waiters_on_one_cold_key(redis_server: RedisServer) -> None:
    lim = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=60, window_ms=DAY, lease_size=10, key_prefix=unique("many")
    )
    got = await asyncio.gather(*(lim.acquire_async("k") for _ in range(100)))
    allowed = sum(d.allowed for d in got)
    lim.settle()
    held = lim.metrics()["overshoot_bound"]
    assert allowed + held + lim.inspect("k")["authority_tokens"] == 60
    assert allowed >= 50


async def test_event_loop_stays_responsive_while_redis_is_paused(own_redis: RedisServer) -> None:
    lim = Limiter(own_redis.url, limit=100, window_ms=DAY, backend_timeout_ms=60_000, key_prefix=unique("pz"))
    own_redis.pause()
    acquire = asyncio.create_task(lim.acquire_async("k"))
    ticks = 0
    # The loop keeps running other tasks while the lease is pending; the
    # acquire cannot finish while Redis is stopped (its timeout is 60 s).
    while ticks < 50:
        await asyncio.sleep(0.001)
        ticks += 1
        assert not acquire.done()
    own_redis.resume()
    d = await asyncio.wait_for(acquire, timeout=60)
    assert d.allowed and d.reason == "lease"


async def test_cancelled_waiter_leaves_the_loop_clean(own_redis: RedisServer) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    lim = Limiter(own_redis.url, limit=100, window_ms=DAY, backend_timeout_ms=60_000, key_prefix=unique("cx"))
    own_redis.pause()
    task = asyncio.create_task(lim.acquire_async("k"))
    await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    own_redis.resume()
    # A later acquire on the same key completes; the cancelled future's
    # late completion is dropped without an "exception in callback".
    d = await asyncio.wait_for(lim.acquire_async("k"), timeout=60)
    assert d.allowed
    for _ in range(10):
        await asyncio.sleep(0)
    assert errors == []


async def test_errors_are_raised_from_await(redis_server: RedisServer) -> None:
    lim = Limiter(redis_server.url, backend_timeout_ms=PATIENT, limit=10, key_prefix=unique("err"))
    with pytest.raises(InvalidKeyError):
        await lim.acquire_async("")
    lim.close()
    with pytest.raises(ClosedError):
        await lim.acquire_async("k")


async def test_exact_mode_async(redis_server: RedisServer) -> None:
    lim = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=2, window_ms=DAY, mode="exact", key_prefix=unique("ex")
    )
    got = [await lim.acquire_async("k") for _ in range(3)]
    assert [d.allowed for d in got] == [True, True, False]
    assert {d.reason for d in got} == {"exact"}


async def test_acquire_async_waits_for_tokens_in_arrival_order_without_blocking_the_loop() -> None:
    lim = Limiter(limit=2, window_ms=1000, lease_size=1)
    assert lim.acquire("k", 2).allowed
    denied = await lim.acquire_async("k", 2, wait_ms=10)
    assert not denied.allowed and denied.retry_after_ms > 10  # two tokens take a second
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick = asyncio.create_task(ticker())
    order: list[str] = []

    async def wait(name: str, cost: int) -> None:
        d = await lim.acquire_async("k", cost, wait_ms=30_000)
        assert d.allowed, d
        order.append(name)

    first = asyncio.create_task(wait("two tokens, first", 2))
    while lim.waiters("k") != 1:
        await asyncio.sleep(0.005)
    second = asyncio.create_task(wait("one token, second", 1))
    await asyncio.gather(first, second)
    tick.cancel()
    assert order == ["two tokens, first", "one token, second"]
    assert ticks > 0, "the loop ran while the requests waited"
    m = lim.metrics()
    assert (m["admitted"], m["denied"]) == (3, 1)
