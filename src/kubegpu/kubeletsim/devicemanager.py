"""The kubelet's device manager (Go: cm/devicemanager/manager.go, v1.32): device sets per resource, the
checkpoint, capacity, and per-container allocation with its exact error texts.

Reproduced without the topology manager: the kubelet's default policy ("none") gives no NUMA hint, so
every available device is "no affinity" and the plugin's preferred allocation decides. Where the kubelet
would pick from a Go set (random order) we pick deterministically: devices on NUMA nodes the container
already uses first, then by NUMA node and ID.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kubegpu.api.v1beta1 import api_pb2

from .checkpoint import NO_NUMA_NODE, Checkpoint, read_checkpoint, write_checkpoint
from .endpoint import Endpoint, PluginClient
from .errors import DeviceManagerError
from .events import EventKind, EventLog
from .poddevices import PodDevices, ResourceAllocation, ReusableDevices
from .pods import Container, Pod, RunContainerOptions

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ENDPOINT_STOP_GRACE_PERIOD = 300.0  # endpointStopGracePeriod: 5 minutes

# gogo-protobuf's String() of an AllocateResponse without container responses, which the kubelet prints.
_EMPTY_ALLOCATE_RESPONSE = "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device as the kubelet sees it: `Healthy` only while its plugin is connected and reports it so."""

    health: str
    numa_nodes: tuple[int, ...] = ()


def describe_ids(ids: Iterable[str], limit: int = 3) -> str:
    ordered = sorted(ids)
    shown = ", ".join(ordered[:limit])
    return shown + (f" +{len(ordered) - limit} more" if len(ordered) > limit else "")


class DeviceManager:
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
        self.directory = directory
        self._events = events
        self._active_pods = active_pods
        self._on_change = on_change  # capacity may have changed: the node status should sync
        self._grace = stop_grace_period
        self._prestart_timeout = prestart_timeout
        self._endpoints: dict[str, Endpoint] = {}
        self._all_devices: dict[str, dict[str, api_pb2.Device]] = {}
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._allocated: dict[str, set[str]] = {}  # held by pods, plus picks of the allocation in progress
        self._pod_devices = PodDevices()
        self._devices_to_reuse: dict[str, ReusableDevices] = {}
        self._pending_pod: Pod | None = None
        self._timers: list[asyncio.TimerHandle] = []

    # ---- lifecycle ------------------------------------------------------------------------------

    def read_checkpoint(self) -> bool:
        """Restore allocations; every registered resource comes back empty with a stopped endpoint, so
        capacity is 0 until its plugin registers again. Returns whether a checkpoint existed."""
        try:
            checkpoint = read_checkpoint(self.directory)
        except ValueError as err:
            log.error("continuing without the device manager checkpoint: %s", err)
            return True  # it exists, so this is no new node (the kubelet does not reset capacity either)
        if checkpoint is None:
            return False
        self._pod_devices = PodDevices.from_checkpoint(checkpoint.pod_device_entries)
        self._allocated = self._pod_devices.devices()
        for resource in checkpoint.registered_devices:
            self._healthy[resource] = set()
            self._unhealthy[resource] = set()
            self._endpoints[resource] = Endpoint(resource, None, None)
            self._schedule_grace_check()
        return True

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    # ---- plugin side ----------------------------------------------------------------------------

    def plugin_connected(
        self, resource: str, client: PluginClient, options: api_pb2.DevicePluginOptions
    ) -> None:
        previous = self._endpoints.get(resource)
        self._endpoints[resource] = Endpoint(resource, client, options)
        yes_no = {True: "yes", False: "no"}
        replaced = f", replacing {previous}" if previous is not None and not previous.stopped else ""
        self._events.emit(
            EventKind.REGISTERED,
            f"registered {resource} (endpoint {client.socket.name}, "
            f"preferred allocation: {yes_no[options.get_preferred_allocation_available]}, "
            f"pre-start: {yes_no[options.pre_start_required]}{replaced})",
            resource,
            endpoint=client.socket.name,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
            pre_start_required=options.pre_start_required,
        )

    def plugin_list_and_watch(self, resource: str, response: api_pb2.ListAndWatchResponse) -> None:
        """Each message is the complete list: rebuild the resource's sets from scratch."""
        self._healthy[resource] = set()
        self._unhealthy[resource] = set()
        self._all_devices[resource] = {}
        for device in response.devices:
            self._all_devices[resource][device.ID] = device
            # Anything but exactly "Healthy" is unhealthy.
            (self._healthy if device.health == HEALTHY else self._unhealthy)[resource].add(device.ID)
        self._write_checkpoint()
        healthy, unhealthy = self._healthy[resource], self._unhealthy[resource]
        message = f"{resource}: capacity {len(healthy) + len(unhealthy)}, allocatable {len(healthy)}"
        if unhealthy:
            message += f" ({describe_ids(unhealthy)} {UNHEALTHY})"
        self._events.emit(
            EventKind.DEVICES_UPDATED,
            message,
            resource,
            devices=len(response.devices),
            healthy=len(healthy),
            unhealthy=sorted(unhealthy),
        )
        self._on_change()

    def plugin_disconnected(self, resource: str, kind: EventKind, why: str) -> None:
        """All devices of the resource become unhealthy and its endpoint stops (capacity stays)."""
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            return
        moved = self._healthy.get(resource, set())
        self._healthy[resource] = set()
        self._unhealthy[resource] = self._unhealthy.get(resource, set()) | moved
        endpoint.stop()
        self._schedule_grace_check()
        capacity = len(self._unhealthy[resource])
        self._events.emit(
            kind,
            f"{resource}: {why}; capacity {capacity}, allocatable 0 (every device {UNHEALTHY})",
            resource,
            reason=why,
            capacity=capacity,
            newly_unhealthy=len(moved),
        )
        self._on_change()

    def _schedule_grace_check(self) -> None:
        # The kubelet drops the resource at the first node-status sync after the grace period.
        loop = asyncio.get_running_loop()
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > loop.time()]
        self._timers.append(loop.call_later(self._grace + 0.001, self._on_change))

    # ---- node status ----------------------------------------------------------------------------

    def get_capacity(self) -> tuple[dict[str, int], dict[str, int], set[str]]:
        """(capacity, allocatable, removed) as GetCapacity: resources whose endpoint has been stopped
        longer than the grace period are deleted and reported as removed."""
        removed = {
            r
            for r in self._healthy.keys() | self._unhealthy.keys()
            if (e := self._endpoints.get(r)) is None or e.grace_period_expired(self._grace)
        }
        for resource in removed:
            self._endpoints.pop(resource, None)
            self._healthy.pop(resource, None)
            self._unhealthy.pop(resource, None)
            self._events.emit(
                EventKind.RESOURCE_REMOVED,
                f"{resource}: endpoint stopped for more than {self._grace:g} s; resource removed, capacity 0",
                resource,
            )
        if removed:
            self._write_checkpoint()
        allocatable = {r: len(ids) for r, ids in self._healthy.items()}
        capacity = dict(allocatable)
        for resource, ids in self._unhealthy.items():
            capacity[resource] = capacity.get(resource, 0) + len(ids)
        return capacity, allocatable, removed

    # ---- queries --------------------------------------------------------------------------------

    def resources(self) -> list[str]:
        """Resources with an endpoint: registered, stopped, or restored from the checkpoint."""
        return sorted(self._endpoints)

    def endpoint(self, resource: str) -> Endpoint | None:
        return self._endpoints.get(resource)

    def devices(self, resource: str) -> dict[str, DeviceState]:
        healthy = self._healthy.get(resource, set())
        return {
            device_id: DeviceState(
                HEALTHY if device_id in healthy else UNHEALTHY, tuple(n.ID for n in device.topology.nodes)
            )
            for device_id, device in sorted(self._all_devices.get(resource, {}).items())
        }

    def allocated(self) -> dict[str, set[str]]:
        return {r: set(ids) for r, ids in self._allocated.items()}

    def container_allocations(self, pod_uid: str, container: str) -> dict[str, ResourceAllocation]:
        return self._pod_devices.container_resources(pod_uid, container)

    def has_pod(self, pod_uid: str) -> bool:
        return self._pod_devices.has_pod(pod_uid)

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
        for resource, needed in container.limits.items():
            if not self.is_device_plugin_resource(resource):
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

    def _numa_nodes(self, resource: str, device: str) -> tuple[int, ...]:
        known = self._all_devices.get(resource, {}).get(device)
        return tuple(n.ID for n in known.topology.nodes) if known is not None else ()

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
        for resource, count in container.limits.items():
            if not self.is_device_plugin_resource(resource) or count == 0:
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

    # ---- checkpoint -----------------------------------------------------------------------------

    def _write_checkpoint(self) -> None:
        checkpoint = Checkpoint(
            self._pod_devices.to_checkpoint(),
            {r: tuple(sorted(ids)) for r, ids in self._healthy.items()},
        )
        try:
            write_checkpoint(self.directory, checkpoint)
        except OSError as err:
            log.error("writing the device manager checkpoint failed: %s", err)
