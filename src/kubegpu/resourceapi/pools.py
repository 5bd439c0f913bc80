"""Resource pools as the scheduler gathers them for one node (structured.GatherPools).

A pool is every slice with the same driver and pool name that the node can reach. Only slices of the
pool's highest generation count (older ones are being replaced); the pool is incomplete while fewer than
`resourceSliceCount` of them are published, and invalid when two of its slices name the same device.
The scheduler still picks single devices from an incomplete pool but refuses "All" from one; nobody may
pick from an invalid pool. Pools come out sorted by driver and name, their slices by name, so first fit
is deterministic (the scheduler's order is Go map order, which is random).

With partitionable devices (KEP-4815) a pool also carries its counter sets. A slice holding
`sharedCounters` (a counters-only slice: since 1.35 a slice holds counters or devices, never both) belongs
to every node's view of its pool whatever its node selection says, and its devices, if any, are not
offered. The pool is invalid when a counter set is named twice or a device consumes from a counter set
or counter the pool does not have. When the node reaches only part of the pool, the slices it does not
reach are kept aside (`unreached`): their allocated devices consume counters too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model import CounterSet, Device, DeviceID, ResourceSlice
from .nodes import Node, reachable


@dataclass(frozen=True, slots=True)
class Pool:
    driver: str
    name: str
    slices: tuple[ResourceSlice, ...]
    incomplete: bool
    invalid_reason: str = ""
    counter_sets: tuple[CounterSet, ...] = ()
    unreached: tuple[ResourceSlice, ...] = ()  # same generation, not reaching the node

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def generation(self) -> int:
        return self.slices[0].generation

    def devices(self) -> Iterable[tuple[DeviceID, Device, ResourceSlice]]:
        """The devices offered to the node, in slice order (counters-only slices offer none)."""
        for slice_ in self.slices:
            if slice_.counter_sets:
                continue
            for device in slice_.devices:
                yield DeviceID(self.driver, self.name, device.name), device, slice_

    def all_devices(self) -> Iterable[tuple[DeviceID, Device]]:
        """Every device of the pool, those of slices not reaching the node included (counters)."""
        for slice_ in (*self.slices, *self.unreached):
            if slice_.counter_sets:
                continue
            for device in slice_.devices:
                yield DeviceID(self.driver, self.name, device.name), device


def _reaches(slice_: ResourceSlice, node: Node) -> bool:
    if slice_.node_name or slice_.all_nodes or slice_.node_selector is not None:
        return reachable(node, slice_.node_name, slice_.all_nodes, slice_.node_selector)
    if slice_.per_device_node_selection:
        return any(reachable(node, d.node_name, d.all_nodes, d.node_selector) for d in slice_.devices)
    return False  # some future way of saying where the devices are: not ours to guess


def gather_pools(
    slices: Iterable[ResourceSlice], node: Node, *, partitionable_devices: bool = False
) -> list[Pool]:
    slices = list(slices)
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for slice_ in slices:
        if not partitionable_devices and (slice_.shared_counters or slice_.per_device_node_selection):
            continue
        if slice_.shared_counters:
            # Always relevant to the nodes it is published for (the scheduler only looks at the slices
            # of the node and those without a nodeName).
            if slice_.node_name not in ("", node.name):
                continue
        elif not _reaches(slice_, node):
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
        generation = members[0].generation
        same = [s for s in slices if s.driver == driver and s.pool == name]
        everything = [s for s in same if s.generation == generation]
        complete = len(members) == members[0].slice_count or len(everything) == members[0].slice_count
        if not complete and any(s.generation > generation for s in same):
            continue  # a newer generation the node does not reach is replacing this one
        seen = {s.name for s in members}
        unreached = tuple(sorted((s for s in everything if s.name not in seen), key=lambda s: s.name))
        counter_sets = tuple(c for s in members if s.counter_sets for c in s.counter_sets)
        pools.append(
            Pool(
                driver,
                name,
                tuple(members),
                not complete,
                # An incomplete pool's counter sets may still be on their way: not checked until complete.
                _invalid_reason(members, unreached, counter_sets, partitionable_devices and complete),
                counter_sets,
                unreached if partitionable_devices else (),
            )
        )
    return pools


def _invalid_reason(
    slices: list[ResourceSlice],
    unreached: tuple[ResourceSlice, ...],
    counter_sets: tuple[CounterSet, ...],
    partitionable: bool,
) -> str:
    seen: set[str] = set()
    for slice_ in slices:
        if slice_.counter_sets and partitionable:
            continue
        for device in slice_.devices:
            if device.name in seen:
                return f"duplicate device name {device.name}"
            seen.add(device.name)
    if not partitionable:
        return ""
    sets: dict[str, CounterSet] = {}
    for counter_set in counter_sets:
        if counter_set.name in sets:
            return f"duplicate counter set name {counter_set.name}"
        sets[counter_set.name] = counter_set
    for slice_ in (*slices, *unreached):
        for device in slice_.devices:
            for consumption in device.consumes_counters:
                target = sets.get(consumption.counter_set)
                if target is None:
                    return f"counter set {consumption.counter_set} not found"
                for counter in consumption.counters:
                    if counter not in target.counters:
                        return f"counter {counter} not found in counter set {target.name}"
    return ""
