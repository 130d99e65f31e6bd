"""quotalease.grpc's interceptors with ``concurrency=True`` on real grpcio
servers over loopback (sync grpc.server and grpc.aio.server): a permit per
call in flight, released when a unary handler returns or raises and when a
streaming response ends; a call past the N ends with RESOURCE_EXHAUSTED, its
RetryInfo and only ``retry-after`` in its trailers. Driven through gates, not
sleeps."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2

from quotalease import ConfigError, Limiter
from quotalease.grpc import AsyncRateLimitInterceptor, Call, RateLimitInterceptor, metadata_key

SERVICE = "test.InFlight"

#: How long a test thread waits at a gate before the test fails: a guard
#: against a hang, never reached when the test passes.
HANG_S = 30.0


def md(key: str, tier: str | None = None) -> list[tuple[str, str]]:
    return [("x-api-key", key)] + ([("x-tier", tier)] if tier else [])


def tier_of(call: Call) -> str | None:
    value = call.metadata.get("x-tier")
    return value if isinstance(value, str) else None


def check_exhausted(err: Any) -> None:
    """RESOURCE_EXHAUSTED past the concurrency: the RetryInfo status details
    and ``retry-after: 1``, no RateLimit fields (they describe rates)."""
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(err.trailing_metadata())
    assert trailers["retry-after"] == "1"
    assert "ratelimit" not in trailers and "ratelimit-policy" not in trailers
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and status.message == err.details()
    [detail] = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    delay_ms = info.retry_delay.seconds * 1000 + info.retry_delay.nanos // 1_000_000
    assert err.details() == f"rate limited; retry after {delay_ms} ms" and delay_ms > 0


# --- sync grpc.server -----------------------------------------------------------


class Handlers:
    """Raw-bytes handlers: "Gated" announces its request's name and waits at its
    gate; "Stream" sends b"first", waits at its gate, then b"rest"; "Boom"
    raises; "Plain" answers at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[bytes, threading.Event] = {}
        self.entered: dict[bytes, threading.Event] = {}

    def gate(self, name: bytes) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def arrival(self, name: bytes) -> threading.Event:
        with self.lock:
            return self.entered.setdefault(name, threading.Event())

    def gated(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.arrival(request).set()
        assert self.gate(request).wait(HANG_S)
        return b"done:" + request

    def stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield b"first"
        assert self.gate(request).wait(HANG_S)
        yield b"rest"

    def boom(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        raise RuntimeError("boom")

    def generic(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Gated": grpc.unary_unary_rpc_method_handler(self.gated),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
                "Boom": grpc.unary_unary_rpc_method_handler(self.boom),
                "Plain": grpc.unary_unary_rpc_method_handler(lambda request, context: b"plain"),
            },
        )


def serve(interceptor: grpc.ServerInterceptor, handlers: Handlers) -> tuple[grpc.Server, grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[interceptor])
    server.add_generic_rpc_handlers((handlers.generic(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


def outcome(rpc: Any, request: bytes, metadata: list[tuple[str, str]] | None = None) -> Any:
    """The response, or the error a call ended with."""
    try:
        return rpc(request, metadata=metadata)
    except grpc.RpcError as e:
        return e


def test_sync_admits_n_in_flight_and_a_finished_call_frees_its_permit() -> None:
    limiter = Limiter(limit=1000, concurrency=2)
    handlers = Handlers()
    interceptor = RateLimitInterceptor(limiter, key=metadata_key("x-api-key"), concurrency=True)
    server, channel = serve(interceptor, handlers)
    try:
        gated = channel.unary_unary(f"/{SERVICE}/Gated")
        plain = channel.unary_unary(f"/{SERVICE}/Plain")
        first = gated.future(b"a", metadata=md("ann"))
        second = gated.future(b"b", metadata=md("ann"))
        assert handlers.arrival(b"a").wait(HANG_S) and handlers.arrival(b"b").wait(HANG_S)
        # two of ann's calls in flight: the third is denied before its handler
        # runs (its gate is open: admitted by mistake, it would not hang the test)
        handlers.gate(b"x").set()
        check_exhausted(outcome(gated, b"x", md("ann")))
        assert b"x" not in handlers.entered
        # another key has its own permits; no x-api-key: not limited
        response, call = plain.with_call(b"", metadata=md("bob"))
        assert response == b"plain" and "ratelimit" not in dict(call.trailing_metadata() or ())
        assert [plain(b"") for _ in range(3)] == [b"plain"] * 3
        # one returns: its permit is free again
        handlers.gate(b"a").set()
        assert first.result(HANG_S) == b"done:a"
        third = gated.future(b"c", metadata=md("ann"))
        assert handlers.arrival(b"c").wait(HANG_S)
        check_exhausted(outcome(plain, b"", md("ann")))
        handlers.gate(b"b").set()
        handlers.gate(b"c").set()
        assert [f.result(HANG_S) for f in (second, third)] == [b"done:b", b"done:c"]
        assert plain(b"", metadata=md("ann")) == b"plain"
    finally:
        channel.close()
        server.stop(None)
        limiter.close()


def test_sync_releases_when_the_handler_raises_and_holds_a_streaming_response() -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    handlers = Handlers()
    server, channel = serve(RateLimitInterceptor(limiter, key=lambda call: "k", concurrency=True), handlers)
    try:
        boom = channel.unary_unary(f"/{SERVICE}/Boom")
        plain = channel.unary_unary(f"/{SERVICE}/Plain")
        # each raise gives its permit back, or the second would be RESOURCE_EXHAUSTED
        assert [outcome(boom, b"").code() for _ in range(3)] == [grpc.StatusCode.UNKNOWN] * 3
        # a streaming response holds its permit until its iterator ends
        responses = channel.unary_stream(f"/{SERVICE}/Stream")(b"s")
        assert next(responses) == b"first"
        check_exhausted(outcome(plain, b""))
        handlers.gate(b"s").set()
        assert list(responses) == [b"rest"]
        assert plain(b"") == b"plain"
    finally:
        channel.close()
        server.stop(None)
        limiter.close()


def test_sync_takes_the_calls_tier(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(limit=1000, concurrency=3, tiers="free=1000/min, 1 concurrent")
    handlers = Handlers()
    interceptor = RateLimitInterceptor(limiter, key=metadata_key("x-api-key"), tier=tier_of, concurrency=True)
    server, channel = serve(interceptor, handlers)
    try:
        stream = channel.unary_stream(f"/{SERVICE}/Stream")
        plain = channel.unary_unary(f"/{SERVICE}/Plain")
        # the tier's 1 concurrent: the second of its calls is denied
        held = stream(b"free", metadata=md("ann", "free"))
        assert next(held) == b"first"
        check_exhausted(outcome(plain, b"", md("ann", "free")))
        handlers.gate(b"free").set()
        assert list(held) == [b"rest"]
        # no tier: the limiter's concurrency=3
        streams = [stream(b"bob", metadata=md("bob")) for _ in range(3)]
        assert [next(s) for s in streams] == [b"first"] * 3
        check_exhausted(outcome(plain, b"", md("bob")))
        handlers.gate(b"bob").set()
        assert [list(s) for s in streams] == [[b"rest"]] * 3
        # an unknown tier is the limiter's ConfigError: INTERNAL, the error logged
        with caplog.at_level(logging.ERROR, logger="quotalease.grpc"):
            err = outcome(plain, b"", md("cat", "gold"))
        assert (err.code(), err.details()) == (grpc.StatusCode.INTERNAL, "rate limiter error")
        logged = [r.getMessage() for r in caplog.records if r.name == "quotalease.grpc"]
        assert any('unknown tier "gold"' in m for m in logged), logged
    finally:
        channel.close()
        server.stop(None)
        limiter.close()


def test_concurrency_misconfiguration(caplog: pytest.LogCaptureFixture) -> None:
    limiter = Limiter(limit=1000, concurrency=1)
    # cost and wait_ms do not apply to a permit: an error, not ignored
    for cls in (RateLimitInterceptor, AsyncRateLimitInterceptor):
        for option in ({"cost": 2}, {"cost": lambda call: 1}, {"wait_ms": 100}):
            with pytest.raises(ConfigError, match=f"{next(iter(option))} cannot be combined with concurrency=True"):
                cls(limiter, concurrency=True, **option)
        with pytest.raises(TypeError, match="concurrency must be a bool"):
            cls(limiter, concurrency=1)  # type: ignore[arg-type]
    # a limiter without concurrency: every call ends with INTERNAL, the error logged
    no_concurrency = Limiter(limit=1000)
    server, channel = serve(RateLimitInterceptor(no_concurrency, concurrency=True), Handlers())
    try:
        with caplog.at_level(logging.ERROR, logger="quotalease.grpc"):
            err = outcome(channel.unary_unary(f"/{SERVICE}/Plain"), b"")
        assert err.code() == grpc.StatusCode.INTERNAL
        assert any("`concurrency` is 0" in r.getMessage() for r in caplog.records), caplog.records
    finally:
        channel.close()
        server.stop(None)
    limiter.close()
    no_concurrency.close()


# --- grpc.aio ---------------------------------------------------------------------


class AioHandlers:
    """The same handlers for grpc.aio (asyncio events), plus "Write", a
    coroutine streaming with context.write(), waiting at its gate between."""

    def __init__(self) -> None:
        self.gates: dict[bytes, asyncio.Event] = {}
        self.entered: dict[bytes, asyncio.Event] = {}

    def gate(self, name: bytes) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def arrival(self, name: bytes) -> asyncio.Event:
        return self.entered.setdefault(name, asyncio.Event())

    async def gated(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.arrival(request).set()
        await self.gate(request).wait()
        return b"done:" + request

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
        yield b"first"
        await self.gate(request).wait()
        yield b"rest"

    async def write(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.write(b"first")
        await self.gate(request).wait()
        await context.write(b"rest")

    async def boom(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        raise RuntimeError("boom")

    async def plain(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return b"plain"

    def generic(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Gated": grpc.unary_unary_rpc_method_handler(self.gated),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
                "Write": grpc.unary_stream_rpc_method_handler(self.write),
                "Boom": grpc.unary_unary_rpc_method_handler(self.boom),
                "Plain": grpc.unary_unary_rpc_method_handler(self.plain),
            },
        )


async def aio_outcome(call: Any) -> Any:
    try:
        return await call
    except grpc.aio.AioRpcError as e:
        return e


async def test_aio_in_flight_raises_streams_and_tier() -> None:
    limiter = Limiter(limit=1000, concurrency=2, tiers="free=1000/min, 1 concurrent")
    handlers = AioHandlers()
    interceptor = AsyncRateLimitInterceptor(limiter, key=metadata_key("x-api-key"), tier=tier_of, concurrency=True)
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((handlers.generic(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            gated = channel.unary_unary(f"/{SERVICE}/Gated")
            plain = channel.unary_unary(f"/{SERVICE}/Plain")
            ann = md("ann")
            first = asyncio.ensure_future(gated(b"a", metadata=ann))
            second = asyncio.ensure_future(gated(b"b", metadata=ann))
            await handlers.arrival(b"a").wait()
            await handlers.arrival(b"b").wait()
            handlers.gate(b"x").set()  # admitted by mistake, it would not hang the test
            check_exhausted(await aio_outcome(gated(b"x", metadata=ann)))
            assert b"x" not in handlers.entered
            call = plain(b"", metadata=md("bob"))
            assert await call == b"plain" and "ratelimit" not in dict(await call.trailing_metadata() or ())
            handlers.gate(b"a").set()
            assert await first == b"done:a"
            # a's permit is free again: c is admitted while b runs, then d is denied
            third = asyncio.ensure_future(gated(b"c", metadata=ann))
            await handlers.arrival(b"c").wait()
            check_exhausted(await aio_outcome(gated(b"x", metadata=ann)))
            handlers.gate(b"b").set()
            handlers.gate(b"c").set()
            assert [await second, await third] == [b"done:b", b"done:c"]
            # each raise gives its permit back
            boom = channel.unary_unary(f"/{SERVICE}/Boom")
            codes = [(await aio_outcome(boom(b"", metadata=ann))).code() for _ in range(3)]
            assert codes == [grpc.StatusCode.UNKNOWN] * 3
            # an async generator and a coroutine writing with context.write()
            # hold their permits until the stream ends
            for method in ("Stream", "Write"):
                names = [f"{method}-{i}".encode() for i in range(2)]
                streams = [channel.unary_stream(f"/{SERVICE}/{method}")(name, metadata=ann) for name in names]
                assert [await s.read() for s in streams] == [b"first"] * 2
                check_exhausted(await aio_outcome(plain(b"", metadata=ann)))
                for name in names:
                    handlers.gate(name).set()
                assert [await s.read() for s in streams] == [b"rest"] * 2
                assert [await s.read() for s in streams] == [grpc.aio.EOF] * 2
            assert await plain(b"", metadata=ann) == b"plain"
            # the tier's 1 concurrent
            free = md("cat", "free")
            held = channel.unary_stream(f"/{SERVICE}/Stream")(b"f", metadata=free)
            assert await held.read() == b"first"
            check_exhausted(await aio_outcome(plain(b"", metadata=free)))
            handlers.gate(b"f").set()
            assert (await held.read(), await held.read()) == (b"rest", grpc.aio.EOF)
            assert await plain(b"", metadata=free) == b"plain"
    finally:
        await server.stop(None)
    limiter.close()
