"""ResourceServer: one resource's DevicePlugin gRPC service on its own unix socket.

The server owns nothing but the latest `Resource` it was given. `update()` swaps it in and wakes every open
ListAndWatch stream, which then sends the full list again. All request handling is delegated to the pure
functions in `allocate` and `preferred`; this module only translates between them and protobuf.

Whoever can reach the socket can send anything, so serving is bounded (`serving_limits`): a receive limit
sized to the largest request the kubelet can send, a cap on calls in flight, bodies that do not decode
answered INVALID_ARGUMENT (`rpc_table`), and refusals logged at a bounded rate. Refusals set the status
and return rather than raise (`context.abort`): a raised error's traceback keeps the handler's frame, and
with it the whole request, alive in a reference cycle until the garbage collector's next full pass, which
under a stream of large bad requests held hundreds of MB. The socket is the owner's alone (0600): the
kubelet connects as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from kubegpu.allocation.allocate import (
    AllocateOptions,
    AllocationRequestError,
    ContainerAllocation,
    allocate_container,
    validate_allocate,
)
from kubegpu.allocation.preferred import (
    PreferredAllocationError,
    preferred_devices,
    validate_container_count,
)
from kubegpu.allocation.resources import Resource
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.node.inventory import GpuLink
from kubegpu.plugin import rpc_table
from kubegpu.plugin.admission import (
    BACKSTOP_RPCS,
    MAX_STREAMS,
    MAX_UNARY_RPCS,
    STREAM,
    Admission,
    AdmissionInterceptor,
)
from kubegpu.plugin.rpc_table import Undecodable
from kubegpu.plugin.serving_limits import largest_request_bytes, receive_limit, server_options

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext
SOCKET_MODE = 0o600
# Any client decides how often these happen: a few lines a minute, the rest counted (and in the metrics).
REFUSALS = LogThrottle(log, interval_s=60.0, burst=5)
UNDECODABLE = LogThrottle(log, interval_s=60.0, burst=1)
# Every ListAndWatch opened is logged at most once a minute per resource, with how many were not; so are the
# calls refused because the socket is busy (counted in kubegpu_rpc_refusals_total, each one).
STREAM_OPENS = LogThrottle(log, interval_s=60.0, burst=1)
BUSY = LogThrottle(log, interval_s=60.0, burst=1)

M = TypeVar("M", bound=Message)


class AllocationObserver(Protocol):
    """What the server reports about the requests it answers (PluginMetrics implements it)."""

    def allocated(self, resource: str, devices: int) -> None: ...

    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None: ...

    def rpc_refused(self, resource: str, rpc: str, reason: str) -> None: ...


OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def device_list(resource: Resource) -> api_pb2.ListAndWatchResponse:
    devices = []
    for d in resource.devices:
        topology = None
        if d.numa_node is not None:
            topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa_node)])
        devices.append(api_pb2.Device(ID=d.id, health=d.health_text, topology=topology))
    return api_pb2.ListAndWatchResponse(devices=devices)


def to_proto(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=allocation.envs,
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.devices
        ],
        annotations=allocation.annotations,
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in allocation.cdi_devices],
    )


class ResourceServer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: Resource,
        plugin_dir: Path,
        options: AllocateOptions,
        links: Callable[[], Mapping[tuple[int, int], GpuLink]],
        metrics: AllocationObserver | None = None,
    ) -> None:
        self.resource = resource
        self._message = device_list(resource)  # what ListAndWatch sends, built once per change
        self.socket_path = plugin_dir / resource.socket_name
        self._options = options
        self._links = links
        self._metrics = metrics
        self._server: grpc.aio.Server | None = None
        self._socket_inode: int | None = None
        self._changed = asyncio.Condition()
        self._generation = 0
        self._receive_limit = 0
        self.incarnation = 0  # how many times it started: each incarnation registers with the kubelet once
        self.on_outgrown: Callable[[], None] | None = None  # set by the registrar that keeps it serving

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def options(self) -> AllocateOptions:
        return self._options

    @options.setter
    def options(self, options: AllocateOptions) -> None:
        """New Allocate options (a config reload) take effect for the next request; nothing restarts."""
        self._options = options

    @property
    def running(self) -> bool:
        return self._server is not None

    def socket_intact(self) -> bool:
        """True when our socket file is still the one we bound (the kubelet deletes it when it restarts)."""
        try:
            return os.stat(self.socket_path).st_ino == self._socket_inode
        except OSError:
            return False

    @property
    def receive_limit(self) -> int:
        """The largest request body the running server accepts (0 when not running)."""
        return self._receive_limit if self.running else 0

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a killed predecessor
        limit = receive_limit(len(self.resource.devices))
        admission = AdmissionInterceptor(Admission(), self._refused_call, lambda: len(self.resource.devices))
        server = grpc.aio.server(
            options=server_options(limit), interceptors=[admission], maximum_concurrent_rpcs=BACKSTOP_RPCS
        )
        rpc_table.add_to_server(self, server)
        with _umask(0o777 & ~SOCKET_MODE):  # gRPC binds and listens here: no moment with a wider mode
            server.add_insecure_port(f"unix://{self.socket_path.resolve()}")
        os.chmod(self.socket_path, SOCKET_MODE)
        self._server = server  # before start(): a ListAndWatch may arrive as soon as it listens
        self._receive_limit = limit
        await server.start()
        self._socket_inode = os.stat(self.socket_path).st_ino
        self.incarnation += 1
        log.info(
            "serving %s on %s (%d devices; requests up to %d KiB, %d calls and %d streams at once)",
            self.name,
            self.socket_path,
            len(self.resource.devices),
            limit // 1024,
            MAX_UNARY_RPCS,
            MAX_STREAMS,
        )

    async def restart(self) -> None:
        """Serve on a fresh socket: stop (if serving), then start.

        In that order, never overlapped: the old server's streams must have ended before the new one
        registers (the v1.32 kubelet tears a new registration down when an old stream ends after it), and
        gRPC unlinks a unix socket's path when its server shuts down, which would take the new socket."""
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        # Wake streams so they notice the stop, then cut whatever is left.
        async with self._changed:
            self._changed.notify_all()
        await server.stop(grace=None)
        if self.socket_intact():
            self.socket_path.unlink(missing_ok=True)
        self._socket_inode = None
        log.info("stopped serving %s", self.name)

    @property
    def outgrown(self) -> bool:
        """True when the kubelet could send a request naming all our devices that the server would refuse.

        The registrar then restarts the server (with a limit for the new count) and registers it again.
        """
        return self.running and largest_request_bytes(len(self.resource.devices)) > self._receive_limit

    async def update(self, resource: Resource) -> bool:
        """Serve a new device list; returns True when the kubelet will see a change."""
        message = device_list(resource)
        changed = message != self._message
        self.resource, self._message = resource, message
        if changed:
            async with self._changed:
                self._generation += 1
                self._changed.notify_all()
        if self.outgrown and self.on_outgrown is not None:
            self.on_outgrown()
        return changed

    def _outdated(self, generation: int, server: grpc.aio.Server | None) -> bool:
        return self._generation != generation or self._server is not server

    # --- DevicePlugin service (signatures checked against the generated api_pb2_grpc.pyi) -------------

    async def GetDevicePluginOptions(
        self,
        request: api_pb2.Empty | Undecodable,
        context: Context[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        if isinstance(request, Undecodable):
            return self._undecodable(
                "GetDevicePluginOptions", request, context, api_pb2.DevicePluginOptions()
            )
        return OPTIONS

    async def ListAndWatch(
        self,
        request: api_pb2.Empty | Undecodable,
        context: Context[api_pb2.Empty, api_pb2.ListAndWatchResponse],
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        if isinstance(request, Undecodable):
            self._undecodable("ListAndWatch", request, context, api_pb2.Empty())
            return
        server = self._server
        generation = self._generation
        yield self._message  # first, and logged after: the kubelet has no devices until it arrives
        STREAM_OPENS.log(logging.INFO, self.name, "kubelet opened ListAndWatch for %s", self.name)
        while self._server is server and server is not None:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._outdated, generation, server))
            if self._server is not server:
                return
            generation = self._generation
            yield self._message

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest | Undecodable,
        context: Context[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse],
    ) -> api_pb2.PreferredAllocationResponse:
        rpc, empty = "GetPreferredAllocation", api_pb2.PreferredAllocationResponse()
        if isinstance(request, Undecodable):
            return self._undecodable(rpc, request, context, empty)
        responses = []
        links = self._links()
        try:
            validate_container_count(self.resource, len(request.container_requests))
            for req in request.container_requests:
                ids = preferred_devices(
                    self.resource,
                    links,
                    req.available_deviceIDs,
                    req.must_include_deviceIDs,
                    req.allocation_size,
                    policy=self._options.shared_allocation_policy,
                )
                responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        except PreferredAllocationError as err:
            return self._refuse(rpc, grpc.StatusCode.INVALID_ARGUMENT, str(err), context, empty)
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self,
        request: api_pb2.AllocateRequest | Undecodable,
        context: Context[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        rpc, empty = "Allocate", api_pb2.AllocateResponse()
        if isinstance(request, Undecodable):
            return self._undecodable(rpc, request, context, empty)
        containers = request.container_requests
        try:
            validate_allocate(self.resource, [req.devices_ids for req in containers])
        except AllocationRequestError as err:
            code = grpc.StatusCode.UNKNOWN if err.nvidia_compatible else grpc.StatusCode.INVALID_ARGUMENT
            return self._refuse(rpc, code, str(err), context, empty)
        responses = []
        for req in containers:
            ids = list(req.devices_ids)
            responses.append(to_proto(allocate_container(self.resource, ids, self._options)))
            if self._metrics is not None:
                self._metrics.allocated(self.name, len(ids))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest | Undecodable,
        context: Context[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse],
    ) -> api_pb2.PreStartContainerResponse:
        if isinstance(request, Undecodable):
            return self._undecodable(
                "PreStartContainer", request, context, api_pb2.PreStartContainerResponse()
            )
        return api_pb2.PreStartContainerResponse()

    # --- refusals: status set and an empty message returned, never raised (see the module docstring) -----

    def _refused_call(self, rpc: str, kind: str) -> str:
        """A call over its admission limit: counted, logged at a bounded rate; returns the status details."""
        if kind == STREAM:
            message = (
                f"{rpc} for {self.name}: {MAX_STREAMS} streams are open on this socket, the most it "
                "serves; close one (the kubelet needs only its own)"
            )
        else:
            message = (
                f"{rpc} for {self.name}: {MAX_UNARY_RPCS} calls are in flight on this socket, the most it "
                "serves at once; retry when one has finished"
            )
        if self._metrics is not None:
            self._metrics.rpc_refused(self.name, rpc, "busy")
        BUSY.warning(f"{rpc} {self.name}", "refusing %s", message)
        return message

    def _refuse(
        self, rpc: str, code: grpc.StatusCode, message: str, context: Context[Any, Any], empty: M
    ) -> M:
        if self._metrics is not None:
            self._metrics.allocation_failed(self.name, rpc)
        REFUSALS.warning(f"{rpc} {self.name}", "refusing %s for %s: %s", rpc, self.name, message)
        context.set_code(code)
        context.set_details(message)
        return empty

    def _undecodable(self, rpc: str, request: Undecodable, context: Context[Any, Any], empty: M) -> M:
        if self._metrics is not None and rpc in ("Allocate", "GetPreferredAllocation"):
            self._metrics.allocation_failed(self.name, rpc)
        message = f"{rpc} for {self.name}: {request.describe()}"
        UNDECODABLE.warning("undecodable", "refusing %s", message)
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(message)
        return empty


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """The process umask narrowed for one synchronous call; everything else we write sets its mode itself."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)
