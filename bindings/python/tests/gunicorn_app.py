"""A WSGI app for test_gunicorn.py: the limiter is created at import, in the
gunicorn master (--preload), and used there before the workers fork."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from quotalease import Limiter
from quotalease.wsgi import RateLimitMiddleware

limiter = Limiter(
    os.environ["QL_URL"],
    limit=int(os.environ["QL_LIMIT"]),
    window_ms=86_400_000,
    lease_size=int(os.environ["QL_LEASE"]),
    key_prefix=os.environ["QL_PREFIX"],
    backend_timeout_ms=10_000,  # a loaded CI machine: no "pending" from a slow lease
)
# The master holds a lease and a running broker when it forks the workers.
MASTER_DECISION = limiter.acquire("shared")
assert MASTER_DECISION.allowed


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Worker", str(os.getpid()))])
    return [b"ok"]


app = RateLimitMiddleware(hello, limiter=limiter, key=lambda request: "shared")
