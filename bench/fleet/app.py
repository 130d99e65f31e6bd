"""Case (b) of make bench-fleet: a FastAPI app behind quotalease's ASGI middleware.

Run under gunicorn with uvicorn workers; every worker builds its own Limiter on
one Redis key ("fleet"). Environment: FLEET_URL, FLEET_PREFIX, FLEET_LIMIT,
FLEET_WINDOW_MS, FLEET_LEASE_SIZE (empty: adaptive leasing), FLEET_OUT (a
directory). A worker writes ready-python-PID when it serves, and at shutdown
python-PID.json: its metrics when the shutdown began ("metrics") and after
close() ("metrics_closed"), and [unix second, backend_calls, admitted] at each
whole second ("per_second"). /health is not limited.
"""

import asyncio
import json
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from quotalease import Limiter
from quotalease.asgi import RateLimitMiddleware

OUT = Path(os.environ["FLEET_OUT"])
lease = os.environ.get("FLEET_LEASE_SIZE", "")
limiter = Limiter(
    os.environ["FLEET_URL"],
    limit=int(os.environ["FLEET_LIMIT"]),
    window_ms=int(os.environ["FLEET_WINDOW_MS"]),
    lease_size=int(lease) if lease else None,
    key_prefix=os.environ["FLEET_PREFIX"],
)
per_second: list[list[int]] = []


async def sample() -> None:
    # [unix second, backend_calls, admitted] at each whole second of the wall clock.
    while True:
        await asyncio.sleep(1 - time.time() % 1)
        m = limiter.metrics()
        per_second.append([round(time.time()), m["backend_calls"], m["admitted"]])


@asynccontextmanager
async def lifespan(_app: FastAPI):
    task = asyncio.create_task(sample())
    (OUT / f"ready-python-{os.getpid()}").touch()
    yield
    task.cancel()
    run = limiter.metrics()
    limiter.close()
    record = {"lang": "python", "pid": os.getpid(), "metrics": run, "metrics_closed": limiter.metrics()}
    record["per_second"] = per_second
    (OUT / f"python-{os.getpid()}.json").write_text(json.dumps(record))


def key(request) -> str | None:
    return None if request.url.path == "/health" else "fleet"


app = FastAPI(lifespan=lifespan)
app.add_middleware(RateLimitMiddleware, limiter=limiter, key=key)


@app.get("/", response_class=PlainTextResponse)
async def index() -> str:
    return "ok\n"


@app.get("/health", response_class=PlainTextResponse)
async def health() -> str:
    return "ok\n"
