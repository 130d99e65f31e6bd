"""The broker thread calls into Python (asyncio completions, logging, the
on_event callback). The interpreter must exit cleanly while such calls are
due: no hang, no crash, exit status 0."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import RedisServer

EVENTS_AT_EXIT = """
import logging, sys
from quotalease import Limiter
logging.basicConfig(level=logging.WARNING)
seen = []
lim = Limiter("redis://127.0.0.1:1", limit=100, lease_size=1, refill_threshold=0,
              backend_timeout_ms=50, on_event=lambda kind, msg: seen.append(kind))
for i in range(200):
    lim.acquire(f"k{i}")   # each cold key: a failing lease, transitions, events
print("exiting", flush=True)
"""

PENDING_AT_EXIT = """
import asyncio, sys
from quotalease import Limiter
lim = Limiter(sys.argv[1], limit=100, backend_timeout_ms=300)

async def main():
    tasks = [asyncio.create_task(lim.acquire_async(f"k{i}")) for i in range(20)]
    await asyncio.sleep(0.01)
    # return with the acquires still pending: asyncio.run cancels them and
    # closes the loop; the broker completes them later, into a closed loop.

asyncio.run(main())
print("exiting", flush=True)
"""


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=60,  # hang guard
    )


@pytest.mark.parametrize("attempt", range(5))
def test_exit_while_events_are_being_delivered(attempt: int) -> None:
    r = run(EVENTS_AT_EXIT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exiting"
    assert "Fatal Python error" not in r.stderr
    assert "quotalease degraded" in r.stderr  # the logging handler got the event


@pytest.mark.parametrize("attempt", range(3))
def test_exit_with_acquires_pending_on_a_paused_redis(own_redis: RedisServer, attempt: int) -> None:
    own_redis.pause()
    r = run(PENDING_AT_EXIT, own_redis.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exiting"
    assert "Fatal Python error" not in r.stderr
    assert "Traceback" not in r.stderr, r.stderr
