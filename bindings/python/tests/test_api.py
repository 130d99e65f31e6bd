"""The Python API on the in-process authority: decisions, metrics, options,
context managers, stubs' promises."""

from __future__ import annotations

import hashlib
import re

import pytest

import quotalease
from conftest import unique
from quotalease import ClosedError, Decision, Limiter, QuotaLeaseError

METRICS = [
    "admitted",
    "denied",
    "backend_calls",
    "backend_errors",
    "tokens_leased",
    "tokens_returned",
    "tokens_expired",
    "fallback_active",
    "fallback_transitions",
    "keys_tracked",
    "overshoot_bound",
    "shadow_denied",
    "tokens_debited",
]


def test_acquire_until_denied() -> None:
    lim = Limiter(limit=3, window_ms=60_000, clock="manual")
    got = [lim.acquire("k") for _ in range(4)]
    assert [bool(d) for d in got] == [True, True, True, False]
    assert [d.remaining for d in got[:3]] == [2, 1, 0]
    denied = got[3]
    assert denied.allowed is False
    assert denied.reason == "exhausted"
    assert denied.retry_after_ms == 20_000  # one token per 60 s / 3
    assert denied.limit == 3 and denied.window_ms == 60_000
    assert got[0].reason == "lease" and got[0].retry_after_ms == 0


def test_a_dropped_decision_reused_reads_the_new_one_and_a_held_one_never_changes() -> None:
    # A limiter writes the next decision into its last one when nothing
    # holds it any more (Limiter::decision): each one read, then dropped...
    lim = Limiter(limit=6, window_ms=60_000, clock="manual")
    assert [lim.acquire("k").remaining for _ in range(3)] == [5, 4, 3]
    assert [lim.try_acquire("k").remaining for _ in range(2)] == [2, 1]
    # ... while one still held keeps its values through the calls after it
    held = lim.acquire("k")
    later = [(d.allowed, d.remaining, d.reason) for d in (lim.acquire("k") for _ in range(2))]
    assert later == [(False, 0, "exhausted")] * 2
    assert (held.allowed, held.remaining, held.reason) == (True, 0, "lease")
    assert held != lim.acquire("k") and held == held


def test_decision_is_immutable_with_repr_and_headers() -> None:
    lim = Limiter(limit=10, window_ms=1000, clock="manual")
    d = lim.acquire("k")
    assert repr(d) == (
        "Decision(allowed=True, reason='lease', limit=10, remaining=9, "
        "retry_after_ms=0, reset_after_ms=100, window_ms=1000)"
    )
    assert d.headers() == {"RateLimit-Policy": '"default";q=10;w=1', "RateLimit": '"default";r=9;t=1'}
    with pytest.raises(AttributeError):
        d.allowed = False  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        Decision()  # type: ignore[call-arg]
    for _ in range(9):
        lim.acquire("k")
    no = lim.acquire("k")
    assert not no
    h = no.headers()
    assert h["Retry-After"] == "1"
    assert set(h) == {"RateLimit-Policy", "RateLimit", "Retry-After"}
    assert d == d and d != no
    # equality as pyo3's `eq` gives it (Decision implements it itself, beside
    # its free list): field by field, another type is not equal, no order,
    # not hashable
    assert d != 1 and not (d == "allowed") and d != None  # noqa: E711
    with pytest.raises(TypeError):
        _ = d < no  # type: ignore[operator]
    with pytest.raises(TypeError):
        hash(d)


def test_rate_string() -> None:
    lim = Limiter(rate="600/min")
    d = lim.acquire("k")
    assert (d.limit, d.window_ms) == (600, 60_000)
    assert Limiter(rate="10/s").acquire("k").window_ms == 1000


def test_defaults_and_repr() -> None:
    lim = Limiter(limit=1000)
    assert lim.lease_size == 20  # 2 % of the limit, at most 20
    assert lim.acquire("k").window_ms == 60_000
    # No lease_size given: adaptive leasing, and the repr says so (not the resolved 20).
    assert repr(lim) == "Limiter(url='memory://', limit=1000, window_ms=60000, lease_size='adaptive', mode='lease')"
    assert repr(Limiter(rate="600/min")) == (
        "Limiter(url='memory://', limit=600, window_ms=60000, lease_size='adaptive', mode='lease')"
    )
    fixed = Limiter(limit=1000, lease_size=20)
    assert repr(fixed) == "Limiter(url='memory://', limit=1000, window_ms=60000, lease_size=20, mode='lease')"
    assert repr(Limiter(limit=5, shadow=True)).endswith("mode='lease', shadow=True)")
    secret = Limiter("redis://:hunter2@127.0.0.1:1/0", limit=5)
    assert "hunter2" not in repr(secret)


def test_metrics_dict_and_prometheus() -> None:
    lim = Limiter(limit=5, window_ms=1000, clock="manual")
    for _ in range(7):
        lim.acquire("k")
    m = lim.metrics()
    assert list(m) == METRICS
    assert m["admitted"] == 5 and m["denied"] == 2 and m["keys_tracked"] == 1
    text = lim.metrics_prometheus()
    assert "quotalease_admitted_total 5" in text
    assert "quotalease_denied_total 2" in text
    assert re.search(r"^# TYPE quotalease_overshoot_bound gauge$", text, re.M)


def test_try_acquire_and_costs() -> None:
    lim = Limiter(limit=10, window_ms=1000, clock="manual")
    assert lim.try_acquire("k", 4).remaining == 6
    assert lim.acquire("k", cost=6).allowed
    assert not lim.try_acquire("k")


def test_set_limit_and_inspect() -> None:
    lim = Limiter(limit=10, window_ms=1000, lease_size=5, clock="manual")
    lim.set_limit("vip", 100)
    d = lim.acquire("vip")
    assert (d.limit, d.window_ms) == (100, 1000)
    lim.set_limit("slow", 2, window_ms=60_000)
    assert lim.acquire("slow").window_ms == 60_000
    info = lim.inspect("vip")
    assert info["limit"] == 100 and info["admitted"] == 1
    assert info["local_tokens"] == 4  # a lease of 5, one spent
    assert info["authority_tokens"] == 95


def test_shared_memory_authority() -> None:
    name = unique("shared")
    a = Limiter(f"memory://{name}", limit=4, window_ms=60_000, lease_size=2, clock="manual")
    b = Limiter(f"memory://{name}", limit=4, window_ms=60_000, lease_size=2, clock="manual")
    allowed = sum(bool(x.acquire("k")) for x in (a, b, a, b, a, b))
    assert allowed == 4


def test_modes() -> None:
    assert Limiter(limit=5, mode="exact").acquire("k").reason == "exact"
    assert Limiter(limit=5, mode="local").acquire("k").reason == "local"


def test_advance_clock_refills() -> None:
    lim = Limiter(limit=2, window_ms=1000, clock="manual")
    lim.acquire("k")
    lim.acquire("k")
    assert not lim.acquire("k")
    lim.advance_clock(500)
    assert lim.acquire("k")


def test_manual_clock_starts_at_one_million_ms_unless_told() -> None:
    lim = Limiter(limit=5, window_ms=1000, clock="manual")
    assert lim.acquire("k")
    assert lim.inspect("k")["authority_refilled_at_ms"] == 1_000_000
    lim.advance_clock(250)
    lim.acquire("other")
    assert lim.inspect("other")["authority_refilled_at_ms"] == 1_000_250
    told = Limiter(limit=5, clock="manual", clock_start_ms=7)
    assert told.acquire("k")
    assert told.inspect("k")["authority_refilled_at_ms"] == 7


def test_http_key_hashes_keys_over_512_bytes() -> None:
    long = "k" * 600
    assert quotalease.http_key(long) == "sha256:" + hashlib.sha256(long.encode()).hexdigest()
    assert quotalease.http_key("é" * 300) == "sha256:" + hashlib.sha256(("é" * 300).encode()).hexdigest()
    for short in ("", "user:42", "x" * 512, "é" * 256):
        assert quotalease.http_key(short) == short
    assert quotalease._native.http_key is quotalease.http_key
    with pytest.raises(TypeError):
        quotalease.http_key(5)  # type: ignore[arg-type]


def test_flush_gives_back() -> None:
    lim = Limiter(limit=100, window_ms=60_000, lease_size=10, clock="manual")
    lim.acquire("k")
    lim.flush()
    m = lim.metrics()
    assert m["tokens_returned"] == 9 and m["overshoot_bound"] == 0


def test_context_manager_closes() -> None:
    with Limiter(limit=5) as lim:
        assert lim.acquire("k")
    with pytest.raises(ClosedError):
        lim.acquire("k")
    lim.close()  # idempotent


async def test_async_context_manager_closes() -> None:
    async with Limiter(limit=5) as lim:
        assert await lim.acquire_async("k")
    with pytest.raises(ClosedError):
        await lim.acquire_async("k")


def test_exception_hierarchy() -> None:
    for cls in (
        quotalease.ConfigError,
        quotalease.InvalidKeyError,
        quotalease.InvalidCostError,
        quotalease.ClosedError,
        quotalease.BackendError,
        quotalease.MisconfiguredError,
        quotalease.ReservationError,
    ):
        assert issubclass(cls, QuotaLeaseError)
        assert cls.__module__ == "quotalease"
    for cls in (
        quotalease.ConfigError,
        quotalease.InvalidKeyError,
        quotalease.InvalidCostError,
        quotalease.ReservationError,
    ):
        assert issubclass(cls, ValueError)
    assert issubclass(quotalease.ClosedError, RuntimeError)
    assert QuotaLeaseError.__module__ == "quotalease"


def test_version_and_exports() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", quotalease.__version__)
    assert set(quotalease.__all__) <= set(dir(quotalease))
    assert issubclass(quotalease.Limiter, quotalease._native.Limiter)


def test_on_event_callback_must_be_callable_but_none_is_fine() -> None:
    Limiter(limit=5, on_event=None)
    Limiter(limit=5, on_event=lambda kind, message: None)


def test_overshoot_budget_caps_what_an_instance_holds() -> None:
    from quotalease import ConfigError

    lim = Limiter(limit=100, window_ms=1000, overshoot_budget="5%", clock="manual")
    for _ in range(10):
        assert lim.acquire("k").allowed
    lim.advance_clock(100)
    # the 3 tokens still held serve three; the fourth asks, with the demand
    # measured, for more, and the budget (5 % of 100) caps it
    for _ in range(4):
        assert lim.acquire("k").allowed
    assert lim.metrics()["overshoot_bound"] == 5
    # "auto", the default, named
    assert Limiter(limit=100, overshoot_budget="auto").acquire("k").allowed
    with pytest.raises(ConfigError, match="overshoot_budget"):
        Limiter(limit=100, overshoot_budget="automatic")
    with pytest.raises(ConfigError, match="overshoot_budget"):
        Limiter(limit=100, overshoot_budget="150%")
    with pytest.raises(ConfigError, match="overshoot_budget"):
        Limiter(limit=100, overshoot_budget=0)
