"""quotalease.grpc's interceptors on real grpcio servers over loopback (sync
grpc.server and grpc.aio.server), with generic handlers on raw bytes (no
protoc): RESOURCE_EXHAUSTED with retry-after and ratelimit-* in the trailing
metadata, every kind of method limited once per call."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from conftest import DAY, PATIENT, RedisServer, unique
from quotalease import Decision, InvalidCostError, Limiter
from quotalease.grpc import AsyncRateLimitInterceptor, Call, RateLimitInterceptor, metadata_key, peer_address

SERVICE = "test.Echo"


def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.set_trailing_metadata((("x-app", "1"),))
    return b"echo:" + request


def count(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for i in range(int(request)):
        yield str(i).encode()


def total(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    return str(sum(len(r) for r in requests)).encode()


def bidi(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for r in requests:
        yield r.upper()


def handlers() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(echo),
            "Count": grpc.unary_stream_rpc_method_handler(count),
            "Total": grpc.stream_unary_rpc_method_handler(total),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
            "Health": grpc.unary_unary_rpc_method_handler(lambda request, context: b"SERVING"),
        },
    )


def serve(interceptor: grpc.ServerInterceptor) -> tuple[grpc.Server, grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[interceptor])
    server.add_generic_rpc_handlers((handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


def md(key: str) -> list[tuple[str, str]]:
    return [("x-api-key", key)]


def check_exhausted(err: Any) -> None:
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details().startswith("rate limited; retry after ")
    trailers = dict(err.trailing_metadata())
    assert int(trailers["retry-after"]) >= 1
    assert trailers["ratelimit"].startswith('"default";r=')
    assert trailers["ratelimit-policy"].startswith('"default";q=')
    # google.rpc.Status with a RetryInfo, decoded by the protobuf runtime (and, for a
    # sync call, by grpcio-status' from_call, which also checks code and message).
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    if isinstance(err, grpc.Call):
        assert rpc_status.from_call(err) == status
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert status.message == err.details()
    [detail] = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    delay_ms = info.retry_delay.seconds * 1000 + info.retry_delay.nanos // 1_000_000
    assert err.details() == f"rate limited; retry after {delay_ms} ms" and delay_ms > 0


def test_sync_unary_headers_and_resource_exhausted() -> None:
    limiter = Limiter(limit=3, window_ms=60_000)
    skip = lambda call: call.method.endswith("/Health")  # noqa: E731
    server, channel = serve(RateLimitInterceptor(limiter, key=metadata_key("x-api-key"), skip=skip))
    try:
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        for i in range(3):
            response, call = unary.with_call(b"hi", metadata=md("k1"))
            assert response == b"echo:hi"
            trailers = dict(call.trailing_metadata())
            assert trailers["x-app"] == "1"  # the handler's own trailers stay
            assert trailers["ratelimit-policy"] == '"default";q=3;w=60'
            assert trailers["ratelimit"].startswith(f'"default";r={2 - i};')
            assert "retry-after" not in trailers
        with pytest.raises(grpc.RpcError) as denied:
            unary(b"hi", metadata=md("k1"))
        check_exhausted(denied.value)
        # Another key is independent; no x-api-key: not limited; skip(): not limited.
        assert unary(b"x", metadata=md("k2")) == b"echo:x"
        for _ in range(5):
            assert unary(b"x") == b"echo:x"
        health = channel.unary_unary(f"/{SERVICE}/Health")
        assert [health(b"", metadata=md("k1")) for _ in range(5)] == [b"SERVING"] * 5
        assert limiter.inspect("k1")["admitted"] == 3 and limiter.inspect("k1")["denied"] == 1
    finally:
        channel.close()
        server.stop(None)


def test_sync_streams_are_limited_once_per_call_and_cost() -> None:
    limiter = Limiter(limit=6, window_ms=60_000)
    cost = lambda call: 2 if call.method.endswith("/Bidi") else 1  # noqa: E731
    server, channel = serve(RateLimitInterceptor(limiter, key=metadata_key("x-api-key"), cost=cost))
    try:
        count_rpc = channel.unary_stream(f"/{SERVICE}/Count")
        responses = count_rpc(b"5", metadata=md("s"))
        assert list(responses) == [b"0", b"1", b"2", b"3", b"4"]
        assert dict(responses.trailing_metadata())["ratelimit"].startswith('"default";r=5;')
        total_rpc = channel.stream_unary(f"/{SERVICE}/Total")
        assert total_rpc(iter([b"ab", b"cde"]), metadata=md("s")) == b"5"
        bidi_rpc = channel.stream_stream(f"/{SERVICE}/Bidi")
        assert list(bidi_rpc(iter([b"a", b"b"]), metadata=md("s"))) == [b"A", b"B"]  # cost 2: 2 left
        assert list(bidi_rpc(iter([b"c"]), metadata=md("s"))) == [b"C"]  # 0 left
        with pytest.raises(grpc.RpcError) as denied:
            list(count_rpc(b"3", metadata=md("s")))
        check_exhausted(denied.value)
        assert limiter.inspect("s")["admitted"] == 4
    finally:
        channel.close()
        server.stop(None)


def test_sync_default_key_limiter_errors_and_tier(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str | None] = []

    class TieredLimiter(Limiter):
        # A limiter with plan tiers takes tier= (issue 15); this one records it.
        def acquire(self, key: str, cost: int = 1, tier: str | None = None) -> Decision:
            seen.append(tier)
            return super().acquire(key, cost)

    limiter = TieredLimiter(limit=2, window_ms=60_000)
    tier = lambda call: "pro" if call.metadata.get("x-plan") == "pro" else None  # noqa: E731
    server, channel = serve(RateLimitInterceptor(limiter, tier=tier))
    try:
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        unary(b"a", metadata=[("x-plan", "pro")])
        unary(b"a")
        with pytest.raises(grpc.RpcError) as denied:
            unary(b"a")
        check_exhausted(denied.value)
        assert seen == ["pro", None, None]
        assert limiter.inspect("127.0.0.1")["admitted"] == 2  # the default key is the peer's address
    finally:
        channel.close()
        server.stop(None)

    # A cost above the key's limit is the limiter's typed error: logged, and INTERNAL
    # with a fixed message for the client.
    server, channel = serve(RateLimitInterceptor(Limiter(limit=3), cost=lambda call: 100))
    try:
        with caplog.at_level(logging.ERROR, logger="quotalease.grpc"), pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(f"/{SERVICE}/Unary")(b"a")
        assert err.value.code() == grpc.StatusCode.INTERNAL  # type: ignore[attr-defined]
        assert err.value.details() == "rate limiter error"  # type: ignore[attr-defined]
        logged = [r.getMessage() for r in caplog.records if r.name == "quotalease.grpc"]
        assert len(logged) == 1 and logged[0].startswith(f"/{SERVICE}/Unary: invalid cost 100"), logged
    finally:
        channel.close()
        server.stop(None)


def test_sync_on_redis(redis_server: RedisServer) -> None:
    limiter = Limiter(
        redis_server.url, backend_timeout_ms=PATIENT, limit=4, window_ms=DAY, lease_size=2, key_prefix=unique("grpc")
    )
    server, channel = serve(RateLimitInterceptor(limiter, key=metadata_key("x-api-key")))
    try:
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        codes = []
        for _ in range(6):
            try:
                unary(b"x", metadata=md("r"))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())  # type: ignore[attr-defined]
        assert codes == [grpc.StatusCode.OK] * 4 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    finally:
        channel.close()
        server.stop(None)
        limiter.close()


def test_peer_address_and_bad_input() -> None:
    class Ctx:
        def __init__(self, peer: str) -> None:
            self._peer = peer

        def peer(self) -> str:
            return self._peer

    assert peer_address(Call("/a/b", {}, Ctx("ipv4:127.0.0.1:5000"))) == "127.0.0.1"
    assert peer_address(Call("/a/b", {}, Ctx("ipv6:[::1]:5000"))) == "::1"
    assert peer_address(Call("/a/b", {}, Ctx("unix:/tmp/s"))) == "unix:/tmp/s"
    with pytest.raises(TypeError, match="limiter must be a quotalease.Limiter"):
        RateLimitInterceptor(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidCostError):
        AsyncRateLimitInterceptor(Limiter(limit=3), cost=0)
    with pytest.raises(TypeError, match="key must be a function"):
        RateLimitInterceptor(Limiter(limit=3), key="x-api-key")  # type: ignore[arg-type]


# --- grpc.aio ----------------------------------------------------------------


async def aio_echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return b"aio:" + request


async def aio_count(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
    for i in range(int(request)):
        yield str(i).encode()


async def aio_write(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.write(b"written")


async def aio_total(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    n = 0
    async for r in requests:
        n += len(r)
    return str(n).encode()


async def test_aio_unary_streams_and_resource_exhausted() -> None:
    limiter = Limiter(limit=4, window_ms=60_000)
    server = grpc.aio.server(interceptors=[AsyncRateLimitInterceptor(limiter, key=metadata_key("x-api-key"))])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(aio_echo),
                    "Count": grpc.unary_stream_rpc_method_handler(aio_count),
                    "Write": grpc.unary_stream_rpc_method_handler(aio_write),
                    "Total": grpc.stream_unary_rpc_method_handler(aio_total),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary(f"/{SERVICE}/Unary")
            call = unary(b"a", metadata=md("k"))
            assert await call == b"aio:a"
            trailers = dict(await call.trailing_metadata())
            assert trailers["ratelimit"].startswith('"default";r=3;')
            stream = channel.unary_stream(f"/{SERVICE}/Count")(b"3", metadata=md("k"))
            assert [r async for r in stream] == [b"0", b"1", b"2"]
            written = channel.unary_stream(f"/{SERVICE}/Write")(b"", metadata=md("k"))
            assert [r async for r in written] == [b"written"]

            async def requests() -> AsyncIterator[bytes]:
                yield b"xy"
                yield b"z"

            assert await channel.stream_unary(f"/{SERVICE}/Total")(requests(), metadata=md("k")) == b"3"
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await unary(b"a", metadata=md("k"))
            check_exhausted(denied.value)
            with pytest.raises(grpc.aio.AioRpcError) as denied_stream:
                _ = [r async for r in channel.unary_stream(f"/{SERVICE}/Count")(b"2", metadata=md("k"))]
            assert denied_stream.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await unary(b"b", metadata=md("other")) == b"aio:b"
    finally:
        await server.stop(None)
    assert limiter.inspect("k")["admitted"] == 4 and limiter.inspect("k")["denied"] == 2
