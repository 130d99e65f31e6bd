"""The package README's examples work when copied: each ```python block of
bindings/python/README.md runs as written; so does the project README's Python example."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from conftest import ROOT


def blocks() -> list[str]:
    text = (ROOT / "bindings" / "python" / "README.md").read_text()
    found = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(found) == 16, (
        "expected the quick start, the FastAPI middleware, Flask, the FastAPI dependency, Django, gRPC,"
        " OpenTelemetry, plan tiers, the policy store, the integrations' tier examples, behind a proxy,"
        " check(), the metrics endpoint, reserve then settle (sync, asyncio), and concurrency limits"
    )
    return found


def run(code: str, name: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(code, f"README.md:{name}", "exec"), ns)
    return ns


def check_admits_the_limit(get: Callable[[], int], per_minute: int) -> None:
    """Requests until the first 429: the limit is admitted, plus at most what
    refilled meanwhile (100/min refills a token every 0.6 s of a slow run)."""
    start = time.monotonic()
    codes = []
    while not codes or codes[-1] != 429:
        codes.append(get())
        assert len(codes) < 10 * per_minute, "never denied"
    refilled = math.ceil((time.monotonic() - start) * per_minute / 60)
    assert set(codes[:-1]) == {200}
    assert per_minute <= len(codes) - 1 <= per_minute + refilled


def test_no_performance_table_calls_a_fixed_lease_size_the_default() -> None:
    """An unset lease_size is adaptive leasing: the benchmark tables and the scripts
    that write them never label a fixed lease size "the default lease_size (20)"."""
    files = [
        "bindings/python/README.md",
        "bindings/node/README.md",
        "docs/benchmarks.md",
        "bindings/python/bench/bench_acquire.py",
        "bindings/node/bench/acquire.js",
    ]
    for name in files:
        text = (ROOT / name).read_text()
        found = re.findall(r"default lease_?size \(\d+\)", text, re.I)
        assert not found, f"{name}: {found}"
    # The scripts' default rows give no lease size, as the label says.
    bench = (ROOT / "bindings/python/bench/bench_acquire.py").read_text()
    assert 'dflt = quotalease.Limiter("memory://", limit=big, window_ms=window_ms)\n' in bench
    assert "default (adaptive leases)" in bench


def test_examples_pass_mypy_strict(tmp_path: Path) -> None:
    """What a user's mypy --strict says of the examples, against the shipped stubs.
    Left out: Django's (django-stubs needs its plugin and a settings module), gRPC's
    and OpenTelemetry's (their packages' own typing)."""
    checked = {
        0: "quick",
        1: "fastapi",
        2: "flask",
        3: "dependency",
        7: "tiers",
        8: "store",
        9: "tier_option",
        13: "reserve",
        14: "reserve_async",
    }
    found = blocks()
    files = []
    for index, name in checked.items():
        path = tmp_path / f"readme_{name}.py"
        path.write_text(found[index])
        files.append(str(path))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_quick_start() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(blocks()[0], "readme_quickstart")
    lines = out.getvalue().splitlines()
    assert lines[:6] == [
        "0 True 4 lease",
        "1 True 3 lease",
        "2 True 2 lease",
        "3 True 1 lease",
        "4 True 0 lease",
        "5 False 0 exhausted",
    ]
    # One token of 5/min refills in 12 s; a millisecond may pass between the
    # denial and this line, so the wait is at most 12 s, never the exact figure.
    decision = re.fullmatch(
        r"Decision\(allowed=False, reason='exhausted', limit=5, remaining=0, "
        r"retry_after_ms=(\d+), reset_after_ms=(\d+), window_ms=60000\)",
        lines[6],
    )
    assert decision is not None, lines[6]
    assert 11_000 < int(decision[1]) <= 12_000
    assert 59_000 < int(decision[2]) <= 60_000
    assert lines[7].startswith("{'RateLimit-Policy': '\"default\";q=5;w=60', 'RateLimit': ")
    assert lines[7].endswith("'Retry-After': '12'}")


def test_fastapi_example() -> None:
    app = run(blocks()[1], "readme_fastapi")["app"]
    with TestClient(app) as client:
        assert client.get("/").json() == {"hello": "world"}
        r = client.get("/search", params={"q": "x"})
        assert r.json() == {"q": "x", "allowed": True, "remaining": 97}
        assert r.headers["ratelimit-policy"] == '"default";q=100;w=60'
        check_admits_the_limit(lambda: client.get("/", headers={"x-api-key": "k1"}).status_code, 100)


def test_flask_example() -> None:
    app = run(blocks()[2], "readme_flask")["app"]
    client = app.test_client()
    r = client.get("/")
    assert r.data == b"hello" and "RateLimit" in r.headers
    check_admits_the_limit(lambda: client.get("/", headers={"X-Api-Key": "k1"}).status_code, 100)


def test_fastapi_dependency_example() -> None:
    app = run(blocks()[3], "readme_fastapi_dependency")["app"]
    with TestClient(app) as client:
        codes = [client.get("/search", params={"q": "x"}, headers={"x-api-key": "k1"}).status_code for _ in range(11)]
        assert codes == [200] * 10 + [429]
        assert client.get("/search", params={"q": "x"}).json() == {"q": "x"}  # no key: not limited
        assert client.get("/export", headers={"x-api-key": "k1"}).json() == {"remaining": 1}
        assert client.get("/export", headers={"x-api-key": "k1"}).json() == {"remaining": 0}
        denied = client.get("/export", headers={"x-api-key": "k1"})
        assert denied.status_code == 429 and "retry-after" in denied.headers


DJANGO_DRIVER = """
import importlib, json, sys
import django
sys.path.insert(0, ".")
importlib.import_module("app")  # ROOT_URLCONF is the module's own name
django.setup()
from django.test import Client
c = Client()
out = []
for _ in range(4):
    r = c.get("/search", {"q": "x"}, headers={"X-Api-Key": "k1"})
    out.append([r.status_code, r.headers.get("RateLimit", ""), r.content.decode()])
print(json.dumps(out))
"""


def test_django_example(tmp_path: Path) -> None:
    # A process of its own: the example calls settings.configure(), once per process.
    app = tmp_path / "app.py"
    app.write_text(blocks()[4])
    out = subprocess.run(
        [sys.executable, "-c", DJANGO_DRIVER], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert [code for code, _, _ in results] == [200, 200, 200, 429]
    assert json.loads(results[0][2]) == {"q": "x", "remaining": 2}
    assert results[0][1].startswith('"default";r=2;')  # the view's limit: its headers win
    assert json.loads(results[3][2])["title"] == "Too Many Requests"


def test_grpc_example() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(blocks()[5], "__main__")
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["0 b'hello ann'", "1 b'hello ann'", "2 b'hello ann'"]
    assert lines[3].startswith("3 StatusCode.RESOURCE_EXHAUSTED {")
    assert "'retry-after':" in lines[3] and "'ratelimit': '\"default\";r=0;" in lines[3]


def test_otel_example() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(blocks()[6], "readme_otel")
    assert sorted(out.getvalue().splitlines()) == ["quotalease_admitted 2", "quotalease_denied 1"]


def printed(code: str, name: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run(code, name)
    return out.getvalue().splitlines()


def test_tiers_example() -> None:
    lines = printed(blocks()[7], "readme_tiers")
    assert lines[:8] == [
        "2",
        "0 True 3 2 0",
        "1 True 3 1 0",
        "2 True 3 0 0",
        "3 False 3 0 0",
        "0 True 5 1 1",
        "1 True 5 0 1",
        "2 False 5 0 1",
    ]
    assert lines[8] == "((3, 1000), (5, 60000))"
    headers = ast.literal_eval(lines[9])  # the printed dict
    assert headers["RateLimit-Policy"] == '"1s";q=3;w=1, "1min";q=5;w=60'
    assert headers["RateLimit"].startswith('"1min";r=0;t=') and int(headers["Retry-After"]) >= 1
    assert lines[10:] == ["tier pro (assigned by caller, defined in config)"]


def test_policy_store_example() -> None:
    assert printed(blocks()[8], "readme_store") == [
        "((10000, 60000), (2000000, 86400000))",
        "own rules (from store)",
        "tier:pro",
        "{'pro': '10000/min, 2000000/day'} {'user:42': 'tier:pro', 'user:666': '1/min'}",
        "{'rules': ((6000, 60000),), 'defined_by': 'config'}",
    ]


def test_tiers_in_the_integrations_example() -> None:
    app = run(blocks()[9], "readme_tier_option")["app"]
    with TestClient(app) as client:
        ann = {"x-api-key": "key-of-ann"}
        r = client.get("/", headers=ann)
        assert r.status_code == 200 and r.headers["ratelimit-policy"] == '"1min";q=100;w=60, "1day";q=1000;w=86400'
        free = [client.get("/", headers={"x-api-key": "bob"}) for _ in range(3)]
        assert [f.status_code for f in free] == [200, 200, 429]
        assert free[0].headers["ratelimit-policy"] == '"default";q=2;w=60'
        # the per-route limit's own tiers: pro 10/hour, and the route's rate, 1/day, for
        # the others; its fields are the only ones on the response
        export = client.get("/export", headers=ann)
        assert export.json() == {"export": "done"}
        assert export.headers.get_list("ratelimit-policy") == ['"default";q=10;w=3600']
        cat = client.get("/export", headers={"x-api-key": "cat"})
        assert cat.status_code == 200
        assert cat.headers.get_list("ratelimit-policy") == ['"default";q=1;w=86400']
        denied = client.get("/export", headers={"x-api-key": "cat"})
        assert denied.status_code == 429 and "retry-after" in denied.headers
        assert denied.headers.get_list("ratelimit-policy") == ['"default";q=1;w=86400']  # the route's 1/day


def project_readme_block(heading: str, lang: str) -> str:
    """The first ```lang block under `### heading` of the project README.md."""
    text = (ROOT / "README.md").read_text()
    section = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^##)", text, re.S | re.M)
    assert section, f"README.md has no '### {heading}' section"
    found = re.search(rf"```{lang}\n(.*?)```", section.group(1), re.S)
    assert found, f"README.md's '### {heading}' has no ```{lang} block"
    return found.group(1)


def test_project_readme_python_quick_start() -> None:
    """The project README's Python example (memory://, 5/min) runs as written."""
    lines = printed(project_readme_block("Python", "python"), "project_readme_python")
    assert lines[:6] == [
        "0 True 4 lease",
        "1 True 3 lease",
        "2 True 2 lease",
        "3 True 1 lease",
        "4 True 0 lease",
        "5 False 0 exhausted",
    ]
    headers = ast.literal_eval(lines[6])
    assert headers["RateLimit-Policy"] == '"default";q=5;w=60' and int(headers["Retry-After"]) >= 1


def test_project_readme_shadow_mode() -> None:
    """The project README's shadow-mode example runs as written and says what it claims."""
    lines = printed(project_readme_block("Shadow mode", "python"), "project_readme_shadow")
    assert lines == ["['lease', 'lease', 'lease', 'lease', 'lease', 'shadow']", "1"]


def test_project_readme_bounded_wait() -> None:
    """The project README's bounded-wait example runs as written and prints what it says."""
    lines = printed(project_readme_block("Waiting instead of denying", "python"), "project_readme_wait")
    assert lines == ["[True, True]", "True", "True"]


def test_project_readme_reserve_then_settle() -> None:
    """The project README's reserve-then-settle example runs as written: the key
    keeps what the settled request did not use (10000 - 1234)."""
    lines = printed(project_readme_block("Reserve, then settle", "python"), "project_readme_reserve")
    assert lines == ["True"]


def test_project_readme_calendar_quotas() -> None:
    """The project README's calendar-quota example runs as written, on a manual
    clock set to 22:00 UTC: 50 of 60 admitted, denied until Berlin's midnight an
    hour away, admitted again once the clock crosses it."""
    lines = printed(project_readme_block("Calendar quotas", "python"), "project_readme_calendar")
    assert lines == ["50", "False 3600000", "True"]


def test_project_readme_concurrency_limits() -> None:
    """The project README's concurrency-limit example runs as written on
    memory://: 5 permits of user:42 taken, the sixth denied, and once they are
    released (leaving the blocks) one is taken again."""
    lines = printed(project_readme_block("Concurrency limits", "python"), "project_readme_concurrency")
    assert lines == ["True 4", "[True, True, True, True, False]", "True"]


def test_behind_a_proxy_example() -> None:
    ns = run(blocks()[10], "readme_proxies")
    xff = "6.6.6.6, 1.2.3.4"
    scope = {"type": "http", "client": ("10.0.0.5", 1), "headers": [(b"x-forwarded-for", xff.encode())]}
    assert ns["asgi"].rule.key(scope) == "1.2.3.4"
    assert ns["asgi"].rule.key({**scope, "client": ("203.0.113.9", 1)}) == "203.0.113.9"  # not trusted
    assert ns["wsgi"].rule.key({"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": xff}) == "1.2.3.4"
    assert ns["search_limit"].rule.key.__name__ == "key"  # the client's address behind one hop


def test_check_example() -> None:
    run(blocks()[11], "readme_check")


def test_metrics_endpoint_example() -> None:
    """Two limiters on one /metrics: a real Prometheus parser reads it with no
    repeated family, and the middleware does not limit the scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    ns = run(blocks()[12], "readme_metrics")
    with TestClient(ns["app"]) as client:
        for _ in range(3):
            r = client.get("/metrics")
            assert r.status_code == 200
            assert "ratelimit" not in r.headers, "the scrape was rate-limited"
    families = list(text_string_to_metric_families(r.text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names
    admitted = next(f for f in families if f.name == "quotalease_admitted")
    assert {s.labels["limiter"] for s in admitted.samples} == {"site", "login"}


def test_reserve_then_settle_example() -> None:
    assert printed(blocks()[13], "readme_reserve") == ["True True False"]


def test_reserve_async_example() -> None:
    assert printed(blocks()[14], "readme_reserve_async") == ["200"]


def test_concurrency_limits_example() -> None:
    """Two permits of 2 taken, the third denied; leaving the block released both."""
    assert printed(blocks()[15], "readme_concurrency") == ["True True False 250", "True True"]
