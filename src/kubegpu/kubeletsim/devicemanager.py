"""The kubelet's device manager (Go: cm/devicemanager/manager.go, v1.32): per-container allocation.

The device sets per resource, capacity and the checkpoint it allocates from are `devicesets.py`; this
module adds Allocate, GetPreferredAllocation and PreStartContainer with the kubelet's exact error texts.

Reproduced without the topology manager: the kubelet's default policy ("none") gives no NUMA hint, so
every available device is "no affinity" and the plugin's preferred allocation decides. Where the kubelet
would pick from a Go set (random order) we pick deterministically: devices on NUMA nodes the container
already uses first, then by NUMA node and ID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from .checkpoint import NO_NUMA_NODE
from .devicesets import ENDPOINT_STOP_GRACE_PERIOD, DeviceSets
from .errors import DeviceManagerError
from .events import EventLog
from .poddevices import ResourceAllocation, ReusableDevices
from .pods import Container, Pod, RunContainerOptions

# gogo-protobuf's String() of an AllocateResponse without container responses, which the kubelet prints.
_EMPTY_ALLOCATE_RESPONSE = "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"


class DeviceManager(DeviceSets):
    """Allocation and container start on top of the device sets: Allocate, GetPreferredAllocation and
    PreStartContainer calls to the plugins, with the kubelet's error texts."""

    def __init__(
        self,
        directory: Path,
        events: EventLog,
        *,
        active_pods: Callable[[], Iterable[Pod]],
        on_change: Callable[[], None],
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD,
        prestart_timeout: float = 30.0,
    ) -> None:
        super().__init__(directory, events, on_change=on_change, stop_grace_period=stop_grace_period)
        self._active_pods = active_pods
        self._prestart_timeout = prestart_timeout
        self._devices_to_reuse: dict[str, ReusableDevices] = {}
        self._pending_pod: Pod | None = None

    # ---- allocation -----------------------------------------------------------------------------

    def is_device_plugin_resource(self, resource: str) -> bool:
        """Registered now (or restored from the checkpoint), or held by some pod."""
        return resource in self._healthy or resource in self._allocated

    def set_pending_admission(self, pod: Pod | None) -> None:
        self._pending_pod = pod

    def release_pod(self, pod_uid: str) -> None:
        """Forget a pod's devices now (the kubelet does it lazily, at the next allocation)."""
        self._pod_devices.delete({pod_uid})
        self._allocated = self._pod_devices.devices()
        self._devices_to_reuse.pop(pod_uid, None)
        self._write_checkpoint()

    async def allocate(self, pod: Pod, container: Container, is_init: bool) -> None:
        """Allocate every device-plugin resource in the container's limits (ManagerImpl.Allocate)."""
        reuse = self._devices_to_reuse.setdefault(pod.uid, {})
        for uid in list(self._devices_to_reuse):
            if uid != pod.uid:
                del self._devices_to_reuse[uid]
        await self._allocate_container_resources(pod, container, reuse)
        if is_init and not container.restartable:
            # A finished init container's devices are handed on to the pod's later containers.
            self._pod_devices.add_container_allocated_resources(pod.uid, container.name, reuse)
        else:
            self._pod_devices.remove_container_allocated_resources(pod.uid, container.name, reuse)

    def update_allocated_devices(self) -> None:
        """Garbage-collect allocations of pods that are neither active nor being admitted."""
        keep = {p.uid for p in self._active_pods()}
        if self._pending_pod is not None:
            keep.add(self._pending_pod.uid)
        stale = self._pod_devices.pods() - keep
        if stale:
            self._pod_devices.delete(stale)
            self._allocated = self._pod_devices.devices()

    async def _allocate_container_resources(
        self, pod: Pod, container: Container, reuse: ReusableDevices
    ) -> None:
        collected = False
        needs_checkpoint = False
        through_dra = pod.dra_extended_resources()
        for resource, needed in container.limits.items():
            if not self.is_device_plugin_resource(resource) or resource in through_dra:
                continue
            if not collected:
                self.update_allocated_devices()
                collected = True
            devices = await self._devices_to_allocate(
                pod.uid, container.name, resource, needed, reuse.get(resource, set())
            )
            if not devices:
                continue
            needs_checkpoint = True
            endpoint = self._endpoints.get(resource)
            if endpoint is None:
                self._allocated = self._pod_devices.devices()
                raise DeviceManagerError(f"unknown Device Plugin {resource}")
            try:
                response = await endpoint.allocate(sorted(devices))
            except DeviceManagerError:
                self._allocated = self._pod_devices.devices()
                raise
            if not response.container_responses:
                raise DeviceManagerError(
                    f"no containers return in allocation response {_EMPTY_ALLOCATE_RESPONSE}"
                )
            self._pod_devices.insert(
                pod.uid,
                container.name,
                resource,
                ResourceAllocation(self._by_numa(resource, devices), response.container_responses[0]),
            )
        if needs_checkpoint:
            self._write_checkpoint()

    async def _devices_to_allocate(
        self, pod_uid: str, container: str, resource: str, required: int, reusable: set[str]
    ) -> set[str] | None:
        needed = required
        previous = self._pod_devices.container_devices(pod_uid, container, resource)
        if previous is not None:
            needed -= len(previous)
            if needed != 0:
                raise DeviceManagerError(
                    f'pod "{pod_uid}" container "{container}" changed request for resource "{resource}" '
                    f"from {len(previous)} to {required}"
                )
        healthy = self._healthy.get(resource)
        if healthy is None:
            raise DeviceManagerError(f"cannot allocate unregistered device {resource}")
        if not healthy:
            raise DeviceManagerError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        if previous is not None and not previous <= healthy:
            raise DeviceManagerError(
                "previously allocated devices are no longer healthy; "
                f"cannot allocate unhealthy devices {resource}"
            )
        if needed == 0:
            return None

        allocated: set[str] = set()
        in_use = self._allocated.setdefault(resource, set())

        def allocate_remaining_from(candidates: set[str]) -> bool:
            nonlocal needed
            for device in self._fill_order(resource, candidates - allocated, allocated):
                in_use.add(device)
                allocated.add(device)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if allocate_remaining_from(reusable):
            return allocated
        available = healthy - in_use
        if len(available) < needed:
            raise DeviceManagerError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        # No topology-manager hint: nothing is "aligned", every available device has "no affinity".
        preferred = await self._preferred_allocation(resource, available | allocated, allocated, required)
        if allocate_remaining_from(preferred & available) or allocate_remaining_from(available):
            return allocated
        raise DeviceManagerError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )

    async def _preferred_allocation(
        self, resource: str, available: set[str], must_include: set[str], size: int
    ) -> set[str]:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.get_preferred_allocation_available:
            return set()
        try:
            response = await endpoint.get_preferred_allocation(sorted(available), sorted(must_include), size)
        except DeviceManagerError as err:
            raise DeviceManagerError(
                f"device plugin GetPreferredAllocation rpc failed with err: {err}"
            ) from None
        return set(response.container_responses[0].deviceIDs) if response.container_responses else set()

    def _fill_order(self, resource: str, candidates: set[str], chosen: set[str]) -> list[str]:
        used = {n for d in chosen for n in self._numa_nodes(resource, d)}

        def key(device: str) -> tuple[bool, int, str]:
            nodes = self._numa_nodes(resource, device)
            return (bool(used) and not used.intersection(nodes), min(nodes, default=1 << 30), device)

        return sorted(candidates, key=key)

    def _by_numa(self, resource: str, devices: set[str]) -> dict[int, tuple[str, ...]]:
        per_node: dict[int, list[str]] = {}
        for device in sorted(devices):
            for node in self._numa_nodes(resource, device) or (NO_NUMA_NODE,):
                per_node.setdefault(node, []).append(device)
        return {node: tuple(ids) for node, ids in per_node.items()}

    # ---- container start ------------------------------------------------------------------------

    async def run_container_options(
        self, pod: Pod, container: Container, is_init: bool
    ) -> RunContainerOptions:
        """PreStartContainer where required, then the merged Allocate responses.

        Go: GetDeviceRunContainerOptions."""
        needs_reallocate = False
        through_dra = pod.dra_extended_resources()
        for resource, count in container.limits.items():
            if not self.is_device_plugin_resource(resource) or count == 0 or resource in through_dra:
                continue
            await self._pre_start_if_needed(pod.uid, container.name, resource)
            if pod.uid not in {p.uid for p in self._active_pods()}:
                continue
            if self._pod_devices.container_devices(pod.uid, container.name, resource) is None:
                needs_reallocate = True  # no cached allocation (a race after node restart): allocate again
        if needs_reallocate:
            await self.allocate(pod, container, is_init)
        return self._pod_devices.run_container_options(pod.uid, container.name)

    async def _pre_start_if_needed(self, pod_uid: str, container: str, resource: str) -> None:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.pre_start_required:
            return
        devices = self._pod_devices.container_devices(pod_uid, container, resource)
        if devices is None:
            raise DeviceManagerError(
                f"no devices found allocated in local cache for pod {pod_uid}, container {container}, "
                f"resource {resource}"
            )
        try:
            await endpoint.pre_start_container(sorted(devices), self._prestart_timeout)
        except DeviceManagerError as err:
            raise DeviceManagerError(f"device plugin PreStartContainer rpc failed with err: {err}") from None
