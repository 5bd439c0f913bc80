"""The kubelet's PodResources API v1 (Go: pkg/kubelet/apis/podresources/server_v1.go, v1.32).

Answers from the simulator's own bookkeeping, the way the kubelet answers from its device manager:
- `List`: every admitted pod with its restartable init containers (sidecars) first, then its regular
  containers; ordinary init containers are left out. A container without devices is listed with none.
  Like the kubelet, each device is one `ContainerDevices` entry per NUMA node it was allocated on, without
  topology when the plugin reported none. `List` garbage-collects allocations of gone pods first, as the
  kubelet's does.
- `GetAllocatableResources`: every healthy device of every resource, in the same per-device shape.
- `Get`: the KubeletPodResourcesGet feature gate is off in v1.32, so it fails as the kubelet's does.
Resources and devices are sorted where the kubelet iterates Go maps (random order).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import grpc

from kubegpu.api.podresources.v1 import api_pb2, api_pb2_grpc

from .checkpoint import NO_NUMA_NODE
from .devicemanager import DeviceManager
from .devicesets import HEALTHY
from .pods import Container, Pod

log = logging.getLogger(__name__)

POD_RESOURCES_DIR = "pod-resources"
POD_RESOURCES_SOCKET = "kubelet.sock"
GET_DISABLED = "PodResources API Get method disabled"


def device_entries(
    resource: str, numa_by_device: Mapping[str, Iterable[int]]
) -> Iterator[api_pb2.ContainerDevices]:
    """The kubelet's containerDevicesFromResourceDeviceInstances: one entry per device and NUMA node."""
    for device_id in sorted(numa_by_device):
        nodes = sorted(set(numa_by_device[device_id]) - {NO_NUMA_NODE})
        if not nodes:
            yield api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])
        for node in nodes:
            yield api_pb2.ContainerDevices(
                resource_name=resource,
                device_ids=[device_id],
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
            )


def listed_containers(pod: Pod) -> list[Container]:
    """Sidecars (restartable init containers) first, then regular containers; other init containers run
    to completion before the pod starts and are not listed."""
    order = list(pod.in_start_order())
    sidecars = [c for c, is_init in order if is_init and c.restartable]
    return sidecars + [c for c, is_init in order if not is_init]


class PodResourcesServer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(
        self,
        socket: Path,
        *,
        pods: Callable[[], Iterable[Pod]],
        manager: Callable[[], DeviceManager | None],
    ) -> None:
        self.socket = socket
        self._pods = pods
        self._manager = manager
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)  # the kubelet removes a stale socket before it listens
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket.absolute()}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        self.socket.unlink(missing_ok=True)

    def _container_devices(self, pod: Pod, container: Container) -> list[api_pb2.ContainerDevices]:
        manager = self._manager()
        if manager is None:
            return []
        entries: list[api_pb2.ContainerDevices] = []
        for resource, allocation in sorted(manager.container_allocations(pod.uid, container.name).items()):
            numa_by_device: dict[str, list[int]] = {}
            for node, ids in allocation.device_ids.items():
                for device_id in ids:
                    numa_by_device.setdefault(device_id, []).append(node)
            entries.extend(device_entries(resource, numa_by_device))
        return entries

    async def List(
        self,
        request: api_pb2.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[api_pb2.ListPodResourcesRequest, api_pb2.ListPodResourcesResponse],
    ) -> api_pb2.ListPodResourcesResponse:
        manager = self._manager()
        if manager is not None:
            manager.update_allocated_devices()
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        api_pb2.ContainerResources(name=c.name, devices=self._container_devices(pod, c))
                        for c in listed_containers(pod)
                    ],
                )
                for pod in self._pods()
            ]
        )

    async def GetAllocatableResources(
        self,
        request: api_pb2.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.AllocatableResourcesRequest, api_pb2.AllocatableResourcesResponse
        ],
    ) -> api_pb2.AllocatableResourcesResponse:
        manager = self._manager()
        devices: list[api_pb2.ContainerDevices] = []
        if manager is not None:
            for resource in manager.resources():
                healthy = {
                    device_id: state.numa_nodes
                    for device_id, state in manager.devices(resource).items()
                    if state.health == HEALTHY
                }
                devices.extend(device_entries(resource, healthy))
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self,
        request: api_pb2.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[api_pb2.GetPodResourcesRequest, api_pb2.GetPodResourcesResponse],
    ) -> api_pb2.GetPodResourcesResponse:
        await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        return api_pb2.GetPodResourcesResponse()  # not reached: abort raises
