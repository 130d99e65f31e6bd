"""Django: quotalease.django's middleware and @ratelimit decorator on a real
Django (settings.configure here, this module is the URLconf), through Django's
test Client and AsyncClient."""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import quote

import django
import pytest
from django.conf import settings

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

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.test import AsyncClient, Client, RequestFactory, override_settings  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.debug import ExceptionReporter  # noqa: E402

from conftest import DAY, PATIENT, RedisServer, check_problem, unique  # noqa: E402
from quotalease import ConfigError, Decision, Limiter, http_key  # noqa: E402
from quotalease.django import ratelimit, ratelimit_decision  # noqa: E402

MIDDLEWARE = ["quotalease.django.RateLimitMiddleware"]
calls: list[str] = []


def home(request: HttpRequest) -> HttpResponse:
    calls.append("home")
    d = getattr(request, "ratelimit", None)
    return JsonResponse({"remaining": d.remaining if d else None}, headers={"X-App": "1"})


def upload(request: HttpRequest) -> HttpResponse:
    return HttpResponse("stored")


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def async_home(request: HttpRequest) -> HttpResponse:
    calls.append("async_home")
    return HttpResponse("async")


@ratelimit(rate="3/min", key="header:X-User")
def search(request: HttpRequest) -> HttpResponse:
    calls.append("search")
    return HttpResponse("found")


@ratelimit(rate="3/min", key="header:X-User")
def other(request: HttpRequest) -> HttpResponse:
    return HttpResponse("other")


@ratelimit(rate="2/min", key="header:X-User")
async def async_search(request: HttpRequest) -> HttpResponse:
    calls.append("async_search")
    return HttpResponse("found async")


@ratelimit(rate="1/min", key=lambda request: "everyone", block=False)
def soft(request: HttpRequest) -> HttpResponse:
    d: Decision = request.ratelimit  # type: ignore[attr-defined]
    return HttpResponse("full" if d.allowed else "degraded")


def teapot(request: HttpRequest, decision: Decision) -> HttpResponse:
    return HttpResponse(f"later, {decision.reason}", status=418)


@ratelimit(rate="1/min", key="ip", denied=teapot, group="shared-report")
def report_a(request: HttpRequest) -> HttpResponse:
    return HttpResponse("a")


@ratelimit(rate="1/min", key="ip", group="shared-report")
def report_b(request: HttpRequest) -> HttpResponse:
    return HttpResponse("b")


def plan_of(request: HttpRequest) -> str | None:
    return request.headers.get("X-Plan")  # None: the default tier


@ratelimit(rate="100/min", key="header:X-User", tier=plan_of)
def planned(request: HttpRequest) -> HttpResponse:
    return HttpResponse("planned")


def user_key(request: HttpRequest) -> str | None:
    return request.headers.get("X-User")


def upload_cost(request: HttpRequest) -> int:
    return 2 if request.method == "POST" else 1


def is_health(request: HttpRequest) -> bool:
    return request.path == "/health/"


urlpatterns = [
    path("", home),
    path("upload/", upload),
    path("health/", health),
    path("async/", async_home),
    path("search/", search),
    path("other/", other),
    path("async-search/", async_search),
    path("soft/", soft),
    path("report/a/", report_a),
    path("report/b/", report_b),
    path("planned/", planned),
]


def check_denied(r: Any) -> None:
    assert r.status_code == 429
    check_problem(r.headers["Content-Type"], r.content)
    assert int(r.headers["Retry-After"]) >= 1
    assert r.headers["RateLimit"].startswith('"default";r=0;t=')


# --- middleware -------------------------------------------------------------


def test_middleware_headers_429_key_cost_skip() -> None:
    conf = {"RATE": "3/min", "KEY": f"{__name__}.user_key", "COST": upload_cost, "SKIP": f"{__name__}.is_health"}
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        calls.clear()
        client = Client()
        for i in range(3):
            r = client.get("/", headers={"X-User": "ann"})
            assert r.status_code == 200 and r.headers["X-App"] == "1"
            assert r.json() == {"remaining": 2 - i}  # request.ratelimit is the decision
            assert r.headers["RateLimit-Policy"] == '"default";q=3;w=60'
            assert r.headers["RateLimit"].startswith(f'"default";r={2 - i};')
            assert "Retry-After" not in r.headers
        check_denied(client.get("/", headers={"X-User": "ann"}))
        assert calls == ["home"] * 3  # a denied request never reaches the view
        # No X-User: KEY returns None, not limited; SKIP: not limited.
        r = client.get("/")
        assert r.status_code == 200 and "RateLimit" not in r.headers
        for _ in range(5):
            h = client.get("/health/", headers={"X-User": "ann"})
            assert h.status_code == 200 and "RateLimit" not in h.headers
        # COST: a POST costs 2 of bob's 3.
        assert client.post("/upload/", headers={"X-User": "bob"}).status_code == 200
        assert client.post("/upload/", headers={"X-User": "bob"}).status_code == 429
        assert client.get("/upload/", headers={"X-User": "bob"}).status_code == 200
        # A 404 still carries the headers.
        nf = client.get("/missing/", headers={"X-User": "cat"})
        assert nf.status_code == 404 and "RateLimit" in nf.headers


def test_middleware_default_key_denial_handler_and_a_limiter_of_yours() -> None:
    limiter = Limiter(rate="2/min")
    conf = {"LIMITER": limiter, "DENIED": f"{__name__}.teapot"}
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        client = Client()
        codes = [client.get("/").status_code for _ in range(3)]
        assert codes == [200, 200, 418]
        r = client.get("/")
        assert r.content == b"later, exhausted" and "Retry-After" in r.headers
    assert limiter.inspect("127.0.0.1")["admitted"] == 2  # the default key is REMOTE_ADDR


def test_middleware_trusted_proxies_key_the_client_behind_the_balancer() -> None:
    limiter = Limiter(rate="1/min")
    conf = {"LIMITER": limiter, "TRUSTED_PROXIES": ["10.0.0.0/8"]}
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        lb = Client(REMOTE_ADDR="10.0.0.5")
        assert lb.get("/", HTTP_X_FORWARDED_FOR="1.2.3.4").status_code == 200
        assert lb.get("/", HTTP_X_FORWARDED_FOR="5.6.7.8").status_code == 200
        assert lb.get("/", HTTP_X_FORWARDED_FOR="6.6.6.6, 1.2.3.4").status_code == 429
        assert lb.get("/", HTTP_FORWARDED='for="[2001:db8::1]:80"').status_code == 200
        # Spoofed headers from an untrusted peer: its own address, every time.
        spoof = Client(REMOTE_ADDR="203.0.113.9")
        assert spoof.get("/", HTTP_X_FORWARDED_FOR="9.9.9.9").status_code == 200
        assert spoof.get("/", HTTP_X_FORWARDED_FOR="8.8.8.8").status_code == 429
        # Malformed: the peer's bucket, not an error.
        assert lb.get("/", HTTP_FORWARDED="for=unknown").status_code == 200
    assert limiter.inspect("10.0.0.5")["admitted"] == 1
    assert limiter.inspect("2001:db8::1")["admitted"] == 1
    hops = Limiter(rate="5/min")
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE={"LIMITER": hops, "TRUSTED_PROXIES": 2}):
        Client(REMOTE_ADDR="10.0.0.5").get("/", HTTP_X_FORWARDED_FOR="6.6.6.6, 1.2.3.4, 10.1.1.1")
    assert hops.inspect("1.2.3.4")["admitted"] == 1


def test_middleware_async_chain() -> None:
    async def run() -> list[int]:
        client = AsyncClient()
        out = []
        for _ in range(3):
            r = await client.get("/async/", headers={"X-User": "ann"})
            out.append(r.status_code)
            assert "RateLimit" in r.headers
        return out

    import asyncio

    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE={"RATE": "2/min", "KEY": "header:X-User"}):
        calls.clear()
        assert asyncio.run(run()) == [200, 200, 429]
        assert calls == ["async_home"] * 2


def test_middleware_on_redis(redis_server: RedisServer) -> None:
    conf = {
        "URL": redis_server.url,
        "RATE": "4/min",
        "KEY": "header:X-User",
        "OPTIONS": {"backend_timeout_ms": PATIENT, "key_prefix": unique("dj"), "lease_size": 2},
    }
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        client = Client()
        codes = [client.get("/", headers={"X-User": "ann"}).status_code for _ in range(6)]
    assert codes == [200] * 4 + [429] * 2


def test_password_entry_reaches_redis_and_never_the_error_reports(own_redis: RedisServer) -> None:
    # Django's error reports (the DEBUG page, the mails to ADMINS) list the settings
    # and hide entries by name only: QUOTALEASE['URL'] is shown, ['PASSWORD'] is not.
    password = "p@ss:w/rd %#-secret"
    own_redis.cli("ACL", "SETUSER", "djuser", "on", f">{password}", "~*", "+@all")
    conf = {
        "URL": f"redis://djuser@127.0.0.1:{own_redis.port}/0",
        "PASSWORD": password,
        "RATE": "2/min",
        "KEY": "header:X-User",
        # deny when Redis refuses the password: only a real login admits
        "OPTIONS": {"backend_timeout_ms": PATIENT, "lease_size": 1, "on_backend_failure": "deny"},
    }
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        client = Client()
        assert [client.get("/", headers={"X-User": "ann"}).status_code for _ in range(3)] == [200, 200, 429]
        try:
            raise RuntimeError("a view failed")
        except RuntimeError:
            report = ExceptionReporter(None, *sys.exc_info()).get_traceback_text()
    assert "QUOTALEASE" in report and f"redis://djuser@127.0.0.1:{own_redis.port}/0" in report
    assert "ss:w" not in report and quote(password, safe="") not in report


#: Limiter options for plan tiers (issue 15), by name as every option.
PLANS = {"tiers": "free=2/min; pro=3/min, 5/hour", "default_tier": "free"}


def test_middleware_tier_from_the_request_picks_the_plan() -> None:
    conf = {"RATE": "100/min", "KEY": "header:X-User", "TIER": plan_of, "OPTIONS": PLANS}
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        client = Client()
        pro = [client.get("/", headers={"X-User": "ann", "X-Plan": "pro"}) for _ in range(4)]
        assert [r.status_code for r in pro] == [200, 200, 200, 429]
        assert pro[0].headers["RateLimit-Policy"] == '"1min";q=3;w=60, "1hour";q=5;w=3600'
        assert pro[3].headers["RateLimit"].startswith('"1min";r=0;') and "Retry-After" in pro[3].headers
        assert [client.get("/", headers={"X-User": "bob"}).status_code for _ in range(3)] == [200, 200, 429]
        with pytest.raises(ConfigError, match='unknown tier "gold"'):
            client.get("/", headers={"X-User": "cat", "X-Plan": "gold"})
    # TIER as a tier's name: every request in that plan
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE={**conf, "TIER": "pro"}):
        client = Client()
        assert [client.get("/", headers={"X-User": "dan"}).status_code for _ in range(4)] == [200, 200, 200, 429]


def test_decorator_tier_with_tiers_from_the_settings_options() -> None:
    with override_settings(QUOTALEASE={"OPTIONS": PLANS}):
        client = Client()
        free = [client.get("/planned/", headers={"X-User": "ann"}) for _ in range(3)]
        assert [r.status_code for r in free] == [200, 200, 429]
        assert free[0].headers["RateLimit-Policy"] == '"default";q=2;w=60'
        pro = [client.get("/planned/", headers={"X-User": "bob", "X-Plan": "pro"}).status_code for _ in range(4)]
        assert pro == [200, 200, 200, 429]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({}, "needs QUOTALEASE\\['RATE'\\]"),
        ({"RATE": "5/min", "KYE": "ip"}, "unknown entries \\['KYE'\\]"),
        ({"RATE": "5/fortnight"}, "RATE '5/fortnight'"),
        ({"RATE": "5/min", "URL": "mysql://x"}, "URL"),
        ({"RATE": "5/min", "OPTIONS": {"lease_sise": 2}}, "lease_sise"),
        ({"RATE": "5/min", "KEY": "no.such.module.key"}, "cannot import"),
        ({"RATE": "5/min", "KEY": "header:"}, "header name"),
        ({"RATE": "5/min", "LIMITER": Limiter(rate="1/s")}, "not both"),
        ({"LIMITER": f"{__name__}.upload"}, "must be a quotalease.Limiter"),
        ({"RATE": "5/min", "PASSWORD": "pw"}, "goes with a redis://"),
        ({"RATE": "5/min", "URL": "redis://:a@h:1", "PASSWORD": "pw"}, "not both"),
        ({"RATE": "5/min", "URL": "redis://h:1", "PASSWORD": 5}, "non-empty str"),
        ({"RATE": "5/min", "TRUSTED_PROXIES": -1}, "TRUSTED_PROXIES.*hop count >= 0"),
        ({"RATE": "5/min", "TRUSTED_PROXIES": ["10.0.0.0/99"]}, "not an IP address or CIDR"),
        ({"RATE": "5/min", "TRUSTED_PROXIES": 2.5}, "hop count"),
        ({"RATE": "5/min", "WAIT_MS": -1}, "WAIT_MS"),
        ({"RATE": "5/min", "WAIT_MS": "1s"}, "WAIT_MS"),
    ],
)
def test_bad_settings_are_improperly_configured(conf: dict[str, Any], message: str) -> None:
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        with pytest.raises(ImproperlyConfigured, match=message):
            Client().get("/")


# --- decorator --------------------------------------------------------------


def test_decorator_limits_one_view_with_its_own_buckets() -> None:
    with override_settings(QUOTALEASE={}):  # fresh limiters for the decorators
        calls.clear()
        client = Client()
        codes = [client.get("/search/", headers={"X-User": "ann"}).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        assert calls == ["search"] * 3
        check_denied(client.get("/search/", headers={"X-User": "ann"}))
        r = client.get("/search/", headers={"X-User": "bob"})
        assert r.status_code == 200 and r.headers["RateLimit"].startswith('"default";r=2;')
        # Same rate, another view: another bucket (its group is its dotted name).
        assert client.get("/other/", headers={"X-User": "ann"}).status_code == 200
        # Without the header the key is None: not limited.
        assert [client.get("/search/").status_code for _ in range(5)] == [200] * 5
        # Not under the middleware: the plain view has no headers.
        assert "RateLimit" not in client.get("/health/").headers
        # group= shares a budget; denied= answers the denial.
        assert client.get("/report/a/").status_code == 200
        r = client.get("/report/b/")
        assert r.status_code == 429
        r = client.get("/report/a/")
        assert r.status_code == 418 and "Retry-After" in r.headers


def test_decorator_on_an_async_view_and_block_false() -> None:
    async def run() -> list[int]:
        client = AsyncClient()
        return [(await client.get("/async-search/", headers={"X-User": "ann"})).status_code for _ in range(3)]

    import asyncio

    with override_settings(QUOTALEASE={}):
        calls.clear()
        assert asyncio.run(run()) == [200, 200, 429]
        assert calls == ["async_search"] * 2
        client = Client()
        assert [client.get("/soft/").content for _ in range(2)] == [b"full", b"degraded"]


def test_decorator_uses_the_settings_url_and_options(redis_server: RedisServer) -> None:
    prefix = unique("djdec")
    conf = {"URL": redis_server.url, "OPTIONS": {"backend_timeout_ms": PATIENT, "key_prefix": prefix}}
    with override_settings(QUOTALEASE=conf):
        client = Client()
        codes = [client.get("/search/", headers={"X-User": "zed"}).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        limiter = Limiter(redis_server.url, rate="3/min", key_prefix=prefix, backend_timeout_ms=PATIENT)
        info = limiter.inspect(http_key(f"{__name__}.search:zed"))
        assert info["authority_tokens"] is not None  # the bucket is in Redis, under the view's group
        limiter.close()


def test_decorator_with_a_limiter_of_yours() -> None:
    limiter = Limiter(limit=2, window_ms=DAY)

    @ratelimit(limiter=limiter, key=lambda request: "k", group="mine")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("x")

    from django.test import RequestFactory

    rf = RequestFactory()
    assert [view(rf.get("/")).status_code for _ in range(3)] == [200, 200, 429]
    assert limiter.inspect("mine:k")["admitted"] == 2


def test_decorator_bad_input() -> None:
    with pytest.raises(ConfigError, match="rate"):
        ratelimit(rate="10/fortnight")
    with pytest.raises(TypeError, match="exactly one"):
        ratelimit()
    with pytest.raises(TypeError, match="exactly one"):
        ratelimit(rate="1/s", limiter=Limiter(rate="1/s"))
    with pytest.raises(TypeError, match="rate must be a str"):
        ratelimit(rate=10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limiter must be"):
        ratelimit(limiter="redis://x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be"):
        ratelimit(rate="1/s", key=42)  # type: ignore[arg-type]


def test_ratelimit_decision_is_the_requests_decision_typed() -> None:
    seen: list[Decision | None] = []

    @ratelimit(limiter=Limiter(rate="1/min"), key="header:X-User", block=False)
    def view(request: HttpRequest) -> HttpResponse:
        seen.append(ratelimit_decision(request))
        return HttpResponse("ok")

    factory = RequestFactory()
    for _ in range(2):
        view(factory.get("/", headers={"X-User": "ann"}))
    view(factory.get("/"))  # no X-User: not limited
    assert [None if d is None else d.allowed for d in seen] == [True, False, None]
    plain = factory.get("/")
    plain.ratelimit = "not a decision"
    assert ratelimit_decision(plain) is None


def test_middleware_wait_ms_waits_for_the_refill() -> None:
    conf = {"RATE": "2/s", "KEY": "header:X-User", "OPTIONS": {"lease_size": 1}, "WAIT_MS": 30_000}
    with override_settings(MIDDLEWARE=MIDDLEWARE, QUOTALEASE=conf):
        client = Client()
        codes = [client.get("/", headers={"X-User": "ann"}).status_code for _ in range(3)]
    assert codes == [200, 200, 200], "the third waited for the refill instead of a 429"
