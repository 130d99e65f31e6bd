"""Shared fixtures: real redis-server processes from the project's one harness
script (tests/harness/redisctl), unique key prefixes, and a bounded poll."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quotalease import Limiter

ROOT = Path(__file__).resolve().parents[3]
REDISCTL = ROOT / "tests" / "harness" / "redisctl"
VECTORS = ROOT / "tests" / "vectors"

# This suite's own harness state, so parallel suites never stop our servers.
# Kept in the environment: pytest loads this file once as a conftest and the
# test modules import it again as `conftest`; both must share one state (one
# stop-all, one directory removed at the end).
_STATE = os.environ.get("QUOTALEASE_PY_HARNESS_STATE") or tempfile.mkdtemp(prefix="quotalease-py-harness-")
os.environ["QUOTALEASE_PY_HARNESS_STATE"] = _STATE
_ENV = {**os.environ, "QUOTALEASE_HARNESS_STATE": _STATE}


def redisctl(*args: str) -> str:
    out = subprocess.run([str(REDISCTL), *args], env=_ENV, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(
            f"redisctl {' '.join(args)} failed: {out.stderr.strip()}\n"
            "(is redis-server installed? `make test` installs it)"
        )
    return out.stdout.strip()


class RedisServer:
    """A real redis-server on a free loopback port."""

    def __init__(self) -> None:
        self.port = int(redisctl("start"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def pause(self) -> None:
        redisctl("pause", str(self.port))

    def resume(self) -> None:
        redisctl("resume", str(self.port))

    def kill(self) -> None:
        redisctl("kill", str(self.port))

    def restart(self) -> None:
        redisctl("restart", str(self.port))

    def stop(self) -> None:
        redisctl("stop", str(self.port))

    def cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server shared by the tests that do not disturb it."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server for one test that pauses, kills or restarts it."""
    server = RedisServer()
    try:
        yield server
    finally:
        try:
            server.resume()  # a paused server cannot shut down
        except RuntimeError:
            pass  # killed: nothing to resume
        server.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    try:
        redisctl("stop-all")
    except RuntimeError:
        pass
    shutil.rmtree(_STATE, ignore_errors=True)


#: backend_timeout_ms for tests whose subject is not the timeout: a loaded CI
#: machine must not turn a slow lease into a "pending" or "fallback" decision.
PATIENT = 10_000

# A window no test outlives: no token refills while it runs.
DAY = 86_400_000


def day_limiter(server: RedisServer, prefix: str, *, limit: int, lease_size: int) -> Limiter:
    """A lease-mode limiter on `server` with a one-day window and a manual
    clock (nothing refills), as the conservation tests use it."""
    return Limiter(
        server.url,
        backend_timeout_ms=PATIENT,
        limit=limit,
        window_ms=DAY,
        lease_size=lease_size,
        key_prefix=prefix,
        clock="manual",
    )


def check_problem(content_type: str, body: bytes) -> None:
    """The 429 body every quotalease middleware sends, in every language (the
    same bytes in Go and Node): RFC 9457 problem details and the retry delay."""
    assert content_type == "application/problem+json", content_type
    payload = json.loads(body)
    assert isinstance(payload["retry_after_ms"], int) and payload["retry_after_ms"] > 0, payload
    assert body == (
        b'{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded",'
        b'"retry_after_ms":%d}' % payload["retry_after_ms"]
    ), body


_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A key prefix / memory name no other test (or process) uses."""
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def wait_for(what: str, cond: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll until cond() is true: a hang guard, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)
