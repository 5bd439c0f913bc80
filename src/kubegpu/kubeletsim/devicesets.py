"""The kubelet device manager's device sets (Go: cm/devicemanager/manager.go, v1.32): per resource its
endpoint, healthy and unhealthy devices and capacity, as the plugins report them, and the checkpoint.

A plugin's ListAndWatch message is the complete list; a disconnected plugin's devices turn unhealthy
and its endpoint stops; a resource whose endpoint stays stopped past the grace period is removed at the
next capacity sync. Allocation on top of these sets is `devicemanager.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kubegpu.api.v1beta1 import api_pb2

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .endpoint import Endpoint, PluginClient
from .events import EventKind, EventLog
from .poddevices import PodDevices, ResourceAllocation

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ENDPOINT_STOP_GRACE_PERIOD = 300.0  # endpointStopGracePeriod: 5 minutes


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device as the kubelet sees it: `Healthy` only while its plugin is connected and reports it so."""

    health: str
    numa_nodes: tuple[int, ...] = ()


def describe_ids(ids: Iterable[str], limit: int = 3) -> str:
    ordered = sorted(ids)
    shown = ", ".join(ordered[:limit])
    return shown + (f" +{len(ordered) - limit} more" if len(ordered) > limit else "")


class DeviceSets:
    """The devices of every resource and the pods' allocations of them, kept in the checkpoint."""

    def __init__(
        self,
        directory: Path,
        events: EventLog,
        *,
        on_change: Callable[[], None],
        stop_grace_period: float = ENDPOINT_STOP_GRACE_PERIOD,
    ) -> None:
        self.directory = directory
        self._events = events
        self._on_change = on_change  # capacity may have changed: the node status should sync
        self._grace = stop_grace_period
        self._endpoints: dict[str, Endpoint] = {}
        self._all_devices: dict[str, dict[str, api_pb2.Device]] = {}
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._allocated: dict[str, set[str]] = {}  # held by pods, plus picks of the allocation in progress
        self._pod_devices = PodDevices()
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

    def _numa_nodes(self, resource: str, device: str) -> tuple[int, ...]:
        known = self._all_devices.get(resource, {}).get(device)
        return tuple(n.ID for n in known.topology.nodes) if known is not None else ()

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
