"""The cross-language conformance vectors (tests/vectors/README.md), played
against memory:// and a real redis-server, through the sync API and through
acquire_async: every decision must match the file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import PATIENT, VECTORS, RedisServer, unique
from quotalease import (
    BackendError,
    ClosedError,
    ConfigError,
    Decision,
    InvalidCostError,
    InvalidKeyError,
    Limiter,
    ReservationError,
)

KINDS = {
    ConfigError: "config",
    InvalidKeyError: "invalid_key",
    InvalidCostError: "invalid_cost",
    ClosedError: "closed",
    BackendError: "backend",
    ReservationError: "reservation",
}

FILES = sorted(VECTORS.glob("*.json"))


def kind_of(e: BaseException) -> str:
    for cls, name in KINDS.items():
        if type(e) is cls:
            return name
    raise AssertionError(f"not a quotalease error: {e!r}")


def key_of(step: dict[str, Any]) -> str:
    k = step.get("key", "k")
    if isinstance(k, dict):
        return str(k["repeat"]) * int(k["times"])
    return str(k)


def check_decision(ctx: str, d: Decision, expect: dict[str, Any]) -> None:
    assert isinstance(d, Decision), ctx
    for field, want in expect.items():
        assert getattr(d, field) == want, f"{ctx}: field {field} of {d!r}"


class Runner:
    def __init__(self, path: Path, backend: str, redis_url: str | None, use_async: bool) -> None:
        self.v = json.loads(path.read_text())
        self.backend = backend
        self.use_async = use_async
        ns = unique("v")
        self.url = redis_url or f"memory://{self.v['name']}-{ns}"
        self.ns = ns
        self.base: dict[str, Any] = dict(self.v.get("config", {}))
        n = int(self.v.get("instances", 1))
        self.limiters = [self.build(self.base) for _ in range(n)]

    def build(self, cfg: dict[str, Any]) -> Limiter:
        # A generous backend timeout unless the vector sets one: a loaded
        # machine must not turn a slow lease into a different decision.
        opts: dict[str, Any] = {"key_prefix": self.ns, "clock": "manual", "backend_timeout_ms": PATIENT, **cfg}
        url = opts.pop("url", self.url)
        return Limiter(url, **opts)

    def settle(self) -> None:
        for lim in self.limiters:
            try:
                lim.settle()
            except ClosedError:
                pass

    async def acquire(self, lim: Limiter, key: str, cost: int, tier: str | None) -> Decision:
        if self.use_async:
            return await lim.acquire_async(key, cost, tier=tier)
        return lim.acquire(key, cost, tier=tier)

    async def run(self) -> int:
        checked = 0
        name = self.v["name"]
        for i, step in enumerate(self.v["steps"]):
            only = step.get("only")
            if only and only != self.backend:
                continue
            ctx = f"{name} [{self.backend}{' async' if self.use_async else ''}] step {i} {step}"
            lim = self.limiters[int(step.get("instance", 0))]
            cost = int(step.get("cost", 1))
            tier = step.get("tier")
            op = step["op"]
            expect_error = step.get("expect_error")
            outcome: Any = None
            try:
                if op == "acquire":
                    outcome = await self.acquire(lim, key_of(step), cost, tier)
                elif op == "try_acquire":
                    outcome = lim.try_acquire(key_of(step), cost, tier=tier)
                elif op == "acquire_n":
                    allowed = denied = 0
                    for _ in range(int(step["count"])):
                        if await self.acquire(lim, key_of(step), cost, tier):
                            allowed += 1
                        else:
                            denied += 1
                        self.settle()
                    assert {"allowed": allowed, "denied": denied} == step["expect"], ctx
                elif op == "advance":
                    for each in self.limiters:
                        each.advance_clock(int(step["ms"]))
                elif op == "settle":
                    pass
                elif op == "policy_set_tier":
                    outcome = lim.policy_set_tier(step["name"], step["rules"])
                elif op == "policy_delete_tier":
                    outcome = lim.policy_delete_tier(step["name"])
                elif op == "policy_assign":
                    outcome = lim.policy_assign(key_of(step), step["assignment"])
                elif op == "policy_unassign":
                    outcome = lim.policy_unassign(key_of(step))
                elif op == "set_limit":
                    lim.set_limit(key_of(step), int(step["limit"]), int(step["window_ms"]))
                elif op == "flush":
                    lim.flush()
                elif op == "close":
                    lim.close()
                elif op == "metrics":
                    m = lim.metrics()
                    for k, want in step["expect"].items():
                        assert k in m, f"{ctx}: unknown metric {k}"
                        assert m[k] == want, f"{ctx}: metric {k} of {m}"
                elif op == "new":
                    self.build({**self.base, **step["config"]}).close()
                    raise AssertionError(f"{ctx}: expected error {expect_error}, built a limiter")
                else:
                    raise AssertionError(f"{ctx}: unknown op {op}")
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001 - compared by kind below
                assert expect_error is not None, f"{ctx}: unexpected error {e!r}"
                assert kind_of(e) == expect_error, f"{ctx}: {e!r}"
            else:
                if expect_error is not None and op not in ("new",):
                    raise AssertionError(f"{ctx}: expected error {expect_error}, got {outcome!r}")
                if op in ("acquire", "try_acquire"):
                    check_decision(ctx, outcome, step["expect"])
                if op.startswith("policy_"):
                    # A store write answers the store's version, which every write raises.
                    assert isinstance(outcome, int) and outcome >= 1, f"{ctx}: version {outcome!r}"
            self.settle()
            checked += 1
        for lim in self.limiters:
            lim.close()
        return checked


def test_there_are_vectors() -> None:
    assert len(FILES) >= 24
    # The tier and policy-store vectors (22-24) use every op this runner plays.
    ops = {step["op"] for f in FILES for step in json.loads(f.read_text())["steps"]}
    assert {"policy_set_tier", "policy_delete_tier", "policy_assign", "policy_unassign"} <= ops


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_vector_memory(path: Path, use_async: bool) -> None:
    checked = asyncio.run(Runner(path, "memory", None, use_async).run())
    assert checked > 0


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_vector_redis(path: Path, use_async: bool, redis_server: RedisServer) -> None:
    checked = asyncio.run(Runner(path, "redis", redis_server.url, use_async).run())
    assert checked > 0
