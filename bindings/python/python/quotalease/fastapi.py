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
"""

# No `from __future__ import annotations` here: FastAPI reads the dependency's
# parameter types at runtime, and a callable object's string annotations are
# not resolvable by every FastAPI version.
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request, Response

from . import Limiter
from ._middleware import DENIED_DETAIL, PROBLEM_CONTENT_TYPE, Rule, denied_body, header_pairs
from ._native import Decision
from ._proxies import TrustedProxiesSpec
from .asgi import client_address, default_key

__all__ = ["RateLimited", "RouteLimit", "endpoint_group", "limit", "problem_response"]


class RateLimited(HTTPException):
    """Raised by a :func:`limit` dependency when the request is denied: 429
    with ``Retry-After`` and the RateLimit headers; ``decision`` says why."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(status_code=429, detail=DENIED_DETAIL, headers=dict(header_pairs(decision)))
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
    url: str = "memory://",
    **limiter_options: Any,
) -> RouteLimit:
    """A dependency limiting the route it is attached to (see the module's doc).

    A bad rate or option raises :class:`quotalease.ConfigError` here, when the
    route is defined, not on its first request."""
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
    return RouteLimit(limiter, rule)
