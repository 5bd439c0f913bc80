"""Resource pools as the scheduler gathers them for one node (structured.GatherPools).

A pool is every slice with the same driver and pool name that the node can reach. Only slices of the
pool's highest generation count (older ones are being replaced); the pool is incomplete while fewer than
`resourceSliceCount` of them are published, and invalid when two of its slices name the same device.
The scheduler still picks single devices from an incomplete pool but refuses "All" from one; nobody may
pick from an invalid pool. Pools come out sorted by driver and name, their slices by name, so first fit
is deterministic (the scheduler's order is Go map order, which is random).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model import Device, DeviceID, ResourceSlice
from .nodes import Node, reachable


@dataclass(frozen=True, slots=True)
class Pool:
    driver: str
    name: str
    slices: tuple[ResourceSlice, ...]
    incomplete: bool
    invalid_reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def generation(self) -> int:
        return self.slices[0].generation

    def devices(self) -> Iterable[tuple[DeviceID, Device, ResourceSlice]]:
        for slice_ in self.slices:
            for device in slice_.devices:
                yield DeviceID(self.driver, self.name, device.name), device, slice_


def _reaches(slice_: ResourceSlice, node: Node) -> bool:
    if slice_.node_name or slice_.all_nodes or slice_.node_selector is not None:
        return reachable(node, slice_.node_name, slice_.all_nodes, slice_.node_selector)
    if slice_.per_device_node_selection:
        return any(reachable(node, d.node_name, d.all_nodes, d.node_selector) for d in slice_.devices)
    return False  # some future way of saying where the devices are: not ours to guess


def gather_pools(
    slices: Iterable[ResourceSlice], node: Node, *, partitionable_devices: bool = False
) -> list[Pool]:
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for slice_ in slices:
        if not partitionable_devices and (slice_.shared_counters or slice_.per_device_node_selection):
            continue
        if not _reaches(slice_, node):
            continue
        current = by_pool.setdefault((slice_.driver, slice_.pool), [])
        if current and slice_.generation < current[0].generation:
            continue  # out of date
        if current and slice_.generation > current[0].generation:
            current.clear()  # a newer generation replaces every older slice
        current.append(slice_)
    pools = []
    for (driver, name), members in sorted(by_pool.items()):
        members.sort(key=lambda s: s.name)
        pools.append(
            Pool(
                driver, name, tuple(members), len(members) != members[0].slice_count, _invalid_reason(members)
            )
        )
    return pools


def _invalid_reason(slices: list[ResourceSlice]) -> str:
    seen: set[str] = set()
    for slice_ in slices:
        for device in slice_.devices:
            if device.name in seen:
                return f"duplicate device name {device.name}"
            seen.add(device.name)
    return ""
