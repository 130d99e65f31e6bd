"""Against a real redis-server: instances share one bucket, tokens are
conserved, flush gives back, and backend transitions reach Python logging."""

from __future__ import annotations

import logging
import sys
import threading

import pytest

from conftest import DAY, PATIENT, RedisServer, day_limiter, unique, wait_for
from quotalease import ConfigError, Limiter


def test_instances_share_one_bucket(redis_server: RedisServer) -> None:
    prefix = unique("share")
    a = day_limiter(redis_server, prefix, limit=50, lease_size=5)
    b = day_limiter(redis_server, prefix, limit=50, lease_size=5)
    allowed = 0
    for _ in range(40):
        for lim in (a, b):
            allowed += bool(lim.acquire("k"))
    a.settle()
    b.settle()
    held = a.metrics()["overshoot_bound"] + b.metrics()["overshoot_bound"]
    authority = a.inspect("k")["authority_tokens"]
    # Conservation: every token is admitted, held in a lease, or in Redis.
    assert allowed + held + authority == 50
    assert allowed <= 50 and allowed >= 50 - 2 * 5
    # The bucket is stored under the hash-tagged key the design names.
    assert redis_server.cli("EXISTS", f"{prefix}:{{k}}") == "1"


def test_flush_returns_tokens_to_redis(redis_server: RedisServer) -> None:
    prefix = unique("flush")
    lim = day_limiter(redis_server, prefix, limit=100, lease_size=10)
    assert lim.acquire("k")
    lim.settle()
    assert lim.inspect("k")["authority_tokens"] == 90
    lim.flush()
    assert lim.inspect("k")["authority_tokens"] == 99
    assert lim.metrics()["tokens_returned"] == 9
    lim.close()


def test_exact_mode_calls_redis_every_time(redis_server: RedisServer) -> None:
    lim = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=3, window_ms=DAY, mode="exact", key_prefix=unique("exact")
    )
    got = [lim.acquire("k") for _ in range(4)]
    assert [d.allowed for d in got] == [True, True, True, False]
    assert {d.reason for d in got} == {"exact"}
    assert lim.metrics()["backend_calls"] == 4


def test_unreachable_redis_applies_the_failure_policy() -> None:
    # Port 1 on loopback: connection refused, immediately.
    deny = Limiter("redis://127.0.0.1:1", limit=10, on_backend_failure="deny", backend_timeout_ms=200)
    d = deny.acquire("k")
    assert not d and d.reason == "fallback"
    allow = Limiter("redis://127.0.0.1:1", limit=10, on_backend_failure="allow", backend_timeout_ms=200)
    d = allow.acquire("k")
    assert d and d.reason == "fallback"
    # static-share: a key never answered starts its share (10 / 5 a minute)
    # empty when the circuit opens and admits the refill since: one token
    # each 30 s, so none yet.
    share = Limiter("redis://127.0.0.1:1", limit=10, window_ms=60_000, expected_replicas=5, backend_timeout_ms=200)
    d = share.acquire("k")
    assert not d and d.reason == "fallback" and 0 < d.retry_after_ms <= 30_000, d


def test_rediss_and_cluster_urls_are_accepted_without_connecting() -> None:
    Limiter("rediss://127.0.0.1:1", limit=5)
    Limiter("redis+cluster://127.0.0.1:1,127.0.0.1:2", limit=5)
    with pytest.raises(ConfigError):
        Limiter("redis://127.0.0.1:notaport", limit=5)


def test_transitions_are_logged_and_reported(own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="quotalease")
    events: list[tuple[str, str]] = []
    seen = threading.Event()

    def on_event(kind: str, message: str) -> None:
        events.append((kind, message))
        seen.set()

    lim = Limiter(
        own_redis.url,
        limit=1000,
        lease_size=1,
        refill_threshold=0,
        backend_timeout_ms=200,
        key_prefix=unique("ev"),
        on_event=on_event,
    )
    assert lim.acquire("k").reason == "lease"
    own_redis.kill()
    n = 0

    def degraded() -> bool:
        nonlocal n
        n += 1
        lim.acquire(f"cold{n}")
        return any(k == "degraded" for k, _ in events)

    wait_for("a degraded event", degraded)
    assert lim.metrics()["fallback_active"] == 1
    own_redis.restart()
    wait_for("a recovered event", lambda: lim.acquire("k") is not None and any(k == "recovered" for k, _ in events))
    assert lim.metrics()["fallback_active"] == 0
    assert lim.metrics()["fallback_transitions"] >= 2
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "quotalease"]
    assert any(level == logging.ERROR and "degraded" in msg for level, msg in records), records
    assert any(level == logging.WARNING and "recovered" in msg for level, msg in records), records
    kinds = [k for k, _ in events]
    assert kinds.index("degraded") < kinds.index("recovered")
    assert all(message for _, message in events)


def test_a_failing_event_callback_does_not_break_the_limiter(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def bad(kind: str, message: str) -> None:
        calls.append(kind)
        raise RuntimeError("callback bug")

    lim = Limiter(own_redis.url, limit=100, lease_size=1, refill_threshold=0, backend_timeout_ms=200, on_event=bad)
    own_redis.kill()
    n = 0

    def fired() -> bool:
        nonlocal n
        n += 1
        lim.acquire(f"k{n}")
        return bool(calls)

    wait_for("the callback's error to be reported", lambda: fired() and bool(reported))
    assert isinstance(reported[0], RuntimeError) and str(reported[0]) == "callback bug"
    assert lim.acquire("again").reason == "fallback"


@pytest.mark.parametrize("store_ms", [0, 1000])
def test_a_black_hole_costs_one_timeout(store_ms: int) -> None:
    # A server that accepts connections and never answers (a listening
    # socket nobody reads): a cold acquire waits one backend_timeout_ms in
    # all, connect included, and a first silence is denied as pending (the
    # failure policy decides once the silence lasts a timeout more).
    # Following a policy store, the key's first store read and its lease
    # share that wait (each once had its own).
    import socket
    import time

    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        lim = Limiter(
            url=f"redis://127.0.0.1:{hole.getsockname()[1]}",
            rate="600/min",
            backend_timeout_ms=1000,
            policy_refresh_ms=store_ms,
        )
        start = time.monotonic()
        d = lim.acquire("k")
        waited = time.monotonic() - start
        lim.close()
    assert waited < 2.0, f"waited {waited:.2f} s: more than one backend_timeout_ms (1 s)"
    assert not d.allowed, d
    if store_ms == 0:
        assert d.reason == "pending", d
