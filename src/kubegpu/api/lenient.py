"""A gRPC service's method table whose request decoding never raises: for every socket a daemon serves.

grpcio's generated `add_<Service>Servicer_to_server` decodes with `FromString`; a body that does not parse
makes grpcio log an ERROR with a traceback and answer UNKNOWN, once per body, so any client of the socket
decides how much the daemon logs. Here a body that does not parse becomes an `Undecodable` value (it keeps
no byte of the body). Either the servicer gets it and answers itself (the device plugin, which counts it
per resource), or, given `refused`, the table answers INVALID_ARGUMENT before the servicer is called and
reports it to `refused` (which logs at a bounded rate): every method of the service, streaming ones too,
without a line in the servicer.

Hand-written, not generated: it reads the method list from the service's descriptor, so a method the proto
gains is served the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.message import Message


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request body that is not the method's message (it keeps no byte of the body)."""

    type_name: str
    size: int
    reason: str

    def describe(self) -> str:
        return f"the request body ({self.size} bytes) is not a valid {self.type_name}: {self.reason}"


Refused = Callable[[str, Undecodable], None]  # (the full method name, what did not decode)


def lenient(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    def decode(data: bytes) -> Message | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception as err:  # DecodeError, or whatever else the parser raises on hostile bytes
            return Undecodable(message_type.DESCRIPTOR.full_name, len(data), str(err) or type(err).__name__)

    return decode


def method_handlers(
    messages: ModuleType, service: str, servicer: Any, refused: Refused | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of `service` (its short name in `messages`, an api_pb2 module), bound to `servicer`'s
    method of that name, with lenient decoding."""
    descriptor = messages.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for name, method in descriptor.methods_by_name.items():
        output = getattr(messages, method.output_type.name)
        implementation = getattr(servicer, name)
        if refused is not None:
            implementation = _refusing(
                implementation, method.full_name, output, method.server_streaming, refused
            )
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = make(
            implementation,
            request_deserializer=lenient(getattr(messages, method.input_type.name)),
            response_serializer=output.SerializeToString,
        )
    return handlers


def add_service(
    server: grpc.aio.Server, messages: ModuleType, service: str, servicer: Any, refused: Refused | None = None
) -> None:
    full_name = messages.DESCRIPTOR.services_by_name[service].full_name
    handlers = method_handlers(messages, service, servicer, refused)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full_name, handlers),))
    # grpcio >= 1.63 API (what its generated code calls); grpc-stubs does not list it yet.
    server.add_registered_method_handlers(full_name, handlers)  # type: ignore[attr-defined]


def _refusing(
    implementation: Any, method: str, output: type[Message], streaming: bool, refused: Refused
) -> Any:
    """`implementation`, except that an Undecodable request is answered INVALID_ARGUMENT (status set and an
    empty message returned, not raised: a raised error's traceback would keep the request alive)."""

    def refuse(request: Undecodable, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        refused(method, request)
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(f"{method}: {request.describe()}")

    if streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                refuse(request, context)
                return
            async for response in implementation(request, context):
                yield response

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            refuse(request, context)
            return output()
        return await implementation(request, context)

    return unary
