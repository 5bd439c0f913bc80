"""Registered DRA plugins as the kubelet keeps them, the service each was given, and the calls made to them.

Version choice (docs/reference/dra.md §1.3):
- a 1.32/1.33 kubelet looks for *its* services in the plugin's list, newest first ([v1beta1.DRAPlugin,
  v1alpha3.NodeService]) and silently falls back to v1alpha3.NodeService when none matches (so a plugin
  advertising only v1.DRAPlugin later gets calls on /v1alpha3.Node/..., which it cannot answer);
- a 1.34+ kubelet walks the *plugin's* list and takes the first service it supports (v1.DRAPlugin,
  v1beta1.DRAPlugin); no match fails the registration.
A 1.32 kubelet keeps one plugin per driver (a new registration replaces the old one); from 1.33 it keeps
all of them and uses the newest, refusing a second plugin on an endpoint already registered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2

from .endpoint import RpcRecord, RpcRecorder
from .errors import go_rpc_error

V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
V1ALPHA3 = "v1alpha3.NodeService"
HEALTH_METHOD = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
KUBELET_132_SERVICES = (V1BETA1, V1ALPHA3)
KUBELET_134_SERVICES = (V1, V1BETA1)
DEFAULT_CALL_TIMEOUT = 45.0  # defaultClientCallTimeout: half the kubelet's 90 s sync retry period

# chosen service -> (gRPC service path, message module)
_SERVICE_PATHS = {
    V1: ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/", dra_v1),
    V1BETA1: ("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/", dra_v1beta1),
    # v1alpha4 messages have v1beta1's field numbers; only the path differs.
    V1ALPHA3: ("/v1alpha3.Node/", dra_v1beta1),
}


class PluginValidationError(Exception):
    """The plugin's advertised services do not work with this kubelet; str() is the kubelet's text."""


def _go_string_list(values: Sequence[str]) -> str:
    """Go's %q of a []string: ["a" "b"]."""
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def choose_service(kubelet: str, driver: str, endpoint: str, supported: Sequence[str]) -> str:
    """The DRA service this kubelet (`"1.32"` or `"1.34"` behaviour) will call."""
    if kubelet == "1.32":
        if not supported:
            raise PluginValidationError(
                f"invalid versions of plugin {driver}: empty list of supported versions"
            )
        return next((s for s in KUBELET_132_SERVICES if s in supported), V1ALPHA3)
    if not supported:
        raise PluginValidationError(
            f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: "
            "empty list of supported gRPC services (aka supported versions)"
        )
    for service in supported:
        if service in KUBELET_134_SERVICES:
            return service
    raise PluginValidationError(
        f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: none of "
        f"services supported by the plugin ({_go_string_list(supported)}) are supported by the kubelet "
        f"({_go_string_list(KUBELET_134_SERVICES)})"
    )


class DraPluginError(Exception):
    """A failed call to a plugin; str() is the Go-style gRPC error text."""


@dataclass
class DraPlugin:
    driver: str
    endpoint: str  # the socket the DRA service is on
    service: str  # the chosen service, e.g. v1.DRAPlugin
    registration_socket: str
    record: RpcRecorder
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    registered_at: float = field(default_factory=time.monotonic)
    _channel: grpc.aio.Channel | None = None

    def __post_init__(self) -> None:
        self._channel = grpc.aio.insecure_channel(
            f"unix:{self.endpoint}", options=[("grpc.default_authority", "localhost")]
        )

    @property
    def messages(self) -> object:
        return _SERVICE_PATHS[self.service][1]

    async def call(self, method: str, request: Message, response_type: type[Message]) -> Message:
        """One unary call with the kubelet's timeout; DraPluginError on failure. Every call is recorded."""
        assert self._channel is not None
        prefix = _SERVICE_PATHS[self.service][0]
        stub = self._channel.unary_unary(
            prefix + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        started = time.monotonic()
        try:
            response = await stub(request, timeout=self.call_timeout)
        except grpc.aio.AioRpcError as err:
            text = go_rpc_error(err)
            self.record(
                RpcRecord(started, self.driver, method, request, None, text, time.monotonic() - started)
            )
            raise DraPluginError(text) from None
        self.record(
            RpcRecord(started, self.driver, method, request, response, None, time.monotonic() - started)
        )
        return response

    def watch_health(
        self,
    ) -> grpc.aio.UnaryStreamCall[
        health_pb2.NodeWatchResourcesRequest, health_pb2.NodeWatchResourcesResponse
    ]:
        """Open the DRAResourceHealth stream on the plugin's endpoint (no deadline: it lasts)."""
        assert self._channel is not None
        stub = self._channel.unary_stream(
            HEALTH_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=health_pb2.NodeWatchResourcesResponse.FromString,
        )
        return stub(health_pb2.NodeWatchResourcesRequest())

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None


class PluginStore:
    """The registered plugins per driver, as the kubelet of `kubelet` ("1.32" or "1.34") keeps them."""

    def __init__(self, kubelet: str) -> None:
        self.kubelet = kubelet
        self._plugins: dict[str, list[DraPlugin]] = {}

    def add(self, plugin: DraPlugin) -> list[DraPlugin]:
        """Store a registration; returns plugins it replaced (1.32), or raises (an endpoint taken, 1.34)."""
        current = self._plugins.setdefault(plugin.driver, [])
        if self.kubelet == "1.32":
            replaced = list(current)
            current[:] = [plugin]
            return replaced
        for old in current:
            if old.endpoint == plugin.endpoint:
                raise PluginValidationError(
                    f"endpoint {plugin.endpoint} already registered for DRA driver plugin {plugin.driver}"
                )
        current.append(plugin)
        return []

    def remove(self, driver: str, registration_socket: str) -> DraPlugin | None:
        plugins = self._plugins.get(driver, [])
        for i, plugin in enumerate(plugins):
            if plugin.registration_socket == registration_socket:
                del plugins[i]
                if not plugins:
                    del self._plugins[driver]
                return plugin
        return None

    def get(self, driver: str) -> DraPlugin:
        """The plugin the kubelet calls for `driver`: the newest registration."""
        plugins = self._plugins.get(driver)
        if not driver:
            raise DraPluginError("DRA driver name is empty")
        if not plugins:
            if self.kubelet == "1.32":
                raise DraPluginError(f"plugin name {driver} not found in the list of registered DRA plugins")
            raise DraPluginError(f"DRA driver {driver} is not registered")
        return plugins[-1]

    def usable(self, driver: str) -> bool:
        return bool(self._plugins.get(driver))

    def drivers(self) -> list[str]:
        return sorted(self._plugins)

    def clear(self) -> None:
        self._plugins.clear()

    def all(self) -> list[DraPlugin]:
        return [p for plugins in self._plugins.values() for p in plugins]
