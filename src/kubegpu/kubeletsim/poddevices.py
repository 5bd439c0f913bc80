"""Which devices each pod's containers hold, with the Allocate response kept for each (Go: pod_devices.go)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kubegpu.api.v1beta1 import api_pb2

from .checkpoint import PodDeviceEntry
from .pods import RunContainerOptions

# Allocations per resource that a pod's init containers leave for its later containers.
ReusableDevices = dict[str, set[str]]


@dataclass(frozen=True, slots=True)
class ResourceAllocation:
    device_ids: Mapping[int, tuple[str, ...]]  # NUMA node (-1: none) -> ids
    response: api_pb2.ContainerAllocateResponse

    def ids(self) -> set[str]:
        return {d for ids in self.device_ids.values() for d in ids}


class PodDevices:
    def __init__(self) -> None:
        self._devs: dict[str, dict[str, dict[str, ResourceAllocation]]] = {}  # pod uid -> container -> res

    def pods(self) -> set[str]:
        return set(self._devs)

    def has_pod(self, pod_uid: str) -> bool:
        return pod_uid in self._devs

    def insert(self, pod_uid: str, container: str, resource: str, allocation: ResourceAllocation) -> None:
        self._devs.setdefault(pod_uid, {}).setdefault(container, {})[resource] = allocation

    def delete(self, pod_uids: set[str]) -> None:
        for uid in pod_uids:
            self._devs.pop(uid, None)

    def container_resources(self, pod_uid: str, container: str) -> dict[str, ResourceAllocation]:
        return dict(self._devs.get(pod_uid, {}).get(container, {}))

    def container_devices(self, pod_uid: str, container: str, resource: str) -> set[str] | None:
        """None when nothing is recorded (the kubelet distinguishes that from an empty set)."""
        allocation = self._devs.get(pod_uid, {}).get(container, {}).get(resource)
        return None if allocation is None else allocation.ids()

    def devices(self) -> dict[str, set[str]]:
        """Every device held by any recorded container, per resource."""
        held: dict[str, set[str]] = {}
        for containers in self._devs.values():
            for resources in containers.values():
                for resource, allocation in resources.items():
                    held.setdefault(resource, set()).update(allocation.ids())
        return held

    def add_container_allocated_resources(self, pod_uid: str, container: str, reuse: ReusableDevices) -> None:
        for resource, allocation in self.container_resources(pod_uid, container).items():
            reuse[resource] = reuse.get(resource, set()) | allocation.ids()

    def remove_container_allocated_resources(
        self, pod_uid: str, container: str, reuse: ReusableDevices
    ) -> None:
        for resource, allocation in self.container_resources(pod_uid, container).items():
            reuse[resource] = reuse.get(resource, set()) - allocation.ids()

    def to_checkpoint(self) -> tuple[PodDeviceEntry, ...]:
        return tuple(
            PodDeviceEntry(uid, container, resource, a.device_ids, a.response.SerializeToString())
            for uid, containers in self._devs.items()
            for container, resources in containers.items()
            for resource, a in resources.items()
        )

    @classmethod
    def from_checkpoint(cls, entries: tuple[PodDeviceEntry, ...]) -> PodDevices:
        pod_devices = cls()
        for e in entries:
            response = api_pb2.ContainerAllocateResponse.FromString(e.alloc_resp)
            pod_devices.insert(
                e.pod_uid, e.container_name, e.resource_name, ResourceAllocation(e.device_ids, response)
            )
        return pod_devices

    def run_container_options(self, pod_uid: str, container: str) -> RunContainerOptions:
        """Merge the container's Allocate responses like deviceRunContainerOptions: the first value wins for
        env keys, annotation keys, device and mount container paths and CDI names."""
        envs: dict[str, str] = {}
        annotations: dict[str, str] = {}
        devices: dict[str, api_pb2.DeviceSpec] = {}
        mounts: dict[str, api_pb2.Mount] = {}
        cdi: dict[str, None] = {}
        for allocation in self.container_resources(pod_uid, container).values():
            resp = allocation.response
            for k, v in resp.envs.items():
                envs.setdefault(k, v)
            for d in resp.devices:
                devices.setdefault(d.container_path, d)
            for m in resp.mounts:
                mounts.setdefault(m.container_path, m)
            for k, v in resp.annotations.items():
                annotations.setdefault(k, v)
            for c in resp.cdi_devices:
                cdi.setdefault(c.name, None)
        return RunContainerOptions(
            envs, tuple(devices.values()), tuple(mounts.values()), annotations, tuple(cdi)
        )
