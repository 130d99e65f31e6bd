"""Many Python threads on one limiter: exact counts, and the GIL is released
while a call waits for the backend."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import DAY, RedisServer, day_limiter, unique, wait_for
from quotalease import Limiter


def hammer(lim: Limiter, key: str, n: int) -> int:
    return sum(bool(lim.acquire(key)) for _ in range(n))


def test_threads_on_memory_admit_exactly_the_limit() -> None:
    lim = Limiter(limit=5000, window_ms=DAY, clock="manual")
    with ThreadPoolExecutor(8) as pool:
        allowed = sum(pool.map(lambda _: hammer(lim, "k", 1000), range(8)))
    m = lim.metrics()
    assert allowed == 5000
    assert (m["admitted"], m["denied"]) == (5000, 3000)


def test_decisions_held_by_threads_are_their_own() -> None:
    # Each thread holds every decision of its own key while others drop
    # theirs at once (the limiter reuses a dropped one): a held decision
    # overwritten by another call would break its thread's countdown.
    lim = Limiter(limit=3000, window_ms=DAY, clock="manual")

    def countdown(i: int) -> list[int]:
        key, kept = f"k{i}", []
        for n in range(3000):
            if n % 3 == 0:
                kept.append(lim.acquire(key))
            else:
                lim.acquire(key)
        return [d.remaining for d in kept]

    with ThreadPoolExecutor(8) as pool:
        for left in pool.map(countdown, range(8)):
            assert left == list(range(2999, -1, -3)), left[:10]


def test_threads_on_two_redis_instances_conserve_tokens(redis_server: RedisServer) -> None:
    prefix = unique("thr")
    limiters = [day_limiter(redis_server, prefix, limit=2000, lease_size=20) for _ in range(2)]
    with ThreadPoolExecutor(8) as pool:
        allowed = sum(pool.map(lambda i: hammer(limiters[i % 2], "k", 400), range(8)))
    for lim in limiters:
        lim.settle()
    held = sum(lim.metrics()["overshoot_bound"] for lim in limiters)
    admitted = sum(lim.metrics()["admitted"] for lim in limiters)
    assert admitted == allowed
    assert allowed + held + limiters[0].inspect("k")["authority_tokens"] == 2000
    assert allowed <= 2000


def test_the_gil_is_released_while_acquire_waits(own_redis: RedisServer) -> None:
    # No policy store (policy_refresh_ms=0): a cold key's first acquire would
    # otherwise wait for the store's first answer before its entry exists,
    # and keys_tracked is how this test sees the worker inside acquire().
    lim = Limiter(
        own_redis.url,
        limit=100,
        window_ms=DAY,
        backend_timeout_ms=60_000,
        key_prefix=unique("gil"),
        policy_refresh_ms=0,
    )
    own_redis.pause()
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(lim.acquire("k")))
    worker.start()
    # This thread polls Python code while the worker is inside acquire(),
    # blocked on the paused server: possible only with the GIL released.
    wait_for("the worker to enter acquire", lambda: lim.metrics()["keys_tracked"] == 1)
    assert worker.is_alive() and result == []
    own_redis.resume()
    worker.join(60)
    assert not worker.is_alive()
    assert result and bool(result[0])
