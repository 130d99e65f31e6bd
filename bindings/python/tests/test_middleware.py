"""The ASGI middleware on a real Starlette app and the WSGI middleware on a
real Flask app: RateLimit headers on every response, 429 with Retry-After and
a small JSON body when denied, the key function gets the request; both
middleware's concurrency mode (a permit per request in flight), driven
through gates, not sleeps."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import flask
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from werkzeug.test import EnvironBuilder

from conftest import DAY, PATIENT, RedisServer, check_problem, unique
from quotalease import ConfigError, Limiter, http_key
from quotalease import asgi as ql_asgi
from quotalease import wsgi as ql_wsgi


def check_denied(status: int, headers: Any, body: bytes) -> None:
    assert status == 429
    check_problem(headers["content-type"], body)
    assert int(headers["retry-after"]) >= 1
    assert headers["ratelimit"].startswith('"default";r=0;t=')


#: A derived key over the engine's 512 bytes: limited under its sha256 key.
LONG_KEY = "k" * 600
HASHED = "sha256:" + hashlib.sha256(LONG_KEY.encode()).hexdigest()


# --- ASGI / Starlette -------------------------------------------------------


def starlette_app(limiter: Limiter, calls: list[str]) -> Starlette:
    async def home(request: Request) -> PlainTextResponse:
        calls.append("home")
        return PlainTextResponse("hello", headers={"X-App": "1"})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def upload(request: Request) -> PlainTextResponse:
        calls.append("upload")
        return PlainTextResponse("stored")

    app = Starlette(routes=[Route("/", home), Route("/health", health), Route("/upload", upload, methods=["POST"])])
    app.add_middleware(
        ql_asgi.RateLimitMiddleware,
        limiter=limiter,
        key=lambda request: None if request.url.path == "/health" else request.headers.get("x-user", "anon"),
        cost=lambda request: 2 if request.method == "POST" else 1,
    )
    return app


def test_starlette_headers_and_429() -> None:
    calls: list[str] = []
    limiter = Limiter(limit=3, window_ms=60_000)
    with TestClient(starlette_app(limiter, calls)) as client:  # runs lifespan too
        ok = [client.get("/", headers={"x-user": "ann"}) for _ in range(3)]
        for i, r in enumerate(ok):
            assert r.status_code == 200 and r.text == "hello"
            assert r.headers["x-app"] == "1"
            assert r.headers["ratelimit-policy"] == '"default";q=3;w=60'
            assert r.headers["ratelimit"].startswith(f'"default";r={2 - i};')
            assert "retry-after" not in r.headers
        denied = client.get("/", headers={"x-user": "ann"})
        check_denied(denied.status_code, denied.headers, denied.content)
        assert calls == ["home"] * 3  # a denied request never reaches the app
        # Another key has its own bucket.
        assert client.get("/", headers={"x-user": "bob"}).status_code == 200
        # key() returning None: not limited, no headers.
        for _ in range(5):
            h = client.get("/health")
            assert h.status_code == 200 and "ratelimit" not in h.headers
        # cost() from the request: a POST costs 2 of bob's 2 remaining tokens.
        assert client.post("/upload", headers={"x-user": "bob"}).status_code == 200
        assert client.post("/upload", headers={"x-user": "bob"}).status_code == 429
        # A 404 from the app still carries the headers.
        nf = client.get("/missing", headers={"x-user": "cat"})
        assert nf.status_code == 404 and "ratelimit" in nf.headers


def test_starlette_default_key_is_the_client_address_and_long_keys_are_hashed() -> None:
    limiter = Limiter(limit=2, window_ms=60_000)
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("x"))])
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter)
    with TestClient(app) as client:
        assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert limiter.inspect("testclient")["admitted"] == 2

    long_keys = Starlette(routes=[Route("/", lambda request: PlainTextResponse("x"))])
    long_keys.add_middleware(
        ql_asgi.RateLimitMiddleware, limiter=Limiter(limit=5), key=lambda request: request.headers["x-key"]
    )
    with TestClient(long_keys) as client:
        assert client.get("/", headers={"x-key": "k" * 5000}).status_code == 200


def test_starlette_limits_a_600_byte_key_under_its_sha256_key() -> None:
    limiter = Limiter(limit=2, window_ms=60_000)
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("x"))])
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter, key=lambda request: "k" * 600)
    with TestClient(app) as client:
        assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert http_key(LONG_KEY) == HASHED
    assert limiter.inspect(HASHED)["admitted"] == 2


def test_starlette_with_redis(redis_server: RedisServer) -> None:
    limiter = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=5, window_ms=DAY, lease_size=2, key_prefix=unique("asgi")
    )
    calls: list[str] = []
    with TestClient(starlette_app(limiter, calls)) as client:
        codes = [client.get("/", headers={"x-user": "ann"}).status_code for _ in range(7)]
    assert codes.count(200) <= 5 and codes[0] == 200 and codes[-1] == 429
    limiter.close()


def test_asgi_middleware_rejects_a_non_limiter() -> None:
    with pytest.raises(TypeError):
        ql_asgi.RateLimitMiddleware(Starlette(), limiter=object())  # type: ignore[arg-type]


# --- WSGI / Flask -----------------------------------------------------------


def flask_app(limiter: Limiter, calls: list[str]) -> flask.Flask:
    app = flask.Flask("quotalease_test")

    @app.get("/")
    def home() -> Any:
        calls.append("home")
        return "hello", 200, {"X-App": "1"}

    @app.get("/health")
    def health() -> Any:
        return {"ok": True}

    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        limiter=limiter,
        key=lambda request: None if request.path == "/health" else request.headers.get("X-User", "anon"),
    )
    return app


def test_flask_headers_and_429() -> None:
    calls: list[str] = []
    limiter = Limiter(limit=3, window_ms=60_000)
    client = flask_app(limiter, calls).test_client()
    for i in range(3):
        r = client.get("/", headers={"X-User": "ann"})
        assert r.status_code == 200 and r.data == b"hello"
        assert r.headers["X-App"] == "1"
        assert r.headers["RateLimit-Policy"] == '"default";q=3;w=60'
        assert r.headers["RateLimit"].startswith(f'"default";r={2 - i};')
        assert "Retry-After" not in r.headers
    denied = client.get("/", headers={"X-User": "ann"})
    check_denied(denied.status_code, {k.lower(): v for k, v in denied.headers.items()}, denied.data)
    assert calls == ["home"] * 3
    assert client.get("/", headers={"X-User": "bob"}).status_code == 200
    for _ in range(5):
        h = client.get("/health")
        assert h.status_code == 200 and "RateLimit" not in h.headers
    nf = client.get("/missing", headers={"X-User": "cat"})
    assert nf.status_code == 404 and "RateLimit" in nf.headers


def test_flask_a_views_own_ratelimit_fields_win() -> None:
    # A view limited by a limit of its own sets the fields; the middleware
    # adds none of its own beside them (one RateLimit field, the view's).
    limiter = Limiter(limit=5, window_ms=60_000)
    app = flask.Flask("own_fields")

    @app.get("/")
    def home() -> Any:
        return "hello", 200, {"RateLimit-Policy": '"view";q=1;w=60', "ratelimit": '"view";r=0;t=60'}

    app.wsgi_app = ql_wsgi.RateLimitMiddleware(app.wsgi_app, limiter=limiter)  # type: ignore[method-assign]
    r = app.test_client().get("/")
    assert r.status_code == 200
    assert r.headers.getlist("RateLimit-Policy") == ['"view";q=1;w=60']
    assert r.headers.getlist("RateLimit") == ['"view";r=0;t=60']
    assert limiter.inspect("127.0.0.1")["admitted"] == 1  # still limited by the middleware


def test_flask_default_key_and_cost() -> None:
    limiter = Limiter(limit=4, window_ms=60_000)
    app = flask.Flask("quotalease_cost")
    app.add_url_rule("/", "i", lambda: "x", methods=["GET", "POST"])
    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, cost=lambda request: 3 if request.method == "POST" else 1
    )
    client = app.test_client()
    assert client.post("/").status_code == 200
    assert client.post("/").status_code == 429
    assert client.get("/").status_code == 200
    assert limiter.inspect("127.0.0.1")["admitted"] == 2


def test_flask_limits_a_600_byte_key_under_its_sha256_key() -> None:
    limiter = Limiter(limit=2, window_ms=60_000)
    app = flask.Flask("quotalease_long_key")
    app.add_url_rule("/", "i", lambda: "x")
    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, key=lambda request: "k" * 600
    )
    client = app.test_client()
    assert [client.get("/").status_code for _ in range(3)] == [200, 200, 429]
    assert limiter.inspect(HASHED)["admitted"] == 2


def test_flask_with_redis(redis_server: RedisServer) -> None:
    limiter = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=5, window_ms=DAY, lease_size=2, key_prefix=unique("wsgi")
    )
    client = flask_app(limiter, []).test_client()
    codes = [client.get("/", headers={"X-User": "ann"}).status_code for _ in range(7)]
    assert codes.count(200) <= 5 and codes[0] == 200 and codes[-1] == 429
    limiter.close()


# --- plan tiers (issue 15) --------------------------------------------------

#: Two plans of two rules each: the RateLimit-Policy header lists both rules.
PLANS = "free=2/min, 3/hour; pro=4/min, 10/hour"


def plan_of(request: Any) -> str | None:
    return request.headers.get("x-plan")  # None: the default tier


def test_starlette_tier_from_the_request_picks_the_plan() -> None:
    limiter = Limiter(limit=100, window_ms=60_000, tiers=PLANS, default_tier="free")
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("hello"))])
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter, key=lambda r: r.headers["x-user"], tier=plan_of)
    with TestClient(app) as client:
        pro = [client.get("/", headers={"x-user": "ann", "x-plan": "pro"}) for _ in range(5)]
        assert [r.status_code for r in pro] == [200] * 4 + [429]
        assert pro[0].headers["ratelimit-policy"] == '"1min";q=4;w=60, "1hour";q=10;w=3600'
        assert pro[0].headers["ratelimit"].startswith('"1min";r=3;')
        assert pro[4].headers["ratelimit"].startswith('"1min";r=0;') and int(pro[4].headers["retry-after"]) >= 1
        free = [client.get("/", headers={"x-user": "bob"}).status_code for _ in range(3)]
        assert free == [200, 200, 429]
        # An unknown plan is the limiter's ConfigError, with the core's message.
        with pytest.raises(ConfigError, match='unknown tier "gold" \\(known tiers: free, pro\\)'):
            client.get("/", headers={"x-user": "cat", "x-plan": "gold"})
    assert limiter.inspect("ann")["tier"] == "pro" and limiter.inspect("bob")["tier"] == "free"


def test_flask_tier_as_a_string_or_a_function() -> None:
    limiter = Limiter(limit=100, window_ms=60_000, tiers=PLANS)
    app = flask.Flask("quotalease_tiers")
    app.add_url_rule("/", "i", lambda: "x")
    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, key=lambda r: r.headers["X-User"], tier="pro"
    )
    client = app.test_client()
    codes = [client.get("/", headers={"X-User": "ann"}).status_code for _ in range(5)]
    assert codes == [200] * 4 + [429]
    by_plan = flask.Flask("quotalease_tiers_fn")
    by_plan.add_url_rule("/", "i", lambda: "x")
    by_plan.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        by_plan.wsgi_app, limiter=limiter, key=lambda r: r.headers["X-User"], tier=plan_of
    )
    client = by_plan.test_client()
    free = [client.get("/", headers={"X-User": "bob", "X-Plan": "free"}) for _ in range(3)]
    assert [r.status_code for r in free] == [200, 200, 429]
    assert free[0].headers["RateLimit-Policy"] == '"1min";q=2;w=60, "1hour";q=3;w=3600'
    # No plan and no default tier: the limiter's own limit, one "default" rule.
    plain = client.get("/", headers={"X-User": "cat"})
    assert plain.status_code == 200 and plain.headers["RateLimit-Policy"] == '"default";q=100;w=60'
    with pytest.raises(TypeError, match="tier must be a str or a function"):
        ql_wsgi.RateLimitMiddleware(app.wsgi_app, limiter=limiter, tier=5)  # type: ignore[arg-type]


# --- issue 23: shadow mode, deny entries and waits through the middleware ----


def plain_app() -> Starlette:
    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    return Starlette(routes=[Route("/", home)])


def test_asgi_and_wsgi_wait_for_tokens_instead_of_a_429() -> None:
    limiter = Limiter(limit=2, window_ms=1000, lease_size=1)
    app = plain_app()
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter, key=lambda r: "k", wait_ms=30_000)
    with TestClient(app) as client:
        codes = [client.get("/").status_code for _ in range(3)]
    assert codes == [200, 200, 200], "the third waited half a second for the refill"
    flask_limiter = Limiter(limit=2, window_ms=1000, lease_size=1)
    fapp = flask.Flask(__name__)
    fapp.add_url_rule("/", "home", lambda: "hello")
    fapp.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        fapp.wsgi_app, flask_limiter, key=lambda environ: "k", wait_ms=30_000
    )
    fclient = fapp.test_client()
    assert [fclient.get("/").status_code for _ in range(3)] == [200, 200, 200]
    # a wait too short for the refill: the 429 comes at once, with its hint
    short = Limiter(limit=1, window_ms=60_000)
    app2 = plain_app()
    app2.add_middleware(ql_asgi.RateLimitMiddleware, limiter=short, key=lambda r: "k", wait_ms=10)
    with TestClient(app2) as client:
        assert client.get("/").status_code == 200
        denied = client.get("/")
        assert denied.status_code == 429 and int(denied.headers["retry-after"]) >= 59
    for bad, error in ((-1, ConfigError), ("1s", TypeError), (True, TypeError)):
        with pytest.raises(error, match="wait_ms"):
            ql_asgi.RateLimitMiddleware(plain_app(), short, wait_ms=bad)


def test_middleware_pass_shadow_admissions_without_headers_and_deny_blocked_keys() -> None:
    url = f"memory://{unique('mw')}"
    limiter = Limiter(url, limit=1, window_ms=60_000, shadow=True, policy_refresh_ms=1000)
    limiter.policy_assign("bot", "blocked")
    limiter.refresh_policies()
    app = plain_app()
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter, key=lambda r: r.headers.get("x-user"))
    with TestClient(app) as client:
        first = client.get("/", headers={"x-user": "ann"})
        assert first.status_code == 200 and "ratelimit" in first.headers
        shadow = client.get("/", headers={"x-user": "ann"})
        assert shadow.status_code == 200 and "ratelimit" not in shadow.headers
        blocked = client.get("/", headers={"x-user": "bot"})
        assert blocked.status_code == 429 and "retry-after" in blocked.headers
    assert limiter.metrics()["shadow_denied"] == 1


# --- concurrency=True: a permit per request in flight -------------------------


class GatedApp:
    """A raw ASGI app whose every request waits at its path's gate, the
    response start already sent when ``stream`` is set (a streaming body),
    after announcing itself in ``entered``; "/boom" raises."""

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}

    def gate(self, path: str) -> asyncio.Event:
        return self.gates.setdefault(path, asyncio.Event())

    def arrival(self, path: str) -> asyncio.Event:
        return self.entered.setdefault(path, asyncio.Event())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        self.arrival(path).set()
        if path == "/boom":
            raise RuntimeError("boom")
        if self.stream:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await self.gate(path).wait()
            await send({"type": "http.response.body", "body": b"streamed"})
            return
        await self.gate(path).wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]})
        await send({"type": "http.response.body", "body": b"done"})


async def asgi_request(app: Any, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    """One HTTP request through the ASGI ``app``: the messages it sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers or [],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    return sent


def status_headers_body(sent: list[dict[str, Any]]) -> tuple[int, dict[str, str], bytes]:
    start = sent[0]
    assert start["type"] == "http.response.start"
    headers = {bytes(n).decode("latin-1"): bytes(v).decode("latin-1") for n, v in start["headers"]}
    assert len(headers) == len(start["headers"]), "no header twice"
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, body


def check_concurrency_denied(sent: list[dict[str, Any]]) -> None:
    """The 429 of a request past the concurrency: the problem body,
    ``Retry-After: 1`` and no RateLimit fields (they describe rates)."""
    status, headers, body = status_headers_body(sent)
    assert status == 429
    check_problem(headers["content-type"], body)
    assert headers["content-length"] == str(len(body))
    assert headers["retry-after"] == "1"
    assert "ratelimit" not in headers and "ratelimit-policy" not in headers
    assert set(headers) == {"content-type", "content-length", "retry-after"}


async def test_asgi_concurrency_admits_n_in_flight_and_a_finished_request_frees_its_permit() -> None:
    limiter = Limiter(limit=1000, concurrency=2)
    inner = GatedApp()
    mw = ql_asgi.RateLimitMiddleware(inner, limiter=limiter, key=lambda r: r.headers.get("x-user"), concurrency=True)
    ann = [(b"x-user", b"ann")]
    first = asyncio.create_task(asgi_request(mw, "/a", ann))
    second = asyncio.create_task(asgi_request(mw, "/b", ann))
    await inner.arrival("/a").wait()
    await inner.arrival("/b").wait()
    # two of ann's requests in flight: the third is denied and never reaches the app
    check_concurrency_denied(await asgi_request(mw, "/c", ann))
    assert "/c" not in inner.entered
    # another key has its own permits; key() returning None is not limited
    inner.gate("/bob").set()
    assert status_headers_body(await asgi_request(mw, "/bob", [(b"x-user", b"bob")]))[0] == 200
    inner.gate("/free").set()
    for _ in range(3):
        assert status_headers_body(await asgi_request(mw, "/free"))[0] == 200
    # one finishes (its response sent, no RateLimit fields on it): its permit is free again
    inner.gate("/a").set()
    status, headers, body = status_headers_body(await first)
    assert (status, body, headers) == (200, b"done", {"x-app": "1"})
    third = asyncio.create_task(asgi_request(mw, "/c", ann))
    await inner.arrival("/c").wait()
    # /b and /c in flight now: the next is denied again
    check_concurrency_denied(await asgi_request(mw, "/d", ann))
    inner.gate("/b").set()
    inner.gate("/c").set()
    assert [status_headers_body(await t)[0] for t in (second, third)] == [200, 200]
    # both released: two fit again
    inner.gate("/d").set()
    inner.gate("/e").set()
    done = await asyncio.gather(asgi_request(mw, "/d", ann), asgi_request(mw, "/e", ann))
    assert [status_headers_body(s)[0] for s in done] == [200, 200]
    limiter.close()


async def test_asgi_concurrency_releases_when_the_app_raises_and_holds_a_streaming_body() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    inner = GatedApp(stream=True)
    mw = ql_asgi.RateLimitMiddleware(inner, limiter=limiter, key=lambda r: "k", concurrency=True)
    # each raise gives its permit back, or the second would be a 429; the
    # exceptions (and their frames, the permit among their locals) are kept, as
    # an error reporter would, so it is the release that frees the permit, not
    # its garbage collection (try/except, as pytest.raises lets go of the frames)
    kept: list[RuntimeError] = []
    for _ in range(3):
        try:
            await asgi_request(mw, "/boom")
        except RuntimeError as e:
            kept.append(e)
    assert [str(e) for e in kept] == ["boom"] * 3
    # a streaming response holds its permit until its body is sent
    streaming = asyncio.create_task(asgi_request(mw, "/stream"))
    await inner.arrival("/stream").wait()
    check_concurrency_denied(await asgi_request(mw, "/other"))
    inner.gate("/stream").set()
    status, _, body = status_headers_body(await streaming)
    assert (status, body) == (200, b"streamed")
    inner.gate("/other").set()
    assert status_headers_body(await asgi_request(mw, "/other"))[0] == 200
    limiter.close()


async def test_asgi_concurrency_takes_the_requests_tier() -> None:
    limiter = Limiter(limit=1000, concurrency=3, tiers="free=1000/min, 1 concurrent")
    inner = GatedApp()
    mw = ql_asgi.RateLimitMiddleware(
        inner,
        limiter=limiter,
        key=lambda r: "k",
        tier=lambda r: r.headers.get("x-tier"),
        concurrency=True,
    )
    free = [(b"x-tier", b"free")]
    first = asyncio.create_task(asgi_request(mw, "/a", free))
    await inner.arrival("/a").wait()
    # the tier's 1 concurrent: the second of its requests is denied
    check_concurrency_denied(await asgi_request(mw, "/b", free))
    inner.gate("/a").set()
    assert status_headers_body(await first)[0] == 200
    # an unknown tier is the limiter's error, not a silent default
    with pytest.raises(ConfigError, match="gold"):
        await asgi_request(mw, "/c", [(b"x-tier", b"gold")])
    limiter.close()


def test_asgi_concurrency_on_starlette_and_its_misconfiguration() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    app = plain_app()
    app.add_middleware(ql_asgi.RateLimitMiddleware, limiter=limiter, key=lambda r: "k", concurrency=True)
    with TestClient(app) as client:
        r = client.get("/")  # one at a time: each finished request gives its permit back
        assert (r.status_code, r.text) == (200, "hello") and "ratelimit" not in r.headers
        assert [client.get("/").status_code for _ in range(3)] == [200] * 3
    # a limiter without concurrency: every request raises its ConfigError
    no_concurrency = Limiter(limit=1000)
    app2 = plain_app()
    app2.add_middleware(ql_asgi.RateLimitMiddleware, limiter=no_concurrency, key=lambda r: "k", concurrency=True)
    with TestClient(app2) as client, pytest.raises(ConfigError, match="`concurrency` is 0"):
        client.get("/")
    # cost and wait_ms do not apply to a permit: an error, not ignored
    for option in ({"cost": 2}, {"cost": lambda r: 1}, {"wait_ms": 100}):
        with pytest.raises(ConfigError, match=f"{next(iter(option))} cannot be combined with concurrency=True"):
            ql_asgi.RateLimitMiddleware(plain_app(), limiter, concurrency=True, **option)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="concurrency must be a bool"):
        ql_asgi.RateLimitMiddleware(plain_app(), limiter, concurrency=2)  # type: ignore[arg-type]
    limiter.close()
    no_concurrency.close()


# --- WSGI concurrency=True: a permit per request until its body is closed ------

#: How long a test thread waits at a gate before the test fails: a guard
#: against a hang, never reached when the test passes.
HANG_S = 30.0


class GatedWSGIApp:
    """A WSGI app whose every request announces itself in ``entered`` and waits
    at its path's gate before answering; "/boom" raises before answering;
    "/stream..." answers at once with a body that sends ``b"first"``, then
    waits at its gate for ``b"rest"`` (and records its own close)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.closed: list[str] = []

    def gate(self, path: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(path, threading.Event())

    def arrival(self, path: str) -> threading.Event:
        with self.lock:
            return self.entered.setdefault(path, threading.Event())

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ["PATH_INFO"]
        self.arrival(path).set()
        if path == "/boom":
            raise RuntimeError("boom")
        if path.startswith("/stream"):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return self.stream(path)
        assert self.gate(path).wait(HANG_S)
        start_response("200 OK", [("X-App", "1")])
        return [b"done"]

    def stream(self, path: str) -> Iterator[bytes]:
        try:
            yield b"first"
            assert self.gate(path).wait(HANG_S)
            yield b"rest"
        finally:
            self.closed.append(path)


def wsgi_open(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[list[Any], Any]:
    """Start one request through the WSGI ``app``: (its start_response
    arguments, filled when called; its body, neither read nor closed)."""
    environ = EnvironBuilder(path=path, headers=headers).get_environ()
    started: list[Any] = []

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, response_headers]
        return lambda data: None

    return started, app(environ, start_response)


def wsgi_request(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[str, list[Any], bytes]:
    """One request as a server runs it: the body read, then closed, also
    when reading it fails (PEP 3333)."""
    started, body = wsgi_open(app, path, headers)
    try:
        data = b"".join(body)
    finally:
        if hasattr(body, "close"):
            body.close()
    return started[0], started[1], data


def check_wsgi_concurrency_denied(response: tuple[str, list[Any], bytes]) -> None:
    """The 429 of a request past the concurrency: the problem body, its
    length, ``Retry-After: 1`` and nothing else (no RateLimit fields)."""
    status, headers, body = response
    assert status == "429 Too Many Requests"
    fields = dict(headers)
    assert len(fields) == len(headers), "no header twice"
    assert set(fields) == {"Content-Type", "Content-Length", "Retry-After"}
    check_problem(fields["Content-Type"], body)
    assert fields["Content-Length"] == str(len(body))
    assert fields["Retry-After"] == "1"


def user_key(request: Any) -> str | None:
    return request.headers.get("X-User")


def test_wsgi_concurrency_admits_n_in_flight_and_a_finished_request_frees_its_permit() -> None:
    limiter = Limiter(limit=1000, concurrency=2)
    inner = GatedWSGIApp()
    mw = ql_wsgi.RateLimitMiddleware(inner, limiter=limiter, key=user_key, concurrency=True)
    ann = {"X-User": "ann"}
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(wsgi_request, mw, "/a", ann)
        second = pool.submit(wsgi_request, mw, "/b", ann)
        assert inner.arrival("/a").wait(HANG_S) and inner.arrival("/b").wait(HANG_S)
        # two of ann's requests in flight (their worker threads in the app):
        # the third is denied and never reaches the app (its gate is open:
        # admitted by mistake, it would not hang the test)
        inner.gate("/x").set()
        check_wsgi_concurrency_denied(wsgi_request(mw, "/x", ann))
        assert "/x" not in inner.entered
        # another key has its own permits; key() returning None is not limited
        inner.gate("/bob").set()
        assert wsgi_request(mw, "/bob", {"X-User": "bob"})[0] == "200 OK"
        inner.gate("/free").set()
        assert [wsgi_request(mw, "/free")[0] for _ in range(3)] == ["200 OK"] * 3
        # one finishes (no RateLimit fields on it): its permit is free again
        inner.gate("/a").set()
        assert first.result(HANG_S) == ("200 OK", [("X-App", "1")], b"done")
        third = pool.submit(wsgi_request, mw, "/c", ann)
        assert inner.arrival("/c").wait(HANG_S)
        # /b and /c in flight now: the next is denied again
        check_wsgi_concurrency_denied(wsgi_request(mw, "/x", ann))
        inner.gate("/b").set()
        inner.gate("/c").set()
        assert [f.result(HANG_S)[0] for f in (second, third)] == ["200 OK"] * 2
        # both released: two fit again
        inner.gate("/d").set()
        inner.gate("/e").set()
        done = [pool.submit(wsgi_request, mw, path, ann) for path in ("/d", "/e")]
        assert [f.result(HANG_S)[0] for f in done] == ["200 OK"] * 2
    limiter.close()


def test_wsgi_concurrency_releases_when_the_app_raises_and_holds_a_streaming_body() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    inner = GatedWSGIApp()
    mw = ql_wsgi.RateLimitMiddleware(inner, limiter=limiter, key=lambda r: "k", concurrency=True)
    # each raise gives its permit back, or the second would be a 429; the
    # exceptions (their frames, the permit among their locals) are kept, as an
    # error reporter would, so it is the release that frees the permit
    kept: list[RuntimeError] = []
    for _ in range(3):
        try:
            wsgi_request(mw, "/boom")
        except RuntimeError as e:
            kept.append(e)
    assert [str(e) for e in kept] == ["boom"] * 3
    # a streaming body holds its permit until the server closes it: read to
    # its end is not enough, the server's close() gives it back
    started, body = wsgi_open(mw, "/stream")
    assert started[0] == "200 OK" and next(body) == b"first"
    inner.gate("/other").set()
    check_wsgi_concurrency_denied(wsgi_request(mw, "/other"))
    inner.gate("/stream").set()
    assert list(body) == [b"rest"]
    check_wsgi_concurrency_denied(wsgi_request(mw, "/other"))
    body.close()
    assert inner.closed == ["/stream"]  # the app's own body was closed too
    body.close()  # a second close gives nothing back twice (no ReservationError)
    assert wsgi_request(mw, "/other")[0] == "200 OK"
    # a body closed unread (a HEAD, a client gone) gives it back too
    _, unread = wsgi_open(mw, "/stream-unread")
    check_wsgi_concurrency_denied(wsgi_request(mw, "/other"))
    unread.close()
    assert wsgi_request(mw, "/other")[0] == "200 OK"

    # and so does a body that fails while the server reads it (it closes it)
    def failing(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        yield b"part"
        raise RuntimeError("body failed")

    failing_mw = ql_wsgi.RateLimitMiddleware(failing, limiter=limiter, key=lambda r: "k", concurrency=True)
    with pytest.raises(RuntimeError, match="body failed"):
        wsgi_request(failing_mw, "/")
    assert wsgi_request(mw, "/other")[0] == "200 OK"
    limiter.close()


def test_wsgi_concurrency_takes_the_requests_tier() -> None:
    limiter = Limiter(limit=1000, concurrency=3, tiers="free=1000/min, 1 concurrent")
    inner = GatedWSGIApp()
    mw = ql_wsgi.RateLimitMiddleware(
        inner, limiter=limiter, key=user_key, tier=lambda r: r.headers.get("X-Tier"), concurrency=True
    )
    free = {"X-User": "ann", "X-Tier": "free"}
    inner.gate("/probe").set()
    # the tier's 1 concurrent: the second of its requests is denied
    _, held = wsgi_open(mw, "/stream-free", free)
    check_wsgi_concurrency_denied(wsgi_request(mw, "/probe", free))
    held.close()
    assert wsgi_request(mw, "/probe", free)[0] == "200 OK"
    # no tier: the limiter's concurrency=3
    bob = {"X-User": "bob"}
    bodies = [wsgi_open(mw, f"/stream-bob{i}", bob)[1] for i in range(3)]
    check_wsgi_concurrency_denied(wsgi_request(mw, "/probe", bob))
    for body in bodies:
        body.close()
    # an unknown tier is the limiter's error, not a silent default
    with pytest.raises(ConfigError, match="gold"):
        wsgi_request(mw, "/probe", {"X-User": "cat", "X-Tier": "gold"})
    limiter.close()


def test_flask_concurrency_and_its_misconfiguration() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    app = flask.Flask("quotalease_concurrency")

    @app.get("/")
    def home() -> Any:
        return "hello"

    @app.get("/stream")
    def stream() -> Any:
        return flask.Response(iter([b"a", b"b"]), mimetype="text/plain")

    app.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, limiter=limiter, key=lambda r: "k", concurrency=True
    )
    client = app.test_client()
    # one at a time: each closed response gives its permit back
    for _ in range(3):
        with client.get("/") as r:
            assert (r.status_code, r.data) == (200, b"hello") and "RateLimit" not in r.headers
    # a streamed response holds it until the client closes it, as a server does
    streamed = client.get("/stream")
    assert streamed.status_code == 200
    with client.get("/") as denied:
        assert denied.status_code == 429 and denied.headers["Retry-After"] == "1"
        assert "RateLimit" not in denied.headers and "RateLimit-Policy" not in denied.headers
        check_problem(denied.headers["Content-Type"], denied.data)
    assert streamed.data == b"ab"
    streamed.close()
    with client.get("/") as r:
        assert r.status_code == 200
    # a limiter without concurrency: every request raises its ConfigError
    no_concurrency = Limiter(limit=1000)
    plain = flask.Flask("quotalease_no_concurrency")
    plain.add_url_rule("/", "home", lambda: "hello")
    plain.wsgi_app = ql_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
        plain.wsgi_app, limiter=no_concurrency, key=lambda r: "k", concurrency=True
    )
    with pytest.raises(ConfigError, match="`concurrency` is 0"):
        plain.test_client().get("/")
    # cost and wait_ms do not apply to a permit: an error, not ignored
    for option in ({"cost": 2}, {"cost": lambda r: 1}, {"wait_ms": 100}):
        with pytest.raises(ConfigError, match=f"{next(iter(option))} cannot be combined with concurrency=True"):
            ql_wsgi.RateLimitMiddleware(app.wsgi_app, limiter, concurrency=True, **option)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="concurrency must be a bool"):
        ql_wsgi.RateLimitMiddleware(app.wsgi_app, limiter, concurrency=2)  # type: ignore[arg-type]
    limiter.close()
    no_concurrency.close()
