"""WSGI middleware for Flask, Django and any WSGI app.

    from flask import Flask
    from quotalease import Limiter
    from quotalease.wsgi import RateLimitMiddleware

    app = Flask(__name__)
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=Limiter(rate="100/min"))

Every response carries the IETF ``RateLimit`` and ``RateLimit-Policy``
headers; a denied request gets ``429 Too Many Requests`` with ``Retry-After``
and the body every quotalease middleware sends (``application/problem+json``,
RFC 9457: ``{"type":"about:blank","title":"Too Many Requests","status":429,
"detail":"rate limit exceeded","retry_after_ms":N}``), and never reaches the app.

``key(request)`` picks the bucket. ``request`` is a ``werkzeug.wrappers.Request``
when Werkzeug is installed (Flask), otherwise the WSGI ``environ`` dict. The
default key is ``REMOTE_ADDR``. Return None to let a request through without
limiting it. Behind a load balancer or reverse proxy, ``trusted_proxies`` (a
hop count such as ``1``, or CIDRs such as ``["10.0.0.0/8"]``) makes the default
key the client's address from ``X-Forwarded-For`` (else ``Forwarded``), read
only through trusted hops; a bad value raises ``quotalease.ConfigError`` (a
negative count, a bad CIDR) or ``TypeError`` here. ``cost`` is an int or a callable taking the same request;
``skip(request)`` true lets a request through unlimited; ``tier`` (a str or
``tier(request)``) is handed to ``acquire`` for limiters with plan tiers; ``wait_ms`` has a request
wait (its worker thread) up to that long for its tokens instead of a 429. A response that already
carries ``RateLimit``, ``RateLimit-Policy`` or ``Retry-After`` (an inner,
per-view limit's) keeps those. A key
longer than 512 bytes is limited under ``quotalease.http_key(key)``
("sha256:" and its hex digest), as in every quotalease middleware, instead of
failing the request.

``concurrency=True`` limits the requests of a key in flight at once instead
of its rate: each limited request takes a permit
(``limiter.acquire_concurrent(key)``, in its worker thread; the limiter needs
``concurrency=N``, else every request raises its ``quotalease.ConfigError``)
and holds it until the server closes the response body (PEP 3333: every
server calls its ``close()`` when the response is sent, or cut short), so a
streaming response holds its permit until its last chunk; an app that raises
gives it back at once. A request past the N gets the same 429 body with
``Retry-After`` and no ``RateLimit`` headers (they describe rates), and never
reaches the app. ``tier`` picks the tier whose ``"N concurrent"`` applies;
``cost`` and ``wait_ms`` do not: giving one with ``concurrency=True`` raises
``quotalease.ConfigError`` here. For a rate and a concurrency limit both, wrap
one middleware in another::

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, concurrency=True)
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter)  # outermost: the rate
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._middleware import (
    PROBLEM_CONTENT_TYPE,
    PermitRelease,
    Rule,
    check_concurrency,
    denied_body,
    header_pairs,
    retry_after_pairs,
)
from ._native import Decision, Limiter
from ._proxies import TrustedProxies, TrustedProxiesSpec, default_key_check, environ_client

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

try:  # Werkzeug is optional: without it the key function gets the environ.
    from werkzeug.wrappers import Request as _Request
except ImportError:  # pragma: no cover - exercised only without werkzeug
    _Request = None  # type: ignore[assignment, misc]


def client_address(request: Any) -> str | None:
    """The default key: REMOTE_ADDR (behind a proxy, see ``trusted_proxies``)."""
    environ = request.environ if hasattr(request, "environ") else request
    return str(environ.get("REMOTE_ADDR") or "unknown")


def environ_key(proxies: TrustedProxies) -> Callable[[Any], str | None]:
    """The default key behind ``proxies``: the client's address through trusted hops."""

    def key(request: Any) -> str | None:
        return environ_client(proxies, request.environ if hasattr(request, "environ") else request)

    return key


class RateLimitMiddleware:
    def __init__(
        self,
        app: WSGIApp,
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
        proxies = TrustedProxies(trusted_proxies, "RateLimitMiddleware")
        default_key_check(proxies, key, client_address, "RateLimitMiddleware")
        if proxies.enabled:
            key = environ_key(proxies)
        self.rule: Rule[Any] = Rule(
            limiter, key, cost, skip=skip, tier=tier, wait_ms=wait_ms, who="RateLimitMiddleware"
        )
        self.concurrency = check_concurrency(concurrency, "RateLimitMiddleware", cost=cost, wait_ms=wait_ms)
        self.limiter = limiter

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = _Request(environ) if _Request is not None else environ
        if self.concurrency:
            return self._call_concurrent(request, environ, start_response)
        decision = self.rule.acquire(request)
        if decision is None:
            return self.app(environ, start_response)
        extra = header_pairs(decision)
        if not decision.allowed:
            return _denied(start_response, decision, extra)

        def start_with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            present = {name.lower() for name, _ in headers}  # an inner limit's fields win
            return start_response(status, [*headers, *((n, v) for n, v in extra if n.lower() not in present)], exc_info)

        return self.app(environ, start_with_headers)

    def _call_concurrent(self, request: Any, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """The app under a permit of the request's key (``concurrency=True``),
        held until the server closes the body."""
        permit = self.rule.acquire_permit(request)
        if permit is None:
            return self.app(environ, start_response)
        if not permit.allowed:
            return _denied(start_response, permit.decision, retry_after_pairs(permit.decision))
        release = PermitRelease(permit)
        try:
            body = self.app(environ, start_response)
        except BaseException:
            release()
            raise
        return _PermitBody(body, release)


class _PermitBody:
    """An app's response body that gives its request's permit back when the
    server closes it (after closing the app's body), once; iterating it
    iterates the app's body."""

    __slots__ = ("_body", "_chunks", "_release")

    def __init__(self, body: Iterable[bytes], release: Callable[[], None]) -> None:
        self._body = body
        self._chunks: Iterator[bytes] | None = None
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._chunks is None:
            self._chunks = iter(self._body)
        return next(self._chunks)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._release()


def _denied(start_response: StartResponse, decision: Decision, headers: list[tuple[str, str]]) -> list[bytes]:
    """The 429 of every quotalease middleware, with ``headers`` (RateLimit, Retry-After)."""
    body = denied_body(decision)
    start_response(
        "429 Too Many Requests",
        [("Content-Type", PROBLEM_CONTENT_TYPE), ("Content-Length", str(len(body))), *headers],
    )
    return [body]
