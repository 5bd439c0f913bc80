"""The DevicePlugin service's method table, with request decoding that never raises (`api.lenient`, shared
with the DRA driver's sockets).

A body that does not parse becomes an `Undecodable` value handed to the servicer, which answers
INVALID_ARGUMENT, counts it for the resource and logs at a bounded rate.
"""

from __future__ import annotations

from typing import Any

import grpc

from kubegpu.api import lenient as _lenient
from kubegpu.api.lenient import Undecodable, lenient
from kubegpu.api.v1beta1 import api_pb2

__all__ = ["SERVICE", "Undecodable", "add_to_server", "lenient", "method_handlers"]

SERVICE = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name


def method_handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of the DevicePlugin service in the proto, bound to `servicer`'s method of that name."""
    return _lenient.method_handlers(api_pb2, "DevicePlugin", servicer)


def add_to_server(servicer: Any, server: grpc.aio.Server) -> None:
    _lenient.add_service(server, api_pb2, "DevicePlugin", servicer)
