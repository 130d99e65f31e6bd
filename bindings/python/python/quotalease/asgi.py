"""ASGI middleware for Starlette, FastAPI and any ASGI app.

    from fastapi import FastAPI
    from quotalease import Limiter
    from quotalease.asgi import RateLimitMiddleware

    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(rate="100/min"))

Every HTTP response carries the IETF ``RateLimit`` and ``RateLimit-Policy``
headers; a denied request gets ``429 Too Many Requests`` with ``Retry-After``
and the body every quotalease middleware sends (``application/problem+json``,
RFC 9457: ``{"type":"about:blank","title":"Too Many Requests","status":429,
"detail":"rate limit exceeded","retry_after_ms":N}``), and never reaches the app.

``key(request)`` picks the bucket. ``request`` is a
``starlette.requests.Request`` when Starlette is installed (FastAPI, Starlette),
otherwise the raw ASGI ``scope`` dict. The default key is the client's address.
Return None to let a request through without limiting it (health checks).
Behind a load balancer or reverse proxy, ``trusted_proxies`` (a hop count such
as ``1``, or CIDRs such as ``["10.0.0.0/8"]``) makes the default key the
client's address from ``X-Forwarded-For`` (else ``Forwarded``), read only
through trusted hops; a bad value raises ``quotalease.ConfigError`` (a
negative count, a bad CIDR) or ``TypeError`` here.
``cost`` is an int or a callable taking the same request; ``skip(request)``
true lets a request through unlimited; ``tier`` (a str or ``tier(request)``)
is handed to ``acquire`` for limiters with plan tiers; ``wait_ms`` has a request
wait (awaited, the loop free) up to that long for its tokens instead of a 429. WebSocket and
lifespan messages pass through untouched. A response that already carries
``RateLimit``, ``RateLimit-Policy`` or ``Retry-After`` (set by an inner, per-route
limit such as a ``quotalease.fastapi.limit`` dependency) keeps those, as
Django's middleware does. A key longer than 512 bytes is
limited under ``quotalease.http_key(key)`` ("sha256:" and its hex digest),
as in every quotalease middleware, instead of failing the request.

``concurrency=True`` limits the requests of a key in flight at once instead
of its rate: each limited request takes a permit (``await
limiter.acquire_concurrent_async(key)``; the limiter needs ``concurrency=N``,
else every request raises its ``quotalease.ConfigError``) and gives it back
when the app returns or raises, so a streaming response holds its permit
until its body is sent. A request past the N gets the same 429 body with
``Retry-After`` and no ``RateLimit`` headers (they describe rates), and never
reaches the app. ``tier`` picks the tier whose ``"N concurrent"`` applies;
``cost`` and ``wait_ms`` do not: giving one with ``concurrency=True`` raises
``quotalease.ConfigError`` here. For a rate
and a concurrency limit both, wrap one middleware in another::

    app.add_middleware(RateLimitMiddleware, limiter=limiter, concurrency=True)
    app.add_middleware(RateLimitMiddleware, limiter=limiter)  # outermost: the rate
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import Decision, Limiter
from ._middleware import PROBLEM_CONTENT_TYPE, Rule, check_concurrency, denied_body, header_pairs, retry_after_pairs
from ._proxies import TrustedProxies, TrustedProxiesSpec, asgi_forwarding, default_key_check

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

try:  # Starlette is optional: without it the key function gets the scope.
    from starlette.requests import Request as _Request
except ImportError:  # pragma: no cover - exercised only without starlette
    _Request = None  # type: ignore[assignment, misc]


def client_address(request: Any) -> str | None:
    """The default key: the peer's address (behind a proxy, see ``trusted_proxies``)."""
    scope = request.scope if hasattr(request, "scope") else request
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def client_key(proxies: TrustedProxies) -> Callable[[Any], str | None]:
    """The default key behind ``proxies``: the client's address through trusted hops."""

    def key(request: Any) -> str | None:
        scope = request.scope if hasattr(request, "scope") else request
        client = scope.get("client")
        if not client:
            return "unknown"
        return proxies.client(str(client[0]), *asgi_forwarding(scope))

    return key


def default_key(
    key: Callable[[Any], str | None], trusted_proxies: TrustedProxiesSpec, who: str
) -> Callable[[Any], str | None]:
    """``key``, or the client's address through ``trusted_proxies`` when they are set."""
    proxies = TrustedProxies(trusted_proxies, who)
    default_key_check(proxies, key, client_address, who)
    return client_key(proxies) if proxies.enabled else key


class RateLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        key: Callable[[Any], str | None] = client_address,
        cost: int | Callable[[Any], int] = 1,
        *,
        skip: Callable[[Any], bool] | None = None,
        tier: str | Callable[[Any], str | None] | None = None,
        trusted_proxies: TrustedProxiesSpec = None,
        wait_ms: int | None = None,
        concurrency: bool = False,
    ) -> None:
        self.app = app
        key = default_key(key, trusted_proxies, "RateLimitMiddleware")
        self.rule: Rule[Any] = Rule(
            limiter, key, cost, skip=skip, tier=tier, wait_ms=wait_ms, who="RateLimitMiddleware"
        )
        self.concurrency = check_concurrency(concurrency, "RateLimitMiddleware", cost=cost, wait_ms=wait_ms)
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request(scope, receive) if _Request is not None else scope
        if self.concurrency:
            await self._call_concurrent(request, scope, receive, send)
            return
        decision = await self.rule.acquire_async(request)
        if decision is None:
            await self.app(scope, receive, send)
            return
        extra = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in header_pairs(decision)]
        if not decision.allowed:
            await _send_denied(send, decision, extra)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                headers = list(message.get("headers", ()))
                # An inner limit's fields (a FastAPI limit() dependency) win:
                # two RateLimit fields would read as one list of both.
                present = {bytes(name).lower() for name, _ in headers}
                message["headers"] = [*headers, *((n, v) for n, v in extra if n not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _call_concurrent(self, request: Any, scope: Scope, receive: Receive, send: Send) -> None:
        """The app under a permit of the request's key (``concurrency=True``)."""
        permit = await self.rule.acquire_permit_async(request)
        if permit is None:
            await self.app(scope, receive, send)
            return
        if not permit.allowed:
            decision = permit.decision
            retry_after = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in retry_after_pairs(decision)]
            await _send_denied(send, decision, retry_after)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            permit.release()


async def _send_denied(send: Send, decision: Decision, headers: list[tuple[bytes, bytes]]) -> None:
    """The 429 of every quotalease middleware, with ``headers`` (RateLimit, Retry-After)."""
    body = denied_body(decision)
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", PROBLEM_CONTENT_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
