"""What the ASGI and WSGI middleware share."""

from __future__ import annotations

import json

from ._native import Decision


def header_pairs(decision: Decision) -> list[tuple[str, str]]:
    return list(decision.headers().items())


def denied_body(decision: Decision) -> bytes:
    return json.dumps(
        {
            "error": "rate_limited",
            "detail": "Too many requests; retry after the Retry-After header's seconds.",
            "retry_after_ms": decision.retry_after_ms,
        },
        separators=(",", ":"),
    ).encode()
