"""quotalease.fastapi's ``limit(limiter, concurrency=True)``: a dependency
with ``yield`` holding the request's permit until FastAPI exits it after the
response is sent (a StreamingResponse after its last chunk), also when the
route raises; past the N, RateLimited with only Retry-After. Driven through
the raw ASGI app and gates, not sleeps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

import quotalease.fastapi as ql_fastapi
from conftest import check_problem
from quotalease import ConfigError, Decision, Limiter
from quotalease._middleware import DENIED_DETAIL
from quotalease.fastapi import RateLimited, RoutePermit, limit, problem_response


def by_user(request: Request) -> str | None:
    return request.headers.get("x-user")


def by_tier(request: Request) -> str | None:
    return request.headers.get("x-tier")


class Gates:
    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def arrival(self, name: str) -> asyncio.Event:
        return self.entered.setdefault(name, asyncio.Event())


def make_app(limiter: Limiter, gates: Gates, **options: Any) -> FastAPI:
    """Routes sharing one group of permits: "/work/{name}" waits at its gate,
    "/stream/{name}" sends b"first" then waits at its gate for b"rest",
    "/boom" raises, "/plain" answers at once with the dependency's value."""
    app = FastAPI()
    app.add_exception_handler(RateLimited, problem_response)
    permit = limit(limiter, key=by_user, group="shared", concurrency=True, **options)

    @app.get("/work/{name}", dependencies=[Depends(permit)])
    async def work(name: str) -> dict[str, str]:
        gates.arrival(name).set()
        await gates.gate(name).wait()
        return {"done": name}

    @app.get("/stream/{name}", dependencies=[Depends(permit)])
    async def stream(name: str) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first"
            gates.arrival(name).set()
            await gates.gate(name).wait()
            yield b"rest"

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/boom", dependencies=[Depends(permit)])
    async def boom() -> None:
        raise RuntimeError("boom")

    @app.get("/plain")
    # a default, not Annotated: `permit` is local, out of reach of the string annotation
    async def plain(d: Decision | None = Depends(permit)) -> dict[str, Any]:  # noqa: B008
        return {"allowed": None if d is None else d.allowed}

    return app


async def asgi_get(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET through the ASGI ``app``: status, headers and body."""
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
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            await asyncio.Event().wait()  # no disconnect while the response is sent
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    start = sent[0]
    fields = {bytes(n).decode("latin-1"): bytes(v).decode("latin-1") for n, v in start["headers"]}
    return start["status"], fields, b"".join(m.get("body", b"") for m in sent[1:])


def check_denied(response: tuple[int, dict[str, str], bytes]) -> None:
    status, headers, body = response
    assert status == 429
    check_problem(headers["content-type"], body)
    assert headers["retry-after"] == "1"
    assert "ratelimit" not in headers and "ratelimit-policy" not in headers


async def test_holds_n_permits_until_the_response_is_sent() -> None:
    limiter = Limiter(limit=1000, concurrency=2)
    gates = Gates()
    app = make_app(limiter, gates)
    ann = {"x-user": "ann"}
    first = asyncio.create_task(asgi_get(app, "/work/a", ann))
    second = asyncio.create_task(asgi_get(app, "/work/b", ann))
    await gates.arrival("a").wait()
    await gates.arrival("b").wait()
    # two in flight: the third is denied before the route runs (its gate is
    # open: admitted by mistake, it would answer at once, not hang the test)
    gates.gate("x").set()
    check_denied(await asgi_get(app, "/work/x", ann))
    assert "x" not in gates.entered
    # another key has its own permits; no key: not limited (the value is None)
    status, headers, body = await asgi_get(app, "/plain", {"x-user": "bob"})
    assert (status, body) == (200, b'{"allowed":true}') and "ratelimit" not in headers
    assert (await asgi_get(app, "/plain"))[2] == b'{"allowed":null}'
    gates.gate("a").set()
    assert (await first)[::2] == (200, b'{"done":"a"}')
    # a's permit is back: c runs beside b, then d is denied
    third = asyncio.create_task(asgi_get(app, "/work/c", ann))
    await gates.arrival("c").wait()
    check_denied(await asgi_get(app, "/work/x", ann))
    gates.gate("b").set()
    gates.gate("c").set()
    assert [(await t)[0] for t in (second, third)] == [200, 200]
    # a streaming response holds its permit until its body is sent
    streams = [asyncio.create_task(asgi_get(app, f"/stream/{n}", ann)) for n in ("s", "t")]
    await gates.arrival("s").wait()
    await gates.arrival("t").wait()
    check_denied(await asgi_get(app, "/plain", ann))
    gates.gate("s").set()
    gates.gate("t").set()
    assert [(await t)[::2] for t in streams] == [(200, b"firstrest")] * 2
    assert (await asgi_get(app, "/plain", ann))[0] == 200
    # a route that raises gives its permit back (else the third would be a 429)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="boom"):
            await asgi_get(app, "/boom", ann)
    assert (await asgi_get(app, "/plain", ann))[0] == 200
    limiter.close()


async def test_takes_the_requests_tier() -> None:
    limiter = Limiter(limit=1000, concurrency=3, tiers="free=1000/min, 1 concurrent")
    gates = Gates()
    app = make_app(limiter, gates, tier=by_tier)
    free = {"x-user": "ann", "x-tier": "free"}
    held = asyncio.create_task(asgi_get(app, "/work/f", free))
    await gates.arrival("f").wait()
    check_denied(await asgi_get(app, "/plain", free))
    gates.gate("f").set()
    assert (await held)[0] == 200
    with pytest.raises(ConfigError, match="gold"):
        await asgi_get(app, "/plain", {"x-user": "cat", "x-tier": "gold"})
    limiter.close()


async def test_fastapis_own_429_without_problem_response() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    gates = Gates()
    app = FastAPI()
    dependency = limit(limiter, key=lambda r: "k", concurrency=True)
    assert isinstance(dependency, RoutePermit) and dependency.limiter is limiter

    @app.get("/{name}", dependencies=[Depends(dependency)])
    async def work(name: str) -> dict[str, str]:
        gates.arrival(name).set()
        await gates.gate(name).wait()
        return {"done": name}

    held = asyncio.create_task(asgi_get(app, "/a"))
    await gates.arrival("a").wait()
    gates.gate("b").set()
    status, headers, body = await asgi_get(app, "/b")
    assert (status, headers["retry-after"]) == (429, "1") and "ratelimit" not in headers
    assert json.loads(body) == {"detail": DENIED_DETAIL}
    gates.gate("a").set()
    assert (await held)[0] == 200
    assert (await asgi_get(app, "/b"))[0] == 200
    limiter.close()


def test_through_the_test_client() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit(limiter, key=lambda r: "k", concurrency=True))])
    async def home() -> dict[str, str]:
        return {"ok": "yes"}

    with TestClient(app) as client:
        # one at a time: each request gives its permit back once it is sent
        responses = [client.get("/") for _ in range(3)]
        assert [r.status_code for r in responses] == [200] * 3
        assert "ratelimit" not in responses[0].headers
    limiter.close()


def test_misconfiguration(monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    for option in ({"cost": 2}, {"cost": lambda r: 1}, {"wait_ms": 100}):
        with pytest.raises(ConfigError, match=f"{next(iter(option))} cannot be combined with concurrency=True"):
            limit(limiter, concurrency=True, **option)
    with pytest.raises(TypeError, match="concurrency must be a bool.*Limiter\\(\\.\\.\\., concurrency=5\\)"):
        limit(limiter, concurrency=5)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="concurrency must be a bool"):
        limit(limiter, concurrency="yes")  # type: ignore[call-overload]
    # a limiter without concurrency: every request raises its ConfigError
    no_concurrency = Limiter(limit=1000)
    app = FastAPI()
    app.get("/", dependencies=[Depends(limit(no_concurrency, concurrency=True))])(lambda: {})
    with TestClient(app) as client, pytest.raises(ConfigError, match="`concurrency` is 0"):
        client.get("/")
    # a FastAPI that exits dependencies with yield before the response is sent: refused
    monkeypatch.setattr(ql_fastapi, "_fastapi_version", "0.117.1")
    with pytest.raises(ConfigError, match="needs FastAPI 0.118 or later.*RateLimitMiddleware"):
        limit(limiter, concurrency=True)
    limit(limiter)  # the rate mode is not concerned
    limiter.close()
    no_concurrency.close()
