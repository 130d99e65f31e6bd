"""Per-route limits for FastAPI, as a dependency.

    from fastapi import Depends, FastAPI
    from quotalease.fastapi import limit

    app = FastAPI()

    @app.get("/search", dependencies=[Depends(limit("10/min"))])
    async def search(q: str) -> dict[str, str]: ...

``limit(rate, ...)`` returns a dependency that takes one ``acquire`` per call
of the route. Admitted: the response carries ``RateLimit-Policy`` and
``RateLimit`` and the dependency's value is the :class:`quotalease.Decision`
(``d: Decision = Depends(limit(...))``). Denied: it raises
:class:`RateLimited`, an ``HTTPException`` with status 429 and the
``Retry-After`` and RateLimit headers; FastAPI answers it in its own
convention for an ``HTTPException``, ``{"detail": ...}``, and
``app.add_exception_handler(RateLimited, ...)`` replaces that answer
(``exc.decision`` is there; ``problem_response`` answers with the body of
every quotalease middleware, ``application/problem+json``). The app-wide limit is
:class:`quotalease.asgi.RateLimitMiddleware`; both can be used together.

``rate`` is a rate such as ``"10/min"`` (a new limiter on ``url``, default
``memory://``, with ``limiter_options``) or a :class:`quotalease.Limiter` to
share. Each route gets its own buckets: the key is ``"group:key"``, where the
group defaults to the endpoint's dotted name (``group=`` shares one budget
between routes). ``key(request)`` (default: the client's address) may return
None to leave a request unlimited; ``cost`` is an int or ``cost(request)``;
``tier`` is handed to ``acquire`` for limiters with plan tiers; ``wait_ms``
awaits the tokens up to that long instead of a 429;
``trusted_proxies`` (a hop count or CIDRs) makes the default key the client's
address behind a load balancer, as in the middleware.

``limit(limiter, concurrency=True)`` limits the route's requests of a key in
flight at once instead of its rate: a dependency with ``yield``
(:class:`RoutePermit`) takes a permit (``await
limiter.acquire_concurrent_async(key, tier=)``; the limiter needs
``concurrency=N``, else every request raises its ``quotalease.ConfigError``)
and gives it back when FastAPI exits it, after the response is sent, so a
``StreamingResponse`` holds it until its body is sent, and a route that raises
gives it back too. That needs FastAPI 0.118 or later (before, the exit code
of a dependency with ``yield`` ran before the response was sent): on an older
FastAPI, ``concurrency=True`` raises ``quotalease.ConfigError``; use
``quotalease.asgi.RateLimitMiddleware(..., concurrency=True)`` there, which
holds the permit until the app returns on any version. Past the N it raises
:class:`RateLimited` with ``Retry-After`` and no RateLimit headers (they
describe rates); admitted, the dependency's value is the permit's decision
and the response gets no headers. ``tier`` picks the tier whose ``"N
concurrent"`` applies; ``cost`` and ``wait_ms`` do not: giving one with
``concurrency=True`` raises ``quotalease.ConfigError`` when the route is
defined. For a rate and a concurrency limit both, give the route two
dependencies.
"""

# No `from __future__ import annotations` here: FastAPI reads the dependency's
# parameter types at runtime, and a callable object's string annotations are
# not resolvable by every FastAPI version.
import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, overload

from fastapi import HTTPException, Request, Response
from fastapi import __version__ as _fastapi_version

from . import ConfigError, Limiter
from ._middleware import (
    DENIED_DETAIL,
    PROBLEM_CONTENT_TYPE,
    Rule,
    check_concurrency,
    denied_body,
    header_pairs,
    retry_after_pairs,
)
from ._native import Decision
from ._proxies import TrustedProxiesSpec
from .asgi import client_address, default_key

__all__ = ["RateLimited", "RouteLimit", "RoutePermit", "endpoint_group", "limit", "problem_response"]


class RateLimited(HTTPException):
    """Raised by a :func:`limit` dependency when the request is denied: 429
    with ``Retry-After`` and the RateLimit headers (``headers``, when given,
    instead: only ``Retry-After`` past a concurrency limit); ``decision`` says why."""

    def __init__(self, decision: Decision, headers: Mapping[str, str] | None = None) -> None:
        fields = dict(headers) if headers is not None else dict(header_pairs(decision))
        super().__init__(status_code=429, detail=DENIED_DETAIL, headers=fields)
        self.decision = decision


def problem_response(request: Request, exc: Exception) -> Response:
    """An exception handler answering :class:`RateLimited` with the 429 body of
    every quotalease middleware (``application/problem+json``, RFC 9457, with
    ``retry_after_ms``) instead of FastAPI's ``{"detail": ...}``:
    ``app.add_exception_handler(RateLimited, problem_response)``."""
    if not isinstance(exc, RateLimited):
        raise exc
    return Response(denied_body(exc.decision), status_code=429, media_type=PROBLEM_CONTENT_TYPE, headers=exc.headers)


def endpoint_group(request: Request) -> str:
    """The default group: the route's endpoint as ``module.qualname`` (else the path)."""
    endpoint = request.scope.get("endpoint")
    if endpoint is None:
        return request.url.path
    return f"{getattr(endpoint, '__module__', '')}.{getattr(endpoint, '__qualname__', repr(endpoint))}"


class RouteLimit:
    """The dependency :func:`limit` returns; ``limiter`` is the limiter it spends."""

    __slots__ = ("limiter", "rule")

    def __init__(self, limiter: Limiter, rule: Rule[Request]) -> None:
        self.limiter = limiter
        self.rule = rule

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        decision = await self.rule.acquire_async(request)
        if decision is None:
            return None
        if not decision.allowed:
            raise RateLimited(decision)
        for name, value in header_pairs(decision):
            response.headers[name] = value
        return decision


class RoutePermit:
    """The dependency ``limit(..., concurrency=True)`` returns, one with
    ``yield``: the request's permit, held until FastAPI exits it once the
    response is sent; ``limiter`` is the limiter it takes permits of."""

    __slots__ = ("limiter", "rule")

    def __init__(self, limiter: Limiter, rule: Rule[Request]) -> None:
        self.limiter = limiter
        self.rule = rule

    async def __call__(self, request: Request) -> AsyncIterator[Decision | None]:
        permit = await self.rule.acquire_permit_async(request)
        if permit is None:
            yield None
            return
        if not permit.allowed:
            raise RateLimited(permit.decision, headers=dict(retry_after_pairs(permit.decision)))
        try:
            yield permit.decision
        finally:
            permit.release()


#: The first FastAPI whose dependencies with ``yield`` exit after the response
#: is sent (0.106 to 0.117 exited them before, a streaming body still unsent).
EXIT_AFTER_RESPONSE = (0, 118)


def _version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version such as ``"0.118.2"``."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else (0, 0)


@overload
def limit(
    rate: str | Limiter,
    *,
    key: Callable[[Request], str | None] = ...,
    cost: int | Callable[[Request], int] = ...,
    skip: Callable[[Request], bool] | None = ...,
    group: str | Callable[[Request], str] | None = ...,
    tier: str | Callable[[Request], str | None] | None = ...,
    trusted_proxies: TrustedProxiesSpec = ...,
    wait_ms: int | None = ...,
    concurrency: Literal[False] = ...,
    url: str = ...,
    **limiter_options: Any,
) -> RouteLimit: ...


@overload
def limit(
    rate: str | Limiter,
    *,
    key: Callable[[Request], str | None] = ...,
    cost: int | Callable[[Request], int] = ...,
    skip: Callable[[Request], bool] | None = ...,
    group: str | Callable[[Request], str] | None = ...,
    tier: str | Callable[[Request], str | None] | None = ...,
    trusted_proxies: TrustedProxiesSpec = ...,
    wait_ms: int | None = ...,
    concurrency: Literal[True],
    url: str = ...,
    **limiter_options: Any,
) -> RoutePermit: ...


@overload
def limit(
    rate: str | Limiter,
    *,
    key: Callable[[Request], str | None] = ...,
    cost: int | Callable[[Request], int] = ...,
    skip: Callable[[Request], bool] | None = ...,
    group: str | Callable[[Request], str] | None = ...,
    tier: str | Callable[[Request], str | None] | None = ...,
    trusted_proxies: TrustedProxiesSpec = ...,
    wait_ms: int | None = ...,
    concurrency: bool,
    url: str = ...,
    **limiter_options: Any,
) -> RouteLimit | RoutePermit: ...


def limit(
    rate: str | Limiter,
    *,
    key: Callable[[Request], str | None] = client_address,
    cost: int | Callable[[Request], int] = 1,
    skip: Callable[[Request], bool] | None = None,
    group: str | Callable[[Request], str] | None = None,
    tier: str | Callable[[Request], str | None] | None = None,
    trusted_proxies: TrustedProxiesSpec = None,
    wait_ms: int | None = None,
    concurrency: bool = False,
    url: str = "memory://",
    **limiter_options: Any,
) -> RouteLimit | RoutePermit:
    """A dependency limiting the route it is attached to (see the module's doc).

    A bad rate or option raises :class:`quotalease.ConfigError` here, when the
    route is defined, not on its first request."""
    if isinstance(concurrency, int) and not isinstance(concurrency, bool):
        raise TypeError(
            f"limit(): concurrency must be a bool, not int; the {concurrency} requests in flight are the "
            f"limiter's: limit(Limiter(..., concurrency={concurrency}), concurrency=True)"
        )
    check_concurrency(concurrency, "limit()", cost=cost, wait_ms=wait_ms, hint="give the route two dependencies")
    if concurrency and _version(_fastapi_version) < EXIT_AFTER_RESPONSE:
        raise ConfigError(
            f"limit(): concurrency=True needs FastAPI 0.118 or later, whose dependencies with yield exit after "
            f"the response is sent (FastAPI {_fastapi_version} exits them before a streaming body is sent); "
            "use quotalease.asgi.RateLimitMiddleware(..., concurrency=True) instead"
        )
    key = default_key(key, trusted_proxies, "limit()")
    if isinstance(rate, Limiter):
        if limiter_options or url != "memory://":
            raise TypeError("limit(): url and limiter options go with a rate string, not with a Limiter")
        limiter = rate
    elif isinstance(rate, str):
        limiter = Limiter(url, rate=rate, **limiter_options)
    else:
        kind = type(rate).__name__
        raise TypeError(f'limit(): rate must be a str such as "10/min" or a quotalease.Limiter, not {kind}')
    group_of = group if group is not None else endpoint_group
    rule = Rule(limiter, key, cost, skip=skip, group=group_of, tier=tier, wait_ms=wait_ms, who="limit()")
    return RoutePermit(limiter, rule) if concurrency else RouteLimit(limiter, rule)
