"""A limiter created (and used) before os.fork() works in the child: no hang,
and the child never spends the parent's leased tokens a second time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from conftest import DAY, PATIENT, RedisServer, day_limiter, unique
from quotalease import Limiter


def run_in_child(fn: Any) -> dict[str, Any]:
    """Fork, run fn() in the child, return what it reported (JSON via a pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            out = json.dumps(fn()).encode()
        except BaseException as e:  # report, never fall back into pytest
            out = json.dumps({"error": repr(e)}).encode()
            code = 1
        os.write(w, out)
        os.close(w)
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 60  # hang guard
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.005)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    report: dict[str, Any] = json.loads(data)
    assert os.WEXITSTATUS(status) == 0, report
    return report


def test_fork_with_redis_no_hang_no_double_spend(redis_server: RedisServer) -> None:
    lim = day_limiter(redis_server, unique("fork"), limit=100, lease_size=10)
    assert lim.acquire("k")  # the parent leases 10 and runs its broker
    lim.settle()
    before = lim.metrics()  # the child inherits these counters
    assert before["overshoot_bound"] == 9 and before["tokens_leased"] == 10

    def child() -> dict[str, Any]:
        allowed = [bool(lim.acquire("k")) for _ in range(50)]
        allowed.append(bool(asyncio.run(lim.acquire_async("k"))))
        lim.settle()
        return {"allowed": allowed, "metrics": lim.metrics()}

    got = run_in_child(child)
    assert all(got["allowed"]) and len(got["allowed"]) == 51
    m = {k: v - before[k] for k, v in got["metrics"].items() if k != "overshoot_bound"}
    assert m["tokens_expired"] == 9  # the parent's lease, dropped in the child
    assert m["admitted"] == 51
    assert m["tokens_leased"] >= 51  # everything the child admitted came from Redis
    # Redis agrees: the parent took 10, the child what it leased, nothing else.
    lim.settle()
    assert lim.inspect("k")["authority_tokens"] == 100 - 10 - m["tokens_leased"]
    # The parent still owns (and may spend) its own 9 tokens.
    assert all(lim.acquire("k") for _ in range(9))
    assert lim.metrics()["admitted"] == 10
    lim.close()


def test_fork_with_memory_authority() -> None:
    lim = Limiter(limit=10, window_ms=DAY, lease_size=5, clock="manual")
    assert lim.acquire("k")

    def child() -> dict[str, Any]:
        return {"allowed": [bool(lim.acquire("k")) for _ in range(12)], "metrics": lim.metrics()}

    got = run_in_child(child)
    # The child's copy of the in-process authority holds 5 tokens; the 4
    # the parent leased are dropped, not spent again.
    assert got["allowed"].count(True) == 5
    assert got["metrics"]["tokens_expired"] == 4


def test_fork_of_an_idle_limiter_and_close_in_child(redis_server: RedisServer) -> None:
    lim = Limiter(redis_server.url, backend_timeout_ms=PATIENT, limit=10, key_prefix=unique("idle"))

    def child() -> dict[str, Any]:
        d = lim.acquire("k")
        lim.close()
        return {"allowed": d.allowed}

    assert run_in_child(child) == {"allowed": True}
    assert lim.acquire("k")  # the parent is unaffected by the child's close


def test_a_parents_waiter_does_not_hold_the_childs_queue() -> None:
    import threading

    # The refill comes within the wait: the waiter waits (up to 3 s) for it.
    lim = Limiter(limit=1, window_ms=3_000, lease_size=1)
    assert lim.acquire("k")
    waiter = threading.Thread(target=lambda: lim.acquire("k", wait_ms=30_000))
    waiter.start()
    deadline = time.monotonic() + 30
    while lim.waiters("k") != 1:
        assert time.monotonic() < deadline, "the parent's waiter never queued"
        time.sleep(0.005)

    def child() -> dict[str, Any]:
        lim.acquire("other")  # any call notices the fork
        return {"waiters": lim.waiters("k")}

    got = run_in_child(child)
    waiter.join()
    # The parent's waiter is not in the child: its queue is gone there.
    assert got["waiters"] == 0
