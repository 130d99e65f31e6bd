"""The grpcio interceptors' ``tier`` option (issue 15) on real grpcio servers
over loopback (sync grpc.server and grpc.aio.server) with limiters that have
plan tiers: a tier from the call's metadata or a fixed one picks the plan, the
trailers list every rule, an unknown tier is INTERNAL with a fixed message (the core's
error goes to the log)."""

from __future__ import annotations

from concurrent import futures

import grpc
import grpc.aio
import pytest

from quotalease import Limiter
from quotalease.grpc import AsyncRateLimitInterceptor, Call, RateLimitInterceptor, metadata_key

SERVICE = "test.Plans"
PLANS = "free=2/min; pro=3/min, 5/hour"


def plan_of(call: Call) -> str | None:
    return call.metadata.get("x-plan")  # None: the default tier


def hello(request: bytes, context: grpc.ServicerContext) -> bytes:
    return b"hello " + request


def outcomes(say: grpc.UnaryUnaryMultiCallable, metadata: list[tuple[str, str]], n: int) -> list[str]:
    out = []
    for _ in range(n):
        try:
            say(b"x", metadata=metadata)
            out.append("ok")
        except grpc.RpcError as e:
            out.append(e.code().name)  # type: ignore[attr-defined]
    return out


def test_sync_tier_from_metadata_picks_the_plan(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(limit=100, window_ms=60_000, tiers=PLANS, default_tier="free")
    interceptor = RateLimitInterceptor(limiter, key=metadata_key("x-api-key"), tier=plan_of)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[interceptor])
    handler = grpc.unary_unary_rpc_method_handler(hello)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Hello": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            say = channel.unary_unary(f"/{SERVICE}/Hello")
            pro = [("x-api-key", "ann"), ("x-plan", "pro")]
            _, call = say.with_call(b"x", metadata=pro)
            trailers = dict(call.trailing_metadata())
            assert trailers["ratelimit-policy"] == '"1min";q=3;w=60, "1hour";q=5;w=3600'
            assert trailers["ratelimit"].startswith('"1min";r=2;')
            assert outcomes(say, pro, 3) == ["ok", "ok", "RESOURCE_EXHAUSTED"]
            assert outcomes(say, [("x-api-key", "bob")], 3) == ["ok", "ok", "RESOURCE_EXHAUSTED"]
            with pytest.raises(grpc.RpcError) as err:
                say(b"x", metadata=[("x-api-key", "cat"), ("x-plan", "gold")])
            assert err.value.code() == grpc.StatusCode.INTERNAL  # type: ignore[attr-defined]
            assert err.value.details() == "rate limiter error"  # type: ignore[attr-defined]
            logged = [r.getMessage() for r in caplog.records if r.name == "quotalease.grpc"]
            assert any('unknown tier "gold" (known tiers: ' in m for m in logged), logged
    finally:
        server.stop(None)
    assert limiter.inspect("ann")["tier"] == "pro" and limiter.inspect("bob")["tier"] == "free"


async def test_aio_fixed_tier() -> None:
    limiter = Limiter(limit=100, window_ms=60_000, tiers=PLANS)
    interceptor = AsyncRateLimitInterceptor(limiter, key=metadata_key("x-api-key"), tier="pro")
    server = grpc.aio.server(interceptors=[interceptor])

    async def aio_hello(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b"hello " + request

    handler = grpc.unary_unary_rpc_method_handler(aio_hello)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Hello": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            say = channel.unary_unary(f"/{SERVICE}/Hello")
            for _ in range(3):
                assert await say(b"x", metadata=[("x-api-key", "ann")]) == b"hello x"
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await say(b"x", metadata=[("x-api-key", "ann")])
            assert denied.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(denied.value.trailing_metadata())
            assert trailers["ratelimit-policy"] == '"1min";q=3;w=60, "1hour";q=5;w=3600'
            assert trailers["ratelimit"].startswith('"1min";r=0;') and int(trailers["retry-after"]) >= 1
    finally:
        await server.stop(None)
    assert limiter.inspect("ann")["admitted"] == 3 and limiter.inspect("ann")["tier"] == "pro"
