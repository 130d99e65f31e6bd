"""The package README's examples work when copied: each ```python block of
bindings/python/README.md runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from starlette.testclient import TestClient

from conftest import ROOT


def blocks() -> list[str]:
    text = (ROOT / "bindings" / "python" / "README.md").read_text()
    found = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(found) == 3, "expected the quick start, the FastAPI and the Flask example"
    return found


def run(code: str, name: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(code, f"README.md:{name}", "exec"), ns)
    return ns


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
    assert lines[6].startswith(
        "Decision(allowed=False, reason='exhausted', limit=5, remaining=0, retry_after_ms=12000,"
    )
    assert lines[7].startswith("{'RateLimit-Policy': '\"default\";q=5;w=60', 'RateLimit': ")
    assert lines[7].endswith("'Retry-After': '12'}")


def test_fastapi_example() -> None:
    app = run(blocks()[1], "readme_fastapi")["app"]
    with TestClient(app) as client:
        assert client.get("/").json() == {"hello": "world"}
        r = client.get("/search", params={"q": "x"})
        assert r.json() == {"q": "x", "allowed": True, "remaining": 97}
        assert r.headers["ratelimit-policy"] == '"default";q=100;w=60'
        codes = [client.get("/", headers={"x-api-key": "k1"}).status_code for _ in range(101)]
        assert codes.count(200) == 100 and codes[-1] == 429


def test_flask_example() -> None:
    app = run(blocks()[2], "readme_flask")["app"]
    client = app.test_client()
    r = client.get("/")
    assert r.data == b"hello" and "RateLimit" in r.headers
    codes = [client.get("/", headers={"X-Api-Key": "k1"}).status_code for _ in range(101)]
    assert codes.count(200) == 100 and codes[-1] == 429
