"""Django's concurrency mode: ``QUOTALEASE['CONCURRENCY']`` on the middleware
(sync and async chains) and ``@ratelimit(..., concurrency=True)`` on a view,
through Django's test Client, AsyncClient and RequestFactory: a permit per
request in flight, held until Django closes the response (a streaming one
after its last chunk), given back when the view raises; a request past the N
gets the 429 with only Retry-After. Driven through gates, not sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path

from conftest import check_problem
from quotalease import ConfigError, Limiter
from quotalease.django import ratelimit, ratelimit_decision

MIDDLEWARE = ["quotalease.django.RateLimitMiddleware"]


@pytest.fixture(autouse=True, scope="module")
def django_settings() -> None:
    """Django's settings, configured here only when no other module did:
    test_django.py configures them when it is imported (its URLconf global),
    and every test here names its own URLconf."""
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="quotalease-tests",
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            DEFAULT_CHARSET="utf-8",
        )
        django.setup()


#: How long a test thread waits at a gate before the test fails: a guard
#: against a hang, never reached when the test passes.
HANG_S = 30.0


class Gates:
    """Per-name events: ``arrival(name)`` set when a view starts, ``gate(name)``
    a view waits at (threading events for the sync chain, asyncio events for
    the async one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[str, Any] = {}
        self.entered: dict[str, Any] = {}
        self.kind: Any = threading.Event

    def reset(self, kind: Any) -> None:
        with self.lock:
            self.gates.clear()
            self.entered.clear()
            self.kind = kind

    def gate(self, name: str) -> Any:
        with self.lock:
            return self.gates.setdefault(name, self.kind())

    def arrival(self, name: str) -> Any:
        with self.lock:
            return self.entered.setdefault(name, self.kind())


gates = Gates()


def gated(request: HttpRequest, name: str) -> HttpResponse:
    gates.arrival(name).set()
    assert gates.gate(name).wait(HANG_S)
    return HttpResponse(f"done {name}", headers={"X-App": "1"})


async def async_gated(request: HttpRequest, name: str) -> HttpResponse:
    gates.arrival(name).set()
    await gates.gate(name).wait()
    return HttpResponse(f"done {name}")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("plain")


async def async_plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("plain")


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("boom")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    def chunks() -> Iterator[bytes]:
        yield b"first"
        yield b"rest"

    return StreamingHttpResponse(chunks(), content_type="text/plain")


async def async_stream(request: HttpRequest) -> StreamingHttpResponse:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first"
        yield b"rest"

    return StreamingHttpResponse(chunks(), content_type="text/plain")


urlpatterns = [
    path("gated/<str:name>/", gated),
    path("async-gated/<str:name>/", async_gated),
    path("plain/", plain),
    path("async-plain/", async_plain),
    path("boom/", boom),
    path("stream/", stream),
    path("async-stream/", async_stream),
]


def plan_of(request: HttpRequest) -> str | None:
    return request.headers.get("X-Tier")


def check_denied(r: Any) -> None:
    """The 429 of a request past the concurrency: the problem body,
    ``Retry-After: 1`` and no RateLimit fields (they describe rates)."""
    assert r.status_code == 429
    check_problem(r.headers["Content-Type"], r.content)
    assert r.headers["Retry-After"] == "1"
    assert "RateLimit" not in r.headers and "RateLimit-Policy" not in r.headers


def concurrency_settings(limiter: Limiter, **more: Any) -> override_settings:
    conf = {"LIMITER": limiter, "KEY": "header:X-User", "CONCURRENCY": True, **more}
    return override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf)


def get(url: str, user: str | None = None) -> Any:
    """One request through a Client of its own (one per thread)."""
    return Client().get(url, headers={"X-User": user} if user else {})


# --- the middleware, sync chain -----------------------------------------------


def test_middleware_admits_n_in_flight_and_a_finished_request_frees_its_permit() -> None:
    gates.reset(threading.Event)
    limiter = Limiter(limit=1000, concurrency=2)
    with concurrency_settings(limiter), ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(get, "/gated/a/", "ann")
        second = pool.submit(get, "/gated/b/", "ann")
        assert gates.arrival("a").wait(HANG_S) and gates.arrival("b").wait(HANG_S)
        # two of ann's requests in flight: the third is denied, never reaching
        # the view (its gate is open: admitted by mistake, it would not hang)
        gates.gate("x").set()
        check_denied(get("/gated/x/", "ann"))
        assert "x" not in gates.entered
        # another key has its own permits; no key (KEY returns None): not limited
        assert get("/plain/", "bob").status_code == 200
        assert [get("/plain/").status_code for _ in range(3)] == [200] * 3
        # one finishes (no RateLimit fields on it): its permit is free again
        gates.gate("a").set()
        r = first.result(HANG_S)
        assert (r.status_code, r.content, r.headers["X-App"]) == (200, b"done a", "1")
        assert "RateLimit" not in r.headers and "Retry-After" not in r.headers
        third = pool.submit(get, "/gated/c/", "ann")
        assert gates.arrival("c").wait(HANG_S)
        check_denied(get("/gated/x/", "ann"))
        gates.gate("b").set()
        gates.gate("c").set()
        assert [f.result(HANG_S).status_code for f in (second, third)] == [200, 200]
        assert get("/plain/", "ann").status_code == 200
    limiter.close()


def test_middleware_releases_when_the_view_raises_and_holds_a_streaming_response() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    with concurrency_settings(limiter):
        client = Client()
        # each raise gives its permit back, or the second would be a 429
        for _ in range(3):
            with pytest.raises(RuntimeError, match="boom"):
                client.get("/boom/", headers={"X-User": "ann"})
        # a streaming response holds its permit until Django closes it, after its last chunk
        streaming = client.get("/stream/", headers={"X-User": "ann"})
        assert streaming.status_code == 200 and streaming.streaming
        check_denied(client.get("/plain/", headers={"X-User": "ann"}))
        assert b"".join(streaming.streaming_content) == b"firstrest"  # closed at its end
        assert client.get("/plain/", headers={"X-User": "ann"}).status_code == 200
        # one closed unread (the client gone) gives it back too
        unread = client.get("/stream/", headers={"X-User": "ann"})
        check_denied(client.get("/plain/", headers={"X-User": "ann"}))
        unread.close()
        assert client.get("/plain/", headers={"X-User": "ann"}).status_code == 200
    limiter.close()


def test_middleware_takes_the_requests_tier_and_the_permits_decision() -> None:
    limiter = Limiter(limit=1000, concurrency=3, tiers="free=1000/min, 1 concurrent")
    with concurrency_settings(limiter, TIER=plan_of):
        client = Client()
        free = {"X-User": "ann", "X-Tier": "free"}
        held = client.get("/stream/", headers=free)
        check_denied(client.get("/plain/", headers=free))
        held.close()
        assert client.get("/plain/", headers=free).status_code == 200
        # no tier: the limiter's concurrency=3
        bodies = [client.get("/stream/", headers={"X-User": "bob"}) for _ in range(3)]
        check_denied(client.get("/plain/", headers={"X-User": "bob"}))
        for body in bodies:
            body.close()
        # an unknown tier is the limiter's error, not a silent default
        with pytest.raises(ConfigError, match="gold"):
            client.get("/plain/", headers={"X-User": "cat", "X-Tier": "gold"})
    limiter.close()


def test_middleware_concurrency_misconfiguration() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    # COST and WAIT_MS do not apply to a permit: ImproperlyConfigured, also a ConfigError
    for entry, value in (("COST", 2), ("WAIT_MS", 100)):
        with concurrency_settings(limiter, **{entry: value}):
            with pytest.raises(ImproperlyConfigured, match=f"{entry}'\\] cannot be combined") as e:
                Client().get("/plain/")
            assert isinstance(e.value, ConfigError)
    for bad in (2, "yes"):
        with concurrency_settings(limiter, CONCURRENCY=bad):
            with pytest.raises(ImproperlyConfigured, match="CONCURRENCY'\\] must be a bool") as t:
                Client().get("/plain/")
            assert isinstance(t.value, TypeError)
    # a limiter without concurrency: every request raises its ConfigError
    no_concurrency = Limiter(limit=1000)
    with concurrency_settings(no_concurrency):
        with pytest.raises(ConfigError, match="`concurrency` is 0"):
            Client().get("/plain/", headers={"X-User": "ann"})
    # a DENIED handler answers a denial; only Retry-After is added to it
    with concurrency_settings(limiter, DENIED=lambda request, decision: HttpResponse("busy", status=503)):
        client = Client()
        held = client.get("/stream/", headers={"X-User": "ann"})
        r = client.get("/plain/", headers={"X-User": "ann"})
        assert (r.status_code, r.content, r.headers["Retry-After"]) == (503, b"busy", "1")
        assert "RateLimit" not in r.headers
        held.close()
    limiter.close()
    no_concurrency.close()


# --- the middleware, async chain ----------------------------------------------


def test_middleware_async_chain_holds_permits_until_the_response_is_sent() -> None:
    limiter = Limiter(limit=1000, concurrency=2)

    async def run() -> None:
        gates.reset(asyncio.Event)
        client = AsyncClient()
        ann = {"X-User": "ann"}
        first = asyncio.create_task(client.get("/async-gated/a/", headers=ann))
        second = asyncio.create_task(client.get("/async-gated/b/", headers=ann))
        await gates.arrival("a").wait()
        await gates.arrival("b").wait()
        gates.gate("x").set()  # admitted by mistake, it would not hang the test
        check_denied(await client.get("/async-gated/x/", headers=ann))
        assert "x" not in gates.entered
        assert (await client.get("/async-plain/", headers={"X-User": "bob"})).status_code == 200
        gates.gate("a").set()
        r = await first
        assert (r.status_code, r.content) == (200, b"done a") and "RateLimit" not in r.headers
        gates.gate("b").set()
        assert (await second).status_code == 200
        # an async streaming response holds its permit until its last chunk
        held = [await client.get("/async-stream/", headers=ann) for _ in range(2)]
        check_denied(await client.get("/async-plain/", headers=ann))
        for response in held:
            assert b"".join([chunk async for chunk in response.streaming_content]) == b"firstrest"
        assert (await client.get("/async-plain/", headers=ann)).status_code == 200

    with concurrency_settings(limiter):
        asyncio.run(run())
    limiter.close()


# --- the decorator ---------------------------------------------------------------


def test_decorator_holds_the_views_permit_until_its_response_is_closed() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    seen: list[bool | None] = []

    @ratelimit(limiter=limiter, key="header:X-User", concurrency=True)
    def view(request: HttpRequest) -> HttpResponse:
        decision = ratelimit_decision(request)
        seen.append(None if decision is None else decision.allowed)
        if request.GET.get("boom"):
            raise RuntimeError("boom")
        return HttpResponse("ok")

    rf = RequestFactory()
    ann = {"X-User": "ann"}
    held = view(rf.get("/", headers=ann))
    assert held.status_code == 200 and "RateLimit" not in held
    check_denied(view(rf.get("/", headers=ann)))
    assert seen == [True]  # the denied request never reached the view
    held.close()  # Django closes a response once it is sent
    for _ in range(2):
        with pytest.raises(RuntimeError, match="boom"):
            view(rf.get("/", {"boom": "1"}, headers=ann))
    again = view(rf.get("/", headers=ann))
    assert again.status_code == 200
    again.close()
    limiter.close()


def test_decorator_block_false_async_view_and_bad_input() -> None:
    limiter = Limiter(limit=1000, concurrency=1)

    @ratelimit(limiter=limiter, key=lambda request: "k", concurrency=True, block=False)
    def soft(request: HttpRequest) -> HttpResponse:
        decision = ratelimit_decision(request)
        return HttpResponse("full" if decision is not None and decision.allowed else "degraded")

    @ratelimit(limiter=limiter, key=lambda request: "k", concurrency=True, group="async")
    async def async_view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("async")

    rf = RequestFactory()
    first = soft(rf.get("/"))
    second = soft(rf.get("/"))  # denied, reaching the view anyway
    assert (first.content, second.content) == (b"full", b"degraded")
    assert second["Retry-After"] == "1" and "RateLimit" not in second
    first.close()

    async def run() -> None:
        held = await async_view(rf.get("/"))
        check_denied(await async_view(rf.get("/")))
        held.close()
        (await async_view(rf.get("/"))).close()

    asyncio.run(run())
    # the settings' COST and WAIT_MS are for rates: a concurrency view ignores them
    with override_settings(QUOTALEASE={"COST": 3, "WAIT_MS": 50}):
        ok = soft(rf.get("/"))
        assert ok.content == b"full"
        ok.close()
    for option in ({"cost": 2}, {"wait_ms": 100}):
        with pytest.raises(ConfigError, match=f"{next(iter(option))} cannot be combined with concurrency=True"):
            ratelimit(limiter=limiter, concurrency=True, **option)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="concurrency must be a bool"):
        ratelimit(limiter=limiter, concurrency=1)  # type: ignore[arg-type]
    limiter.close()
