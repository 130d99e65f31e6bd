"""gRPC server interceptors (grpcio): one ``acquire`` per RPC, sync and asyncio.

    import grpc
    from quotalease import Limiter
    from quotalease.grpc import RateLimitInterceptor, metadata_key

    limiter = Limiter("redis://127.0.0.1:6379", rate="100/min")
    server = grpc.server(pool, interceptors=[RateLimitInterceptor(limiter, key=metadata_key("x-api-key"))])

    # grpc.aio:
    server = grpc.aio.server(interceptors=[AsyncRateLimitInterceptor(limiter)])

A denied call ends with ``RESOURCE_EXHAUSTED`` before the handler runs; its
trailing metadata carries ``retry-after`` (whole seconds, as in HTTP),
``ratelimit-policy`` and ``ratelimit`` (the IETF fields, keys lower-case as
gRPC requires), and ``grpc-status-details-bin``: a ``google.rpc.Status`` with a
``google.rpc.RetryInfo`` (the retry delay to the millisecond), as Go's and
Rust's interceptors send it, readable with ``grpc_status.rpc_status.from_call``
(no protobuf dependency here: the few bytes are written by hand). An admitted
call gets ``ratelimit-policy`` and ``ratelimit`` added to its trailing metadata
(beside any the handler sets). Every kind of method (unary and streaming, either
side) is limited once per call.

``key(call)`` picks the bucket from a :class:`Call` (``method``,
``metadata``, ``peer``, ``context``); the default is the peer's address.
Return None (or let ``skip(call)`` return true) to leave a call unlimited,
e.g. the health service. ``cost`` is an int or ``cost(call)``; ``tier`` (a str
or ``tier(call)``) is handed to ``acquire`` for limiters with plan tiers; ``wait_ms``
waits up to that long for the tokens instead of RESOURCE_EXHAUSTED. A
limiter error (a closed limiter, a cost above the limit) ends the call with
``INTERNAL`` and the error's message.

``concurrency=True`` limits the calls of a key in flight at once instead of
its rate: each limited call takes a permit (``limiter.acquire_concurrent(key,
tier=)``, awaited with ``grpc.aio``; the limiter needs ``concurrency=N``, else
every call ends with ``INTERNAL`` as for any limiter error) and gives it back
when its handler returns or raises; a streaming response holds it until its
response iterator ends (or is closed, the call cancelled). A call past the N
ends with the same ``RESOURCE_EXHAUSTED`` and ``grpc-status-details-bin``, and
only ``retry-after`` beside them (the RateLimit fields describe rates); an
admitted call gets no trailers of its own. ``tier`` picks the tier whose ``"N
concurrent"`` applies; ``cost`` and ``wait_ms`` do not: giving one with
``concurrency=True`` raises ``quotalease.ConfigError`` here. For a rate and a
concurrency limit both, give the server two interceptors, the rate one first::

    interceptors=[RateLimitInterceptor(limiter), RateLimitInterceptor(limiter, concurrency=True)]

With ``grpc.aio`` the handlers are coroutines or async generators, as grpc.aio
expects; a plain function given to an aio server is called on the event loop
after the check (with the aio context), so keep aio handlers async.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from ._middleware import PermitRelease, Rule, check_concurrency, metadata_pairs, retry_after_pairs
from ._native import Decision, Limiter, QuotaLeaseError

_log = logging.getLogger("quotalease.grpc")
# What a client sees of a limiter error; the error itself goes to _log.
_FAILED = "rate limiter error"

__all__ = [
    "AsyncRateLimitInterceptor",
    "Call",
    "RateLimitInterceptor",
    "metadata_key",
    "peer_address",
    "status_details",
]


@dataclass(frozen=True)
class Call:
    """What a key function sees of one RPC."""

    #: The full method name, ``"/package.Service/Method"``.
    method: str
    #: The invocation metadata, one value per key (the last one sent).
    metadata: Mapping[str, str | bytes]
    #: The servicer context (``grpc.ServicerContext`` or ``grpc.aio.ServicerContext``).
    context: Any

    @property
    def peer(self) -> str:
        """The peer as gRPC names it, e.g. ``"ipv4:127.0.0.1:50312"``."""
        return str(self.context.peer())


def peer_address(call: Call) -> str | None:
    """The default key: the peer's address without its port."""
    peer = call.peer
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and rest:
        host = rest.rsplit(":", 1)[0]
        return host.strip("[]")
    return peer or "unknown"


def metadata_key(name: str) -> Callable[[Call], str | None]:
    """A key function: the value of one metadata entry (an API key, a tenant);
    calls without it are not limited."""
    name = name.lower()

    def key(call: Call) -> str | None:
        value = call.metadata.get(name)
        if value is None or value == "":
            return None
        return value if isinstance(value, str) else value.hex()

    return key


def _call(details: grpc.HandlerCallDetails, context: Any) -> Call:
    metadata = {k: v for k, v in (context.invocation_metadata() or ())}
    return Call(str(details.method), metadata, context)


def _message(decision: Decision) -> str:
    return f"rate limited; retry after {decision.retry_after_ms} ms"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint (wire type 0) or bytes (wire type 2); zero
    varints are left out, as proto3 does."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value) if value else b""
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def status_details(decision: Decision) -> bytes:
    """``grpc-status-details-bin`` of a denial: ``google.rpc.Status{code:
    RESOURCE_EXHAUSTED, message, details: [Any(google.rpc.RetryInfo{retry_delay})]}``."""
    ms = decision.retry_after_ms
    delay = _field(1, ms // 1000) + _field(2, (ms % 1000) * 1_000_000)  # google.protobuf.Duration
    retry_info = _field(1, delay)
    detail = _field(1, b"type.googleapis.com/google.rpc.RetryInfo") + _field(2, retry_info)
    code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    return _field(1, code) + _field(2, _message(decision).encode()) + _field(3, detail)


def _denied_trailers(decision: Decision) -> tuple[tuple[str, str | bytes], ...]:
    return (*metadata_pairs(decision), ("grpc-status-details-bin", status_details(decision)))


def _permit_denied_trailers(decision: Decision) -> tuple[tuple[str, str | bytes], ...]:
    """A call past the concurrency: ``retry-after`` only (no RateLimit fields)."""
    retry_after = ((name.lower(), value) for name, value in retry_after_pairs(decision))
    return (*retry_after, ("grpc-status-details-bin", status_details(decision)))


def _nothing() -> None:
    """The end of a call no limit took anything for."""


def _merge_trailers(context: Any, decision: Decision | None) -> None:
    if decision is None:
        return
    existing = tuple(context.trailing_metadata() or ())
    names = {k for k, _ in existing}
    context.set_trailing_metadata(existing + tuple((k, v) for k, v in metadata_pairs(decision) if k not in names))


class _Base:
    def __init__(
        self,
        limiter: Limiter,
        key: Callable[[Call], str | None] = peer_address,
        cost: int | Callable[[Call], int] = 1,
        *,
        skip: Callable[[Call], bool] | None = None,
        tier: str | Callable[[Call], str | None] | None = None,
        wait_ms: int | None = None,
        concurrency: bool = False,
    ) -> None:
        who = type(self).__name__
        self.limiter = limiter
        self.rule: Rule[Call] = Rule(limiter, key, cost, skip=skip, tier=tier, wait_ms=wait_ms, who=who)
        self.concurrency = check_concurrency(
            concurrency, who, cost=cost, wait_ms=wait_ms, hint="give the server a second interceptor for a rate too"
        )


class RateLimitInterceptor(_Base, grpc.ServerInterceptor):
    """For ``grpc.server(..., interceptors=[...])`` (see the module's doc)."""

    def _check(self, details: grpc.HandlerCallDetails, context: grpc.ServicerContext) -> Decision | None:
        try:
            decision = self.rule.acquire(_call(details, context))
        except QuotaLeaseError as e:
            _log.error("%s: %s", details.method, e)
            context.abort(grpc.StatusCode.INTERNAL, _FAILED)
        if decision is not None and not decision.allowed:
            context.set_trailing_metadata(_denied_trailers(decision))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _message(decision))
        return decision

    def _permit(self, details: grpc.HandlerCallDetails, context: grpc.ServicerContext) -> Callable[[], None]:
        """The call's permit (``concurrency=True``), aborting the call when
        denied; the function that gives it back."""
        try:
            permit = self.rule.acquire_permit(_call(details, context))
        except QuotaLeaseError as e:
            _log.error("%s: %s", details.method, e)
            context.abort(grpc.StatusCode.INTERNAL, _FAILED)
        if permit is None:
            return _nothing
        if not permit.allowed:
            context.set_trailing_metadata(_permit_denied_trailers(permit.decision))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _message(permit.decision))
        return PermitRelease(permit)

    def _begin(self, details: grpc.HandlerCallDetails, context: grpc.ServicerContext) -> Callable[[], None]:
        """Limit the call (aborting it when denied); the function to call when it ends."""
        if self.concurrency:
            return self._permit(details, context)
        decision = self._check(details, context)
        return lambda: _merge_trailers(context, decision)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        begin = self._begin
        details = handler_call_details
        h: Any = handler

        def single(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                end = begin(details, context)
                try:
                    return behavior(request, context)
                finally:
                    end()

            return run

        def streaming(behavior: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
            def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                end = begin(details, context)
                try:
                    responses = behavior(request, context)
                except BaseException:
                    end()
                    raise
                return _ending(responses, end)

            return run

        kw = {"request_deserializer": h.request_deserializer, "response_serializer": h.response_serializer}
        if h.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(single(h.unary_unary), **kw)
        if h.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(streaming(h.unary_stream), **kw)
        if h.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(single(h.stream_unary), **kw)
        return grpc.stream_stream_rpc_method_handler(streaming(h.stream_stream), **kw)


def _ending(responses: Iterator[Any], end: Callable[[], None]) -> Iterator[Any]:
    """``responses``, then ``end()`` when they end, fail or are closed."""
    try:
        yield from responses
    finally:
        end()


class AsyncRateLimitInterceptor(_Base, grpc.aio.ServerInterceptor):
    """For ``grpc.aio.server(interceptors=[...])`` (see the module's doc)."""

    async def _check(self, details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            decision = await self.rule.acquire_async(_call(details, context))
        except QuotaLeaseError as e:
            _log.error("%s: %s", details.method, e)
            await context.abort(grpc.StatusCode.INTERNAL, _FAILED)
        if decision is not None and not decision.allowed:
            trailers = _denied_trailers(decision)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _message(decision), trailing_metadata=trailers)
        return decision

    async def _permit(
        self, details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Callable[[], None]:
        """The call's permit (``concurrency=True``), awaited, aborting the call
        when denied; the function that gives it back."""
        try:
            permit = await self.rule.acquire_permit_async(_call(details, context))
        except QuotaLeaseError as e:
            _log.error("%s: %s", details.method, e)
            await context.abort(grpc.StatusCode.INTERNAL, _FAILED)
        if permit is None:
            return _nothing
        if not permit.allowed:
            trailers = _permit_denied_trailers(permit.decision)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, _message(permit.decision), trailing_metadata=trailers
            )
        return PermitRelease(permit)

    async def _begin(
        self, details: grpc.HandlerCallDetails, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Callable[[], None]:
        """Limit the call (aborting it when denied); the function to call when it ends."""
        if self.concurrency:
            return await self._permit(details, context)
        decision = await self._check(details, context)
        return lambda: _merge_trailers(context, decision)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        begin = self._begin
        details = handler_call_details
        h: Any = handler

        def single(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            async def run(request: Any, context: Any) -> Any:
                end = await begin(details, context)
                try:
                    result = behavior(request, context)
                    return (await result) if inspect.isawaitable(result) else result
                finally:
                    end()

            return run

        def streaming(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
            if inspect.isasyncgenfunction(behavior):

                async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
                    end = await begin(details, context)
                    try:
                        async for response in behavior(request, context):
                            yield response
                    finally:
                        end()

                return generate
            return single(behavior)  # a coroutine that writes with context.write()

        kw = {"request_deserializer": h.request_deserializer, "response_serializer": h.response_serializer}
        if h.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(single(h.unary_unary), **kw)
        if h.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(streaming(h.unary_stream), **kw)
        if h.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(single(h.stream_unary), **kw)
        return grpc.stream_stream_rpc_method_handler(streaming(h.stream_stream), **kw)
