"""Which calls one device-plugin socket serves at once: unary calls and ListAndWatch streams counted apart.

gRPC's own `maximum_concurrent_rpcs` counts a held-open stream like any call, so a tool holding 15 streams
(16 with the kubelet's) made every Allocate fail with RESOURCE_EXHAUSTED. Here:
- unary calls (Allocate, GetPreferredAllocation, PreStartContainer, GetDevicePluginOptions) have their
  limit, and streams theirs, so no number of streams can starve an Allocate;
- the first stream of each server incarnation is admitted whatever the count: the registrar registers a
  fresh server and the kubelet dials back at once, so that stream is the kubelet's;
- a call over its limit is refused before its request is read (an interceptor answers it as a
  client-streaming call that never reads its body), so refusing costs no memory; the count is checked
  again when the call starts (calls arriving together may all pass the first check), and gRPC's own limit
  stays as a backstop above the sum, bounding what is read while that happens;
- every refusal is counted (`kubegpu_rpc_refusals_total`) and logged at a bounded rate by the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

UNARY, STREAM = "unary", "stream"
MAX_UNARY_RPCS = 16  # the kubelet sends one Allocate, GetPreferredAllocation or PreStart at a time
MAX_STREAMS = 8  # the kubelet holds one ListAndWatch, two while it registers us again
# gRPC's limit, above what we admit: room for calls being refused while the admitted ones run.
BACKSTOP_RPCS = MAX_UNARY_RPCS + MAX_STREAMS + 16

Refused = Callable[[str, str], str]  # (rpc, kind) -> the status details; the callback logs and counts


class Admission:
    """Calls running now, per kind, against their limits (one per server incarnation)."""

    def __init__(self, unary: int = MAX_UNARY_RPCS, streams: int = MAX_STREAMS) -> None:
        self.limits = {UNARY: unary, STREAM: streams}
        self.running = {UNARY: 0, STREAM: 0}
        self._first_stream_taken = False

    def full(self, kind: str) -> bool:
        if kind == STREAM and not self._first_stream_taken:
            return False
        return self.running[kind] >= self.limits[kind]

    def enter(self, kind: str) -> bool:
        if self.full(kind):
            return False
        if kind == STREAM:
            self._first_stream_taken = True
        self.running[kind] += 1
        return True

    def leave(self, kind: str) -> None:
        self.running[kind] -= 1


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, admission: Admission, refused: Refused) -> None:
        self._admission = admission
        self._refused = refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        rpc = str(handler_call_details.method).rsplit("/", 1)[-1]
        kind = STREAM if handler.response_streaming else UNARY
        if self._admission.full(kind):
            return _unread_refusal(self._refused(rpc, kind), kind)
        return self._counted(handler, rpc, kind)

    def _counted(self, handler: grpc.RpcMethodHandler, rpc: str, kind: str) -> grpc.RpcMethodHandler:
        admission, refused = self._admission, self._refused
        if kind == STREAM:
            behavior: Any = handler.unary_stream  # grpc-stubs types it for the sync server

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                if not admission.enter(STREAM):
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused(rpc, STREAM))
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    admission.leave(STREAM)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        call: Any = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if not admission.enter(UNARY):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused(rpc, UNARY))
            try:
                return await call(request, context)
            finally:
                admission.leave(UNARY)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )


def _unread_refusal(details: str, kind: str) -> grpc.RpcMethodHandler:
    """A handler that answers RESOURCE_EXHAUSTED without reading the request: declared client-streaming,
    it is handed the body as an iterator it never touches (the wire format is the same)."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details)

    if kind == STREAM:

        async def refuse_stream(
            requests: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details)
            yield None  # never reached: makes this an async generator, as a streaming handler must be

        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)
