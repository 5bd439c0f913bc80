"""ResourceServer: one resource's DevicePlugin gRPC service on its own unix socket.

The server owns nothing but the latest `Resource` it was given. `update()` swaps it in and wakes every open
ListAndWatch stream, which then sends the full list again. All request handling is delegated to the pure
functions in `allocate` and `preferred`; this module only translates between them and protobuf.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Protocol

import grpc

from kubegpu.allocation.allocate import (
    AllocateOptions,
    AllocationRequestError,
    ContainerAllocation,
    allocate_container,
    validate_request,
)
from kubegpu.allocation.preferred import PreferredAllocationError, preferred_devices
from kubegpu.allocation.resources import Resource
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.node.inventory import GpuLink

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext


class AllocationObserver(Protocol):
    """What the server reports about the requests it answers (PluginMetrics implements it)."""

    def allocated(self, resource: str, devices: int) -> None: ...

    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None: ...


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
        self.socket_path = plugin_dir / resource.socket_name
        self._options = options
        self._links = links
        self._metrics = metrics
        self._server: grpc.aio.Server | None = None
        self._socket_inode: int | None = None
        self._changed = asyncio.Condition()
        self._generation = 0

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

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a killed predecessor
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path.resolve()}")
        self._server = server  # before start(): a ListAndWatch may arrive as soon as it listens
        await server.start()
        self._socket_inode = os.stat(self.socket_path).st_ino
        log.info("serving %s on %s (%d devices)", self.name, self.socket_path, len(self.resource.devices))

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

    async def update(self, resource: Resource) -> bool:
        """Serve a new device list; returns True when the kubelet will see a change."""
        changed = device_list(resource) != device_list(self.resource)
        self.resource = resource
        if changed:
            async with self._changed:
                self._generation += 1
                self._changed.notify_all()
        return changed

    def _outdated(self, generation: int, server: grpc.aio.Server | None) -> bool:
        return self._generation != generation or self._server is not server

    # --- DevicePlugin service (signatures checked against the generated api_pb2_grpc.pyi) -------------

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context[api_pb2.Empty, api_pb2.DevicePluginOptions]
    ) -> api_pb2.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context[api_pb2.Empty, api_pb2.ListAndWatchResponse]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        server = self._server
        generation = self._generation
        log.info("kubelet opened ListAndWatch for %s", self.name)
        yield device_list(self.resource)
        while self._server is server and server is not None:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._outdated, generation, server))
            if self._server is not server:
                return
            generation = self._generation
            yield device_list(self.resource)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: Context[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse],
    ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        links = self._links()
        for req in request.container_requests:
            try:
                ids = preferred_devices(
                    self.resource,
                    links,
                    list(req.available_deviceIDs),
                    list(req.must_include_deviceIDs),
                    req.allocation_size,
                    policy=self._options.shared_allocation_policy,
                )
            except PreferredAllocationError as err:
                if self._metrics is not None:
                    self._metrics.allocation_failed(self.name, "GetPreferredAllocation")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self,
        request: api_pb2.AllocateRequest,
        context: Context[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        if not request.container_requests:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'invalid allocation request for "{self.name}": no container requests '
                "(the kubelet sends one per container)",
            )
        responses = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                validate_request(self.resource, ids)
            except AllocationRequestError as err:
                log.warning("refusing Allocate for %s: %s", self.name, err)
                if self._metrics is not None:
                    self._metrics.allocation_failed(self.name)
                code = grpc.StatusCode.UNKNOWN if err.nvidia_compatible else grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, str(err))
            responses.append(to_proto(allocate_container(self.resource, ids, self._options)))
            if self._metrics is not None:
                self._metrics.allocated(self.name, len(ids))
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: Context[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse],
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
