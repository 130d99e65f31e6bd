"""A Redis URL's user name and password are never printed: repr, exception
text, the degraded event's message and the `quotalease` log records all show
the URL as the core's rule gives it (redis://***@host:port). Each test also
checks that the host is still shown, so an empty string cannot pass."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from conftest import RedisServer, unique, wait_for
from quotalease import BackendError, ConfigError, Limiter, MisconfiguredError

USER = "alice-user-QRS"
PW = "s3cret-pw-XYZ"


def assert_clean(what: str, text: str) -> None:
    assert PW not in text, f"{what} shows the password: {text}"
    assert USER not in text, f"{what} shows the user name: {text}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_repr_uses_the_cores_rule() -> None:
    for url, shown in [
        (f"redis://{USER}:{PW}@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
        (
            f"redis+cluster://{USER}:{PW}@127.0.0.1:7000,127.0.0.1:7001",
            "redis+cluster://***@127.0.0.1:7000,127.0.0.1:7001",
        ),
        (f"rediss://:{PW}@127.0.0.1:6380", "rediss://***@127.0.0.1:6380"),
        # Accepted by the redis crate (the query holds an @); the binding's
        # own rule before the core's printed "redis://***@<password>".
        (f"redis://127.0.0.1:6379/?x=a@{PW}", "redis://***"),
    ]:
        lim = Limiter(url, limit=5)
        assert_clean("repr", repr(lim))
        assert f"url='{shown}'" in repr(lim), repr(lim)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://{USER}:{PW}@127.0.0.1:notaport",
        f"redis://{USER}:{PW}@127.0.0.1:6379/notadb",
        f"unix:///run/redis.sock?user={USER}&pass={PW}",
        f"{USER}:{PW}@127.0.0.1:6379",
        f"redis://{USER}:{PW}",
    ],
)
def test_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        Limiter(url, limit=5)
    assert_clean("the error", f"{e.value} {e.value!r} {e.value.args}")
    assert "`url`" in str(e.value)


def test_a_url_given_to_another_option() -> None:
    with pytest.raises(ConfigError) as e:
        Limiter(limit=f"redis://{USER}:{PW}@h:1")  # type: ignore[arg-type]
    assert_clean("the error", str(e.value))
    # A string option the engine echoes back, with and without the URL's scheme.
    for url in [f"redis://{USER}:{PW}@db.example:1", f"{USER}:{PW}@db.example:1"]:
        for kw in [{"rate": url}, {"tiers": f"pro={url}"}]:
            with pytest.raises(ConfigError) as e:
                Limiter(**kw)  # type: ignore[arg-type]
            assert_clean(f"the error for {kw}", f"{e.value} {e.value!r}")
            assert "***@db.example:1" in str(e.value), str(e.value)


def test_a_failing_connection(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="quotalease")
    port = closed_port()
    events: list[tuple[str, str]] = []
    seen = threading.Event()

    def on_event(kind: str, message: str) -> None:
        events.append((kind, message))
        seen.set()

    lim = Limiter(
        f"redis://{USER}:{PW}@127.0.0.1:{port}/0",
        limit=100,
        backend_timeout_ms=300,
        key_prefix=unique("sec"),
        on_event=on_event,
    )
    assert lim.acquire("k").reason == "fallback"
    wait_for("a degraded event", seen.is_set)
    kind, message = events[0]
    assert kind == "degraded" and "backend unreachable" in message, events
    assert_clean("the degraded event", message)
    with pytest.raises(BackendError) as e:
        lim.inspect("k")
    assert_clean("the inspect error", f"{e.value} {e.value!r}")
    records = [r.getMessage() for r in caplog.records if r.name == "quotalease"]
    assert any("degraded" in r for r in records), records
    assert_clean("the log records", "\n".join(records))
    assert_clean("repr", repr(lim))
    assert f"redis://***@127.0.0.1:{port}/0" in repr(lim)


def test_a_wrong_password_on_a_real_server(own_redis: RedisServer) -> None:
    own_redis.cli("ACL", "SETUSER", USER, "on", ">another-password", "~*", "+@all")
    events: list[str] = []
    lim = Limiter(
        f"redis://{USER}:{PW}@127.0.0.1:{own_redis.port}",
        limit=100,
        backend_timeout_ms=300,
        key_prefix=unique("sec"),
        on_event=lambda kind, message: events.append(message),
    )
    # a configuration error, not an outage (test_misconfig.py)
    with pytest.raises(MisconfiguredError) as m:
        lim.acquire("k")
    assert_clean("the acquire error", str(m.value))
    wait_for("a degraded event", lambda: bool(events))
    assert "AuthenticationFailed" in events[0], events
    assert_clean("the degraded event", events[0])
    with pytest.raises(MisconfiguredError) as e:
        lim.inspect("k")
    assert_clean("the inspect error", str(e.value))
