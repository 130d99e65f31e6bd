"""What the ASGI and WSGI middleware share."""

from __future__ import annotations

import hashlib
import json

from ._native import Decision

#: Longest key the engine accepts, in UTF-8 bytes.
MAX_KEY_BYTES = 512


def fit_key(key: str) -> str:
    """Keys come from requests (addresses, API keys, headers): a client must
    not turn a long header into an error, so over-long keys are hashed."""
    if len(key) * 4 <= MAX_KEY_BYTES or len(key.encode()) <= MAX_KEY_BYTES:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


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
