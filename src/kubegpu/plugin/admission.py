"""Which calls one device-plugin socket serves at once: unary calls and ListAndWatch streams counted apart,
and unary calls weighed by how much they may carry.

gRPC's own `maximum_concurrent_rpcs` counts a held-open stream like any call, so a tool holding 15 streams
(16 with the kubelet's) made every Allocate fail with RESOURCE_EXHAUSTED; and 16 calls in flight, each
listing the 63,680 devices of the largest accepted config, took the daemon past the DaemonSet's 256Mi. Here:
- unary calls (Allocate, GetPreferredAllocation, PreStartContainer, GetDevicePluginOptions) have their
  limit, and streams theirs, so no number of streams can starve an Allocate;
- the first stream of each server incarnation is admitted whatever the count: the registrar registers a
  fresh server and the kubelet dials back at once, so that stream is the kubelet's;
- a unary call weighs as many device IDs as its resource serves (the most a kubelet's request lists), and
  the calls running in the whole process may weigh at most `MAX_IDS_IN_FLIGHT` (one call always runs), so
  what is in flight is bounded in bytes, not only in calls: 16 calls on a node of 8 GPUs x 48 replicas, 4 on
  the largest accepted config;
- a call is admitted or refused before its request is read: every method is served as a client-streaming
  call (the same bytes on the wire), whose handler decides first and only then reads the one message, so
  a refusal costs no memory and an admitted call is released when its handler ends, whatever the client
  did; gRPC's own limit stays as a backstop above the sum;
- every refusal is counted (`kubegpu_rpc_refusals_total`) and logged at a bounded rate by the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

UNARY, STREAM = "unary", "stream"
MAX_UNARY_RPCS = 16  # the kubelet sends one Allocate, GetPreferredAllocation or PreStart at a time
MAX_STREAMS = 8  # the kubelet holds one ListAndWatch, two while it registers us again
# Device IDs the unary calls in flight may list, process-wide: about 150 bytes of the daemon's memory each
# while a call runs (bench/largest_config.py), so at most about 40 MB above the idle daemon.
MAX_IDS_IN_FLIGHT = 262_144
# gRPC's limit, above what we admit: room for calls being refused while the admitted ones run.
BACKSTOP_RPCS = MAX_UNARY_RPCS + MAX_STREAMS + 16

Refused = Callable[[str, str], str]  # (rpc, kind) -> the status details; the callback logs and counts


class IdBudget:
    """Device IDs that unary calls in flight may carry, shared by every server of the process."""

    def __init__(self, limit: int = MAX_IDS_IN_FLIGHT) -> None:
        self.limit = limit
        self.used = 0
        self.calls = 0

    def take(self, weight: int) -> bool:
        if self.calls and self.used + weight > self.limit:
            return False
        self.used += weight
        self.calls += 1
        return True

    def give_back(self, weight: int) -> None:
        self.used -= weight
        self.calls -= 1


PROCESS_BUDGET = IdBudget()


class Admission:
    """Calls running now on one server incarnation, per kind, against their limits."""

    def __init__(
        self, unary: int = MAX_UNARY_RPCS, streams: int = MAX_STREAMS, budget: IdBudget | None = None
    ) -> None:
        self.limits = {UNARY: unary, STREAM: streams}
        self.running = {UNARY: 0, STREAM: 0}
        self.budget = budget if budget is not None else PROCESS_BUDGET
        self._first_stream_taken = False

    def enter(self, kind: str, weight: int = 0) -> bool:
        if kind == STREAM:
            if self._first_stream_taken and self.running[STREAM] >= self.limits[STREAM]:
                return False
            self._first_stream_taken = True
        elif self.running[UNARY] >= self.limits[UNARY] or not self.budget.take(weight):
            return False
        self.running[kind] += 1
        return True

    def leave(self, kind: str, weight: int = 0) -> None:
        self.running[kind] -= 1
        if kind == UNARY:
            self.budget.give_back(weight)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, admission: Admission, refused: Refused, weight: Callable[[], int]) -> None:
        """`weight`: the device IDs a unary call may carry now (the devices served)."""
        self._admission = admission
        self._refused = refused
        self._weight = weight

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        rpc = str(handler_call_details.method).rsplit("/", 1)[-1]
        if handler.response_streaming:
            return self._stream(handler, rpc)
        return self._unary(handler, rpc)

    def _unary(self, handler: grpc.RpcMethodHandler, rpc: str) -> grpc.RpcMethodHandler:
        admission, refused, weigh = self._admission, self._refused, self._weight
        call: Any = handler.unary_unary  # grpc-stubs types it for the sync server

        async def unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            weight = weigh()
            if not admission.enter(UNARY, weight):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused(rpc, UNARY))
            try:
                request = await _one_message(requests, context)
                return await call(request, context)
            finally:
                admission.leave(UNARY, weight)

        return grpc.stream_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )

    def _stream(self, handler: grpc.RpcMethodHandler, rpc: str) -> grpc.RpcMethodHandler:
        admission, refused = self._admission, self._refused
        behavior: Any = handler.unary_stream

        async def stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if not admission.enter(STREAM):
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused(rpc, STREAM))
            try:
                request = await _one_message(requests, context)
                async for response in behavior(request, context):
                    yield response
            finally:
                admission.leave(STREAM)

        return grpc.stream_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )


async def _one_message(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    """The one request message of a unary call, read only now that the call is admitted.

    Read from the context, not by iterating `requests`: an async generator left suspended after its first
    message keeps that message alive in a reference cycle until the garbage collector's next full pass
    (100 calls of 1 MB bodies peaked 100 MB higher).
    """
    request = await context.read()
    if request is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc-stubs does not list it
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
    return request
