"""FastAPI per-route limits (quotalease.fastapi.limit) on a real FastAPI app:
through FastAPI's TestClient and over real HTTP (uvicorn on a free loopback
port in a thread), beside the app-wide ASGI middleware."""

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from conftest import DAY, PATIENT, RedisServer, check_problem, unique, wait_for
from quotalease import ConfigError, Decision, InvalidCostError, Limiter, http_key
from quotalease.asgi import RateLimitMiddleware
from quotalease.fastapi import RateLimited, limit, problem_response


def by_user(request: Request) -> str | None:
    return request.headers.get("x-user")


def make_app() -> tuple[FastAPI, dict[str, Any]]:
    app = FastAPI()
    search_limit = limit("3/min", key=by_user)
    shared = limit("4/min", key=by_user, group="reports")
    upload_limit = limit("5/min", key=by_user, cost=lambda request: 2 if request.method == "POST" else 1)
    deps: dict[str, Any] = {"search": search_limit, "shared": shared, "upload": upload_limit}

    @app.get("/search", dependencies=[Depends(search_limit)])
    async def search(q: str = "") -> dict[str, str]:
        return {"q": q}

    other_limit = limit("3/min", key=by_user)

    @app.get("/other")
    async def other(d: Annotated[Decision | None, Depends(other_limit)]) -> dict[str, object]:
        return {"remaining": d.remaining if d else None}

    @app.get("/reports/a", dependencies=[Depends(shared)])
    def report_a() -> str:
        return "a"

    @app.get("/reports/b", dependencies=[Depends(shared)])
    def report_b() -> str:
        return "b"

    @app.post("/upload", dependencies=[Depends(upload_limit)])
    async def upload() -> str:
        return "stored"

    return app, deps


def test_per_route_limit_headers_429_and_decision() -> None:
    app, deps = make_app()
    with TestClient(app) as client:
        for i in range(3):
            r = client.get("/search", params={"q": "x"}, headers={"x-user": "ann"})
            assert r.status_code == 200 and r.json() == {"q": "x"}
            assert r.headers["ratelimit-policy"] == '"default";q=3;w=60'
            assert r.headers["ratelimit"].startswith(f'"default";r={2 - i};')
            assert "retry-after" not in r.headers
        denied = client.get("/search", headers={"x-user": "ann"})
        assert denied.status_code == 429
        assert denied.json() == {"detail": "Too many requests; retry after the Retry-After header's seconds."}
        assert int(denied.headers["retry-after"]) >= 1
        assert denied.headers["ratelimit"].startswith('"default";r=0;t=')
        # Another user has a bucket of their own; no x-user: the key is None, not limited.
        assert client.get("/search", headers={"x-user": "bob"}).status_code == 200
        for _ in range(5):
            r = client.get("/search")
            assert r.status_code == 200 and "ratelimit" not in r.headers
        # Another route with the same rate has its own buckets (group = endpoint),
        # and the dependency's value is the decision.
        assert client.get("/other", headers={"x-user": "ann"}).json() == {"remaining": 2}
        assert client.get("/other").json() == {"remaining": None}
        # group= shares one budget between routes.
        codes = [client.get(f"/reports/{p}", headers={"x-user": "ann"}).status_code for p in "abab" + "a"]
        assert codes == [200, 200, 200, 200, 429]
        # cost from the request: 2 per upload of a 5-token budget.
        codes = [client.post("/upload", headers={"x-user": "ann"}).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
    search_limiter: Limiter = deps["search"].limiter
    group = "test_fastapi.make_app.<locals>.search"
    assert search_limiter.inspect(http_key(f"{group}:ann"))["admitted"] == 3
    assert search_limiter.inspect(http_key(f"{group}:ann"))["denied"] == 1


def test_beside_the_app_wide_middleware_and_a_custom_denial_handler() -> None:
    app_wide = Limiter(rate="100/min")
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=app_wide, key=by_user)

    async def denied(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RateLimited)
        return JSONResponse(
            {"slow_down": exc.decision.retry_after_ms > 0, "reason": exc.decision.reason},
            status_code=429,
            headers=exc.headers,
        )

    app.add_exception_handler(RateLimited, denied)

    @app.get("/", dependencies=[Depends(limit("2/min", key=by_user))])
    async def home() -> str:
        return "home"

    with TestClient(app) as client:
        codes = [client.get("/", headers={"x-user": "ann"}) for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert codes[2].json() == {"slow_down": True, "reason": "exhausted"}
    assert "retry-after" in codes[2].headers
    # The app-wide middleware counted all three (it runs first), the route's limit two admits.
    assert app_wide.inspect("ann")["admitted"] == 3


def test_problem_response_answers_with_the_middlewares_body() -> None:
    app = FastAPI()
    app.add_exception_handler(RateLimited, problem_response)

    @app.get("/", dependencies=[Depends(limit("1/min", key=by_user))])
    async def home() -> str:
        return "home"

    with TestClient(app) as client:
        codes = [client.get("/", headers={"x-user": "ann"}) for _ in range(2)]
    assert [r.status_code for r in codes] == [200, 429]
    check_problem(codes[1].headers["content-type"], codes[1].content)
    assert int(codes[1].headers["retry-after"]) >= 1
    assert codes[1].headers["ratelimit"].startswith('"default";r=0;t=')


def test_beside_the_middleware_the_routes_fields_are_the_only_ones() -> None:
    # Both limit the request; the response carries one RateLimit-Policy and one
    # RateLimit, the route's (two would read as one list of both policies).
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(rate="100/min"), key=by_user)

    @app.get("/export", dependencies=[Depends(limit("2/hour", key=by_user))])
    async def export() -> str:
        return "done"

    @app.get("/")
    async def home() -> str:
        return "home"

    with TestClient(app) as client:
        rs = [client.get("/export", headers={"x-user": "ann"}) for _ in range(3)]
        plain = client.get("/", headers={"x-user": "ann"})
    assert [r.status_code for r in rs] == [200, 200, 429]
    for i, r in enumerate(rs):
        assert r.headers.get_list("ratelimit-policy") == ['"default";q=2;w=3600']
        assert len(r.headers.get_list("ratelimit")) == 1
        assert r.headers["ratelimit"].startswith(f'"default";r={max(1 - i, 0)};')
    assert rs[2].headers.get_list("retry-after") == [rs[2].headers["retry-after"]]
    assert plain.headers.get_list("ratelimit-policy") == ['"default";q=100;w=60']  # the middleware's own
    assert plain.headers["ratelimit"].startswith('"default";r=96;')


def test_a_shared_limiter_on_redis(redis_server: RedisServer) -> None:
    limiter = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=4, window_ms=DAY, lease_size=2, key_prefix=unique("fapi")
    )
    app = FastAPI()

    @app.get("/", dependencies=[Depends(limit(limiter, key=by_user, group="g"))])
    async def home() -> str:
        return "ok"

    with TestClient(app) as client:
        codes = [client.get("/", headers={"x-user": "ann"}).status_code for _ in range(6)]
    assert codes == [200] * 4 + [429] * 2
    assert limiter.inspect("g:ann")["admitted"] == 4
    limiter.close()


def test_tier_from_the_request_picks_the_plan() -> None:
    # A limiter of the dependency's own, with plan tiers (limiter options by name).
    tiered = limit(
        "100/min",
        key=by_user,
        group="g",
        tier=lambda r: r.headers.get("x-plan"),
        tiers="free=2/min; pro=3/min, 5/hour",
        default_tier="free",
    )
    fixed = limit(tiered.limiter, key=by_user, group="f", tier="pro")
    app = FastAPI()

    @app.get("/", dependencies=[Depends(tiered)])
    async def home() -> str:
        return "ok"

    @app.get("/pro")
    async def pro(d: Annotated[Decision | None, Depends(fixed)]) -> dict[str, object]:
        return {"rule": d.rule if d else None, "rules": d.rules if d else None}

    with TestClient(app) as client:
        plan = [client.get("/", headers={"x-user": "ann", "x-plan": "pro"}) for _ in range(4)]
        assert [r.status_code for r in plan] == [200, 200, 200, 429]
        assert plan[0].headers["ratelimit-policy"] == '"1min";q=3;w=60, "1hour";q=5;w=3600'
        assert plan[3].headers["ratelimit"].startswith('"1min";r=0;') and "retry-after" in plan[3].headers
        free = [client.get("/", headers={"x-user": "bob"}).status_code for _ in range(3)]
        assert free == [200, 200, 429]
        r = client.get("/pro", headers={"x-user": "cat"})
        assert r.json() == {"rule": 0, "rules": [[3, 60_000], [5, 3_600_000]]}
        with pytest.raises(ConfigError, match='unknown tier "gold"'):
            client.get("/", headers={"x-user": "dan", "x-plan": "gold"})
    assert tiered.limiter.inspect("g:ann")["tier"] == "pro"
    assert tiered.limiter.inspect("f:cat")["policy_source"] == "tier pro (assigned by caller, defined in config)"
    tiered.limiter.close()


def test_bad_input_is_a_typed_error_when_the_route_is_defined() -> None:
    with pytest.raises(ConfigError, match="rate"):
        limit("10/fortnight")
    with pytest.raises(ConfigError, match="lease_sise"):
        limit("10/min", lease_sise=3)
    with pytest.raises(TypeError, match="rate must be a str"):
        limit(10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not with a Limiter"):
        limit(Limiter(rate="1/s"), url="redis://127.0.0.1:1")
    with pytest.raises(InvalidCostError):
        limit("10/min", cost=0)
    with pytest.raises(TypeError, match="cost"):
        limit("10/min", cost="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        limit("10/min", key="x-api-key")  # type: ignore[arg-type]


# --- over real HTTP ---------------------------------------------------------


@pytest.fixture
def served() -> Iterator[int]:
    app, _ = make_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn to start", lambda: server.started or not thread.is_alive())
        assert server.started, "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive()


def test_over_real_http_with_uvicorn(served: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served, timeout=30)
    results = []
    for _ in range(4):
        conn.request("GET", "/search?q=y", headers={"x-user": "ann"})
        r = conn.getresponse()
        results.append((r.status, r.getheader("RateLimit"), r.getheader("Retry-After"), r.read()))
    conn.close()
    assert [s for s, *_ in results] == [200, 200, 200, 429]
    assert json.loads(results[0][3]) == {"q": "y"}
    assert results[0][1] is not None and results[0][1].startswith('"default";r=2;')
    assert results[0][2] is None
    assert results[3][1] is not None and results[3][1].startswith('"default";r=0;')
    assert results[3][2] is not None and int(results[3][2]) >= 1


def test_limit_wait_ms_waits_for_the_refill() -> None:
    from fastapi.testclient import TestClient

    app = FastAPI()
    waiting = limit(Limiter(limit=2, window_ms=1000, lease_size=1), key=lambda request: "k", wait_ms=30_000)

    @app.get("/", dependencies=[Depends(waiting)])
    async def home() -> str:
        return "ok"

    with TestClient(app) as client:
        assert [client.get("/").status_code for _ in range(3)] == [200, 200, 200]
    with pytest.raises(TypeError, match="wait_ms"):
        limit("1/s", wait_ms=1.5)  # type: ignore[arg-type]
