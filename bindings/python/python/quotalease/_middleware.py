"""What every quotalease integration shares: the rule that turns a request into
``acquire(key, cost, ...)`` (key function, cost, skip, group, extra acquire
options such as a plan tier), the response headers and the 429 body.

The ASGI and WSGI middleware, the Django middleware and decorator, the FastAPI
dependency and the gRPC interceptors all decide through :class:`Rule`, so a
request is limited the same way whichever framework carries it. Their
concurrency mode (a permit per request in flight instead of tokens) takes its
permit through :meth:`Rule.acquire_permit`, checks its options with
:func:`check_concurrency` and gives the permit back through a
:class:`PermitRelease`, once, whichever end of the request comes first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._native import ConfigError, Decision, InvalidCostError, Permit, http_key
from ._native import Limiter as _NativeLimiter

R = TypeVar("R")

#: The sentence every denial carries (HTTP body, gRPC status message).
DENIED_DETAIL = "Too many requests; retry after the Retry-After header's seconds."


def header_pairs(decision: Decision) -> list[tuple[str, str]]:
    """``RateLimit-Policy``, ``RateLimit`` and, when denied, ``Retry-After``."""
    return list(decision.headers().items())


def metadata_pairs(decision: Decision) -> list[tuple[str, str]]:
    """The same fields as gRPC metadata (keys lower-case, as gRPC requires)."""
    return [(name.lower(), value) for name, value in decision.headers().items()]


def retry_after_pairs(decision: Decision) -> list[tuple[str, str]]:
    """Only ``Retry-After``: the header of a request past a concurrency limit
    (the RateLimit fields describe rates, not requests in flight)."""
    return [(name, value) for name, value in decision.headers().items() if name.lower() == "retry-after"]


#: The content type of the 429 body (RFC 9457 problem details).
PROBLEM_CONTENT_TYPE = "application/problem+json"


def denied_payload(decision: Decision) -> dict[str, object]:
    """The 429 body every HTTP middleware sends, in every language: RFC 9457
    problem details with the retry delay in milliseconds."""
    return {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": "rate limit exceeded",
        "retry_after_ms": decision.retry_after_ms,
    }


def denied_body(decision: Decision) -> bytes:
    """:func:`denied_payload` as compact JSON (the same bytes as Go's and Node's)."""
    return json.dumps(denied_payload(decision), separators=(",", ":")).encode()


def check_limiter(limiter: object, who: str) -> None:
    if not isinstance(limiter, _NativeLimiter):
        raise TypeError(f"{who}: limiter must be a quotalease.Limiter, not {type(limiter).__name__}")


def check_concurrency(
    concurrency: object,
    who: str,
    *,
    cost: object = 1,
    wait_ms: object = None,
    option: str = "concurrency",
    names: tuple[str, str] = ("cost", "wait_ms"),
    hint: str = "wrap one middleware in another for a rate limit too",
) -> bool:
    """``concurrency`` checked: a bool (else TypeError), and when true neither
    a ``cost`` other than 1 nor a ``wait_ms`` beside it (a request takes one
    permit, and a permit is not waited for): ConfigError naming them (as
    ``names`` spells them)."""
    if not isinstance(concurrency, bool):
        raise TypeError(f"{who}: {option} must be a bool, not {type(concurrency).__name__}")
    if concurrency:
        given = [name for name, set_ in zip(names, (cost != 1, wait_ms is not None), strict=True) if set_]
        if given:
            names_given = " and ".join(given)
            raise ConfigError(
                f"{who}: {names_given} cannot be combined with {option}=True (a request takes one permit); {hint}"
            )
    return concurrency


class PermitRelease:
    """Gives ``permit`` back the first time it is called, from any thread, and
    does nothing after (a response body closed twice, a Django response's
    closers); ``permit.release`` itself may be called only once."""

    __slots__ = ("_permit", "_lock")

    def __init__(self, permit: Permit) -> None:
        self._permit: Permit | None = permit
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            permit, self._permit = self._permit, None
        if permit is not None:
            permit.release()


def _check_cost(cost: object, who: str) -> None:
    if callable(cost):
        return
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"{who}: cost must be an int or a function of the request, not {type(cost).__name__}")
    if cost < 1:
        raise InvalidCostError(f"{who}: cost must be at least 1, got {cost}")


class Rule(Generic[R]):
    """How one integration limits a request of type ``R``.

    ``key(request)`` names the bucket (None: not limited); ``cost`` is an int or
    ``cost(request)``; ``skip(request)`` true lets a request through unlimited;
    ``group`` (a string or ``group(request)``) prefixes the key as
    ``"group:key"``, so per-view limits do not share buckets; ``tier`` (a string
    or ``tier(request)``, None for the default) is handed to ``acquire`` as
    ``tier=`` for limiters configured with plan tiers and is left out
    otherwise. ``wait_ms`` (an int, None: no wait) has a request wait up to
    that long for its tokens instead of being denied (``acquire(...,
    wait_ms=)``; an async integration awaits it without blocking the loop).
    The limiter key is ``http_key(...)`` of the result: a key over 512 bytes is
    limited under its SHA-256 instead of failing the request.
    """

    __slots__ = ("limiter", "key", "cost", "skip", "group", "tier", "wait_ms")

    def __init__(
        self,
        limiter: _NativeLimiter,
        key: Callable[[R], str | None],
        cost: int | Callable[[R], int] = 1,
        *,
        skip: Callable[[R], bool] | None = None,
        group: str | Callable[[R], str] | None = None,
        tier: str | Callable[[R], str | None] | None = None,
        wait_ms: int | None = None,
        who: str = "quotalease",
    ) -> None:
        check_limiter(limiter, who)
        if not callable(key):
            raise TypeError(f"{who}: key must be a function of the request, not {type(key).__name__}")
        _check_cost(cost, who)
        if skip is not None and not callable(skip):
            raise TypeError(f"{who}: skip must be a function of the request")
        for name, value in (("group", group), ("tier", tier)):
            if value is not None and not (isinstance(value, str) or callable(value)):
                raise TypeError(f"{who}: {name} must be a str or a function of the request")
        self.limiter = limiter
        self.key = key
        self.cost = cost
        self.skip = skip
        if wait_ms is not None and (isinstance(wait_ms, bool) or not isinstance(wait_ms, int)):
            raise TypeError(f"{who}: wait_ms must be an int of milliseconds or None, not {type(wait_ms).__name__}")
        if wait_ms is not None and wait_ms < 0:
            raise ConfigError(f"{who}: wait_ms must not be negative, got {wait_ms}")
        self.group = group
        self.tier = tier
        self.wait_ms = wait_ms

    def resolve(self, request: R) -> tuple[str, int, dict[str, Any]] | None:
        """``(limiter key, cost, extra acquire options)``, or None: not limited."""
        if self.skip is not None and self.skip(request):
            return None
        raw = self.key(request)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise TypeError(f"the key function must return a str or None, not {type(raw).__name__}")
        if self.group is not None:
            group = self.group if isinstance(self.group, str) else self.group(request)
            raw = f"{group}:{raw}"
        cost = self.cost(request) if callable(self.cost) else self.cost
        options: dict[str, Any] = {}
        if self.tier is not None:
            tier = self.tier if isinstance(self.tier, str) else self.tier(request)
            if tier is not None:
                options["tier"] = tier
        if self.wait_ms is not None:
            options["wait_ms"] = self.wait_ms
        return http_key(raw), cost, options

    def acquire(self, request: R) -> Decision | None:
        """The decision for ``request`` (may wait, as ``Limiter.acquire``), or None."""
        resolved = self.resolve(request)
        if resolved is None:
            return None
        key, cost, options = resolved
        return self.limiter.acquire(key, cost, **options)

    async def acquire_async(self, request: R) -> Decision | None:
        """Like :meth:`acquire`, awaiting a pending lease instead of blocking."""
        resolved = self.resolve(request)
        if resolved is None:
            return None
        key, cost, options = resolved
        acquire_async = getattr(self.limiter, "acquire_async", None)
        if acquire_async is None:  # a bare native limiter: use its future
            r = self.limiter._acquire_or_future(key, cost, **options)
            return r if isinstance(r, Decision) else await r
        result: Decision = await acquire_async(key, cost, **options)
        return result

    def acquire_permit(self, request: R) -> Permit | None:
        """A concurrency permit of ``request``'s key (``acquire_concurrent(key,
        tier=)``; the cost is not used), or None: not limited."""
        resolved = self.resolve(request)
        if resolved is None:
            return None
        key, _, options = resolved
        return self.limiter.acquire_concurrent(key, tier=options.get("tier"))

    async def acquire_permit_async(self, request: R) -> Permit | None:
        """Like :meth:`acquire_permit`, awaiting a pending lease instead of blocking."""
        resolved = self.resolve(request)
        if resolved is None:
            return None
        key, _, options = resolved
        tier = options.get("tier")
        acquire = getattr(self.limiter, "acquire_concurrent_async", None)
        if acquire is None:  # a bare native limiter: use its future
            p = self.limiter._acquire_concurrent_or_future(key, tier=tier)
            return p if isinstance(p, Permit) else await p
        permit: Permit = await acquire(key, tier=tier)
        return permit
