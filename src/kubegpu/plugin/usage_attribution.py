"""Whose processes use a GPU: each NVML process mapped to the container that holds the device.

A pure function of what the sampler read (NVML's processes per device, each process's pod UID and
container ID from its cgroup, the kubelet checkpoint's pod UIDs per device ID) and what PodResources says
now (which namespace/pod/container holds which device ID). It is right for:

- exclusive GPUs and MIG devices: one holder; a process whose cgroup could not be read is still its own
  (nothing else can run on a device no other container was given), one whose cgroup names another pod is
  not;
- time-sliced replicas and MPS: several holders of the same GPU; each process goes to the holder whose pod
  UID its cgroup names; without a readable cgroup it cannot be told apart and counts as unattributed;
- several containers of one pod on the same GPU: the cgroup names the pod but the container only by
  runtime ID, which neither PodResources nor the checkpoint know; such a process is the pod's, with an
  empty container label.

Processes that belong to no holder are counted in `Unattributed`, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kubegpu.node.proc_cgroup import ContainerRef
from kubegpu.node.usage import DeviceUse, ProcessUse
from kubegpu.plugin.kubelet_checkpoint import PodContainer


class Holder(NamedTuple):
    """A container holding one of our devices, as PodResources names it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    uuid: str  # the GPU or MIG device the device ID lives on


class Owner(NamedTuple):
    namespace: str
    pod: str
    container: str  # "" when the process's pod has several containers on the device


@dataclass
class OwnerUse:
    """What one container's processes use on one device."""

    used_bytes: int = 0
    sm_util: int | None = 0  # summed SM % of its processes; None where NVML keeps no per-process samples
    processes: int = 0

    def add(self, process: ProcessUse) -> None:
        self.used_bytes += process.used_bytes or 0
        self.sm_util = (
            None if self.sm_util is None or process.sm_util is None else self.sm_util + process.sm_util
        )
        self.processes += 1


@dataclass
class DeviceAttribution:
    device: DeviceUse
    owners: dict[Owner, OwnerUse] = field(default_factory=dict)
    unattributed: OwnerUse = field(default_factory=OwnerUse)


def attribute(
    devices: Iterable[DeviceUse],
    holders: Iterable[Holder],
    containers: Mapping[int, ContainerRef | None],
    device_pods: Mapping[tuple[str, str], PodContainer],
) -> list[DeviceAttribution]:
    """Every device's processes by owner. `containers`: pid -> its pod and container (None: in no pod;
    absent: unknown, the cgroup could not be read)."""
    by_uuid: dict[str, list[Holder]] = {}
    for h in holders:
        by_uuid.setdefault(h.uuid, []).append(h)
    out = []
    for device in devices:
        result = DeviceAttribution(device)
        here = by_uuid.get(device.uuid, [])
        owners = {Owner(h.namespace, h.pod, h.container) for h in here}
        uids: dict[str, set[Owner]] = {}
        for h in here:
            known = device_pods.get((h.resource, h.device_id))
            if known is not None:
                uids.setdefault(known.pod_uid, set()).add(Owner(h.namespace, h.pod, h.container))
        for process in device.processes:
            owner = _owner(process.pid, containers, owners, uids)
            use = result.unattributed if owner is None else result.owners.setdefault(owner, OwnerUse())
            use.add(process)
        out.append(result)
    return out


def _owner(
    pid: int,
    containers: Mapping[int, ContainerRef | None],
    owners: set[Owner],
    uids: Mapping[str, set[Owner]],
) -> Owner | None:
    if pid not in containers or not uids:  # cgroup or checkpoint unreadable: only a lone holder is sure
        return next(iter(owners)) if len(owners) == 1 else None
    ref = containers[pid]
    if ref is None:
        return None
    candidates = uids.get(ref.pod_uid, set())
    if len(candidates) == 1:
        return next(iter(candidates))
    if candidates:
        first = next(iter(candidates))
        return Owner(first.namespace, first.pod, "")
    return None
