"""gunicorn settings for test_gunicorn.py: every worker uses the inherited
limiter once at start-up and reports what it saw."""

from __future__ import annotations

import json
import os
from typing import Any


def post_worker_init(worker: Any) -> None:
    import gunicorn_app

    d = gunicorn_app.limiter.acquire("shared")
    report = {"pid": os.getpid(), "allowed": d.allowed, "metrics": gunicorn_app.limiter.metrics()}
    path = os.path.join(os.environ["QL_OUT"], f"worker-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.rename(path + ".tmp", path)
