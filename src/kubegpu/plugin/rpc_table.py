"""The DevicePlugin service's method table, with request decoding that never raises.

grpcio's generated `add_DevicePluginServicer_to_server` decodes with `FromString`; a body that does not
parse makes grpcio log an ERROR with a traceback and answer UNKNOWN, once per body, so any client of the
socket decides how much the plugin logs. Here a body that does not parse becomes an `Undecodable` value
handed to the servicer, which answers INVALID_ARGUMENT and logs at a bounded rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from kubegpu.api.v1beta1 import api_pb2

SERVICE = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request body that is not the method's message (it keeps no byte of the body)."""

    type_name: str
    size: int
    reason: str

    def describe(self) -> str:
        return f"the request body ({self.size} bytes) is not a valid {self.type_name}: {self.reason}"


def lenient(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    def decode(data: bytes) -> Message | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception as err:  # DecodeError, or whatever else the parser raises on hostile bytes
            return Undecodable(message_type.DESCRIPTOR.full_name, len(data), str(err) or type(err).__name__)

    return decode


def method_handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of the DevicePlugin service in the proto, bound to `servicer`'s method of that name."""
    handlers = {}
    for name, method in api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name.items():
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = make(
            getattr(servicer, name),
            request_deserializer=lenient(getattr(api_pb2, method.input_type.name)),
            response_serializer=getattr(api_pb2, method.output_type.name).SerializeToString,
        )
    return handlers


def add_to_server(servicer: Any, server: grpc.aio.Server) -> None:
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # grpcio >= 1.63 API (what its generated code calls); grpc-stubs does not list it yet.
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
