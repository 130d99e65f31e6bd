"""Every bad input raises the right exception, with a message that says what
to fix: wrong Python types are TypeError; wrong values are QuotaLeaseError
subclasses (ConfigError / InvalidKeyError / InvalidCostError are also
ValueError); use after close is ClosedError. Options go to the engine by
name: an int, float or str it cannot use for an option, and an unknown name,
are ConfigError (the same message in every language); an object that is no
option value at all (a bool, a list) is TypeError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quotalease import (
    ClosedError,
    ConfigError,
    InvalidCostError,
    InvalidKeyError,
    Limiter,
    QuotaLeaseError,
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "every limiter needs a limit"),
        ({"limit": 0}, "`limit` must be at least 1"),
        ({"limit": -1}, "`limit` must be a non-negative integer"),
        ({"limit": 2**70}, "`limit` must be a non-negative integer"),
        ({"limit": 10, "window_ms": 0}, "`window_ms` must be at least 1"),
        ({"limit": 10**12, "window_ms": 10**7}, "at most 2\\^52"),
        ({"limit": 10, "lease_size": 11}, "`lease_size` must be between 1 and limit \\(10\\)"),
        ({"limit": 10, "lease_size": 0}, "`lease_size` must be between 1"),
        ({"limit": 10, "lease_size": 4, "refill_threshold": 5}, "`refill_threshold` must be at most"),
        ({"limit": 10, "lease_ttl_ms": 0}, "`lease_ttl_ms`"),
        ({"limit": 10, "expected_replicas": 0}, "`expected_replicas`"),
        ({"limit": 10, "backend_timeout_ms": 0}, "`backend_timeout_ms`"),
        ({"limit": 10, "backend_timeout_ms": 60_001}, "`backend_timeout_ms`"),
        ({"limit": 10, "max_keys": 0}, "`max_keys`"),
        ({"limit": 10, "key_prefix": "a{b"}, "`key_prefix`"),
        ({"limit": 10, "mode": "fast"}, "`mode` must be one of"),
        ({"limit": 10, "on_backend_failure": "panic"}, "`on_backend_failure` must be one of"),
        ({"limit": 10, "clock": "sundial"}, "`clock` must be"),
        ({"rate": "10/fortnight"}, "`rate` must look like"),
        ({"rate": "10/MIN"}, "`rate` must look like .*one of ms, s \\(sec, secs, second, seconds\\), m \\(min"),
        # One option under two spellings: an error naming both, not the last one silently.
        (
            {"limit": 10, "windowMs": 2000, "window_ms": 1000},
            "`window_ms` was given twice, as `windowMs` and as `window_ms`",
        ),
        ({"rate": "0/min"}, "`limit` must be at least 1"),
        ({"rate": "10/min", "limit": 10}, "`rate` cannot be combined with `limit` or `window_ms`"),
        ({"rate": "10/min", "window_ms": 10}, "`rate` cannot be combined"),
        ({"limit": 10, "clock_start_ms": 5}, '`clock_start_ms` needs `clock` = "manual"'),
        # Values of a type the engine reads (int, float, str), judged by it.
        ({"limit": "10"}, '`limit` must be a whole number \\(got "10"\\)'),
        ({"limit": 10.5}, "`limit` must be a whole number \\(got 10.5\\)"),
        ({"limit": 10, "window_ms": "1s"}, "`window_ms` must be a whole number"),
        ({"limit": 10, "mode": 1}, "`mode` must be a string \\(got 1\\)"),
        ({"limit": 10, "rate": 600}, "`rate` must be a string"),
        # Names: the engine's, with a suggestion in the caller's spelling.
        ({"limit": 10, "lease_sise": 3}, "unknown option `lease_sise`; did you mean `lease_size`\\?"),
        ({"limt": 10}, "unknown option `limt`; did you mean `limit`\\?"),
        ({"limit": 10, "timeout": 5}, "did you mean `backend_timeout_ms`\\?"),
        ({"limit": 10, "speed": "fast"}, "unknown option `speed`; the options are url, limit"),
        ({"limit": 10, "lease_sise": True}, "did you mean `lease_size`"),
    ],
)
def test_bad_config_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        Limiter(**kwargs)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, QuotaLeaseError)


def test_unknown_option_is_a_config_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        Limiter(limit=10, lease_sise=3)  # type: ignore[call-arg]
    assert str(info.value) == "invalid configuration: unknown option `lease_sise`; did you mean `lease_size`?"


def test_whole_floats_are_accepted_as_numbers() -> None:
    # The engine reads numbers the same way in every language (JS has no int).
    lim = Limiter(limit=10.0, window_ms=1e3)  # type: ignore[arg-type]
    assert lim.acquire("k").limit == 10 and lim.acquire("k").window_ms == 1000


@pytest.mark.parametrize(
    "url",
    ["http://localhost", "memory:/x", "", "redis://:99999999", "redis+cluster://", "localhost:6379"],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ConfigError, match="`url`"):
        Limiter(url, limit=10)


def test_a_bad_wait_is_a_type_or_config_error() -> None:
    lim = Limiter(limit=10)
    with pytest.raises(TypeError, match="`wait_ms` must be an int"):
        lim.acquire("k", wait_ms=1.5)
    with pytest.raises(TypeError, match="`wait_ms` must be an int"):
        lim.acquire("k", wait_ms=True)
    with pytest.raises(ConfigError, match="`wait_ms` must be a non-negative integer"):
        lim.acquire("k", wait_ms=-1)
    with pytest.raises(InvalidCostError):
        lim.acquire("k", 0, wait_ms=100)
    assert lim.acquire("k", wait_ms=0).allowed


def test_a_bad_shadow_value_is_a_config_error() -> None:
    for bad in (2, "yes"):
        with pytest.raises(ConfigError, match="`shadow` must be true or false"):
            Limiter(limit=10, shadow=bad)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        # bool is an int subclass, but only `shadow` takes one.
        ((), {"limit": True}, "`limit` must be an int \\(got bool\\)"),
        ((), {"limit": 10, "shadow": [True]}, "`shadow` must be a bool \\(got list\\)"),
        ((), {"limit": 10, "mode": False}, "`mode` must be a str \\(got bool\\)"),
        ((), {"limit": 10, "lease_size": [1]}, "`lease_size` must be an int \\(got list\\)"),
        ((), {"limit": 10, "key_prefix": b"p"}, "`key_prefix` must be a str \\(got bytes\\)"),
        ((5,), {"limit": 10}, "url"),
        ((), {"limit": 10, "on_event": 5}, "`on_event` must be a callable"),
        (("memory://", 10), {}, "positional"),
    ],
)
def test_bad_config_types(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        Limiter(*args, **kwargs)


@pytest.fixture
def lim() -> Limiter:
    return Limiter(limit=10, window_ms=1000, clock="manual")


def call(lim: Limiter, method: str, *args: Any) -> Any:
    if method == "acquire_async":
        return asyncio.run(lim.acquire_async(*args))
    return getattr(lim, method)(*args)


METHODS = ["acquire", "try_acquire", "acquire_async"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_bad_keys_and_costs(lim: Limiter, method: str, warm: bool) -> None:
    if warm:
        assert lim.acquire("k")
    with pytest.raises(InvalidKeyError, match="the key is empty"):
        call(lim, method, "")
    with pytest.raises(InvalidKeyError, match="513 bytes long; at most 512"):
        call(lim, method, "x" * 513)
    with pytest.raises(InvalidKeyError):
        call(lim, method, "é" * 257)  # 514 UTF-8 bytes
    for cost in (0, 11):
        with pytest.raises(
            InvalidCostError,
            match=f"invalid cost {cost}: must be at least 1 and at most the key's limit \\(10\\)",
        ):
            call(lim, method, "k", cost)
    for cost in (-1, 2**64):
        with pytest.raises(InvalidCostError, match="invalid cost"):
            call(lim, method, "k", cost)
    for key in (5, None, b"k", ["k"]):
        with pytest.raises(TypeError):
            call(lim, method, key)
    for cost in (1.0, "1", True, None):
        with pytest.raises(TypeError, match="cost"):
            call(lim, method, "k", cost)
    with pytest.raises(ValueError):
        call(lim, method, "\udc80")  # a lone surrogate cannot be encoded
    assert call(lim, method, "x" * 512)  # the longest key is fine
    m = lim.metrics()
    assert m["admitted"] == 1 + int(warm)


def test_bad_set_limit(lim: Limiter) -> None:
    with pytest.raises(ConfigError, match="`limit` must be at least 1"):
        lim.set_limit("k", 0)
    with pytest.raises(ConfigError, match="`window_ms` must be at least 1"):
        lim.set_limit("k", 5, 0)
    with pytest.raises(ConfigError, match="non-negative"):
        lim.set_limit("k", -5)
    with pytest.raises(InvalidKeyError):
        lim.set_limit("", 5)
    with pytest.raises(TypeError):
        lim.set_limit("k", "5")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lim.set_limit("k")  # type: ignore[call-arg]


def test_bad_clock_use() -> None:
    with pytest.raises(ConfigError, match="advance_clock needs clock = manual"):
        Limiter(limit=5).advance_clock(10)
    with pytest.raises(ConfigError):
        Limiter(limit=5, clock="manual").advance_clock(-10)
    with pytest.raises(TypeError):
        Limiter(limit=5, clock="manual").advance_clock(1.5)


def test_use_after_close(lim: Limiter) -> None:
    lim.acquire("k")
    lim.close()
    calls = [
        lambda: lim.acquire("k"),
        lambda: lim.acquire("other"),
        lambda: lim.try_acquire("k"),
        lambda: asyncio.run(lim.acquire_async("k")),
        lambda: lim.set_limit("k", 5),
        lambda: lim.flush(),
        lambda: lim.settle(),
        lambda: lim.inspect("k"),
    ]
    for c in calls:
        with pytest.raises(ClosedError, match="the limiter is closed; create a new Limiter") as info:
            c()
        assert isinstance(info.value, QuotaLeaseError)
        assert isinstance(info.value, RuntimeError)
    lim.close()  # idempotent
    with lim:  # entering a closed limiter is harmless; exiting closes again
        pass
