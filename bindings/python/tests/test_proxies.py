"""Behind a proxy: ``trusted_proxies`` makes the default key the client's
address from X-Forwarded-For / Forwarded, read only through trusted hops, in
the ASGI, WSGI and Django middleware and the FastAPI dependency."""

from __future__ import annotations

import asyncio
from typing import Any

import flask
import pytest
from fastapi import Depends, FastAPI
from starlette.testclient import TestClient

from quotalease import ConfigError, Limiter
from quotalease import asgi as ql_asgi
from quotalease import fastapi as ql_fastapi
from quotalease import wsgi as ql_wsgi
from quotalease._proxies import TrustedProxies

LB = "10.0.0.5"  # the load balancer, the peer of every request


@pytest.mark.parametrize(
    ("spec", "peer", "forwarded", "xff", "client"),
    [
        # None trusted (the default): the peer, whatever the headers say.
        (None, LB, None, "1.2.3.4", LB),
        (0, LB, "for=1.2.3.4", None, LB),
        # An untrusted peer's headers are ignored (spoofed).
        (["10.0.0.0/8"], "203.0.113.9", None, "1.2.3.4", "203.0.113.9"),
        (1, "not an address", None, "1.2.3.4", "not an address"),
        # A trusted chain: past the trusted hops, the first untrusted one.
        (["10.0.0.0/8"], LB, None, "1.2.3.4", "1.2.3.4"),
        (["10.0.0.0/8"], LB, None, "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4"),
        (["10.0.0.0/8", "192.0.2.7"], LB, None, "1.2.3.4,192.0.2.7", "1.2.3.4"),
        (["10.0.0.0/8"], LB, None, "10.9.9.9, 10.1.1.1", "10.9.9.9"),  # all trusted: the furthest
        ("10.0.0.0/8", "::ffff:10.0.0.5", None, "1.2.3.4", "1.2.3.4"),  # one str; IPv4-mapped peer
        # The hop count: skip exactly N hops from the right.
        (1, LB, None, "6.6.6.6, 1.2.3.4", "1.2.3.4"),
        (2, LB, None, "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4"),
        (3, LB, None, "1.2.3.4", "1.2.3.4"),  # fewer hops than trusted: the furthest
        # X-Forwarded-For with ports and IPv6.
        (1, LB, None, "1.2.3.4:5555", "1.2.3.4"),
        (1, LB, None, "[2001:db8::1]:443", "2001:db8::1"),
        (1, LB, None, "2001:DB8::0:1", "2001:db8::1"),
        (["::1"], "::1", None, "2001:db8::1", "2001:db8::1"),
        # Forwarded (RFC 7239): quoted values, IPv6 in brackets, other parameters.
        (1, LB, "for=1.2.3.4", None, "1.2.3.4"),
        (1, LB, 'for="[2001:db8:cafe::17]:4711";proto=https', None, "2001:db8:cafe::17"),
        (1, LB, 'for=6.6.6.6, For="1.2.3.4:80";by=10.0.0.5', None, "1.2.3.4"),
        (2, LB, 'for=1.2.3.4;host="a,b", for=10.1.1.1', None, "1.2.3.4"),
        # X-Forwarded-For wins over Forwarded when both are present.
        (1, LB, "for=6.6.6.6", "1.2.3.4", "1.2.3.4"),
        # Malformed: the peer, never an exception.
        (1, LB, None, "not-an-ip", LB),
        (1, LB, None, "1.2.3.4, ", LB),
        (1, LB, None, "1.2.3.4:port", LB),
        (1, LB, None, "[::1", LB),
        (1, LB, "for=unknown", None, LB),
        (1, LB, "for=_hidden", None, LB),
        (1, LB, 'for="1.2.3.4', None, LB),
        (1, LB, "proto=https", None, LB),
        (1, LB, "for=1.2.3.4;;", None, "1.2.3.4"),
        (1, LB, None, "\u0661.2.3.4", LB),
        # Garbage to the left of the client is never read.
        (1, LB, None, "garbage, 1.2.3.4", "1.2.3.4"),
        (1, LB, None, "", LB),
    ],
)
def test_the_client_address(spec: Any, peer: str, forwarded: str | None, xff: str | None, client: str) -> None:
    assert TrustedProxies(spec).client(peer, forwarded, xff) == client


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (-1, ConfigError, "hop count >= 0"),
        (["10.0.0.0/33"], ConfigError, "not an IP address or CIDR"),
        ("nonsense", ConfigError, "'nonsense'"),
        ([10], TypeError, "entries must be str"),
        (1.5, TypeError, "hop count"),
        (True, TypeError, "hop count"),
    ],
)
def test_bad_settings_are_typed_errors_at_construction(spec: Any, error: type[Exception], message: str) -> None:
    limiter = Limiter(rate="5/min")
    with pytest.raises(error, match=message):
        ql_asgi.RateLimitMiddleware(lambda *a: None, limiter, trusted_proxies=spec)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        ql_wsgi.RateLimitMiddleware(lambda *a: [], limiter, trusted_proxies=spec)
    with pytest.raises(error, match=message):
        ql_fastapi.limit(limiter, trusted_proxies=spec)


def test_trusted_proxies_with_a_key_of_your_own_is_a_type_error() -> None:
    limiter = Limiter(rate="5/min")
    with pytest.raises(TypeError, match="not both"):
        ql_wsgi.RateLimitMiddleware(lambda *a: [], limiter, key=lambda r: "k", trusted_proxies=1)
    with pytest.raises(TypeError, match="not both"):
        ql_fastapi.limit(limiter, key=lambda r: "k", trusted_proxies=1)


# --- ASGI: the middleware on a raw scope (the peer address is the test's) ---


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def asgi_status(mw: ql_asgi.RateLimitMiddleware, peer: str, headers: list[tuple[str, str]]) -> int:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "raw_path": b"/",
        "root_path": "",
        "query_string": b"",
        "scheme": "http",
        "http_version": "1.1",
        "server": ("testserver", 80),
        "headers": [(n.lower().encode(), v.encode()) for n, v in headers],
        "client": (peer, 40000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return int(sent[0]["status"])


def test_asgi_spoofed_headers_from_an_untrusted_peer_are_ignored() -> None:
    limiter = Limiter(limit=2, window_ms=60_000)
    mw = ql_asgi.RateLimitMiddleware(_ok, limiter, trusted_proxies=["10.0.0.0/8"])
    codes = [asgi_status(mw, "203.0.113.9", [("X-Forwarded-For", f"1.2.3.{i}")]) for i in range(3)]
    assert codes == [200, 200, 429]
    assert limiter.inspect("203.0.113.9")["admitted"] == 2


def test_asgi_trusted_chain_keys_each_client() -> None:
    limiter = Limiter(limit=1, window_ms=60_000)
    mw = ql_asgi.RateLimitMiddleware(_ok, limiter, trusted_proxies=["10.0.0.0/8"])
    # Two clients behind the same balancer have their own buckets.
    assert asgi_status(mw, LB, [("X-Forwarded-For", "6.6.6.6, 1.2.3.4")]) == 200
    assert asgi_status(mw, LB, [("X-Forwarded-For", "5.6.7.8")]) == 200
    # A client rotating a spoofed left part still hits its own bucket.
    assert asgi_status(mw, LB, [("X-Forwarded-For", "7.7.7.7, 1.2.3.4")]) == 429
    # Repeated header fields are one list; Forwarded is read when there is no XFF.
    assert asgi_status(mw, LB, [("Forwarded", 'for="[2001:db8::1]:1"'), ("Forwarded", "for=10.0.0.9")]) == 200
    assert limiter.inspect("2001:db8::1")["admitted"] == 1
    # Malformed: keyed by the peer, not an error.
    assert asgi_status(mw, LB, [("X-Forwarded-For", "oops")]) == 200
    assert limiter.inspect(LB)["admitted"] == 1


def test_asgi_hop_count() -> None:
    limiter = Limiter(limit=5, window_ms=60_000)
    mw = ql_asgi.RateLimitMiddleware(_ok, limiter, trusted_proxies=2)
    assert asgi_status(mw, LB, [("X-Forwarded-For", "6.6.6.6, 1.2.3.4, 10.1.1.1")]) == 200
    assert limiter.inspect("1.2.3.4")["admitted"] == 1


def test_asgi_default_is_the_peer() -> None:
    limiter = Limiter(limit=5, window_ms=60_000)
    mw = ql_asgi.RateLimitMiddleware(_ok, limiter)
    assert asgi_status(mw, LB, [("X-Forwarded-For", "1.2.3.4")]) == 200
    assert limiter.inspect(LB)["admitted"] == 1


def test_fastapi_limit_behind_a_proxy() -> None:
    limiter = Limiter(limit=1, window_ms=60_000)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(ql_fastapi.limit(limiter, trusted_proxies=1, group="g"))])
    async def home() -> dict[str, bool]:
        return {"ok": True}

    # TestClient's peer is "testclient", which is no address: the peer, always.
    with TestClient(app) as client:
        assert client.get("/", headers={"X-Forwarded-For": "1.2.3.4"}).status_code == 200
        assert client.get("/", headers={"X-Forwarded-For": "5.6.7.8"}).status_code == 429
    assert limiter.inspect("g:testclient")["admitted"] == 1
    mw_app = ql_asgi.RateLimitMiddleware(app, Limiter(rate="100/min"))
    assert asgi_status(mw_app, LB, [("X-Forwarded-For", "1.2.3.4")]) == 200  # the route's bucket of 1.2.3.4
    assert asgi_status(mw_app, LB, [("X-Forwarded-For", "1.2.3.4")]) == 429
    assert asgi_status(mw_app, LB, [("X-Forwarded-For", "5.6.7.8")]) == 200


# --- WSGI / Flask -------------------------------------------------------------


def flask_client(limiter: Limiter, trusted: Any) -> Any:
    app = flask.Flask("quotalease_proxies")
    app.add_url_rule("/", "i", lambda: "x")
    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, trusted_proxies=trusted
    )
    return app.test_client()


def test_flask_untrusted_peer_trusted_chain_hops_and_malformed() -> None:
    limiter = Limiter(limit=1, window_ms=60_000)
    client = flask_client(limiter, ["10.0.0.0/8", "::1"])
    spoofed = {"REMOTE_ADDR": "203.0.113.9"}
    assert client.get("/", environ_base=spoofed, headers={"X-Forwarded-For": "1.1.1.1"}).status_code == 200
    assert client.get("/", environ_base=spoofed, headers={"X-Forwarded-For": "2.2.2.2"}).status_code == 429
    via_lb = {"REMOTE_ADDR": LB}
    assert client.get("/", environ_base=via_lb, headers={"X-Forwarded-For": "1.2.3.4"}).status_code == 200
    assert client.get("/", environ_base=via_lb, headers={"Forwarded": "for=5.6.7.8"}).status_code == 200
    assert client.get("/", environ_base=via_lb, headers={"X-Forwarded-For": "x, 1.2.3.4"}).status_code == 429
    assert client.get("/", environ_base=via_lb, headers={"Forwarded": 'for="[::1'}).status_code == 200
    assert limiter.inspect(LB)["admitted"] == 1  # the malformed one, keyed by the peer
    assert limiter.inspect("5.6.7.8")["admitted"] == 1

    hops = Limiter(limit=5, window_ms=60_000)
    client = flask_client(hops, 1)
    assert client.get("/", environ_base=via_lb, headers={"X-Forwarded-For": "6.6.6.6, 1.2.3.4"}).status_code == 200
    assert hops.inspect("1.2.3.4")["admitted"] == 1
