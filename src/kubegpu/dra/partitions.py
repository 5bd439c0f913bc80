"""DynamicMIG's devices as NVIDIA's DRA driver publishes them: every possible MIG partition, with counters.

A pure function of the inventory and each GPU's MIG profile table (`MigProfile`, read from NVML by
`dra.dynamic_mig`). For each GPU in MIG mode:

- one counter set `gpu-<minor>-counter-set` with NVIDIA's counters: `memory` (bytes), `multiprocessors`,
  `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`, each the largest any one profile
  takes, and `memory-slice-<i>` = 1 for each of the GPU's memory slices;
- one device per profile and possible placement, `gpu-<minor>-mig-<profile without dots>-<GI profile
  ID>-<placement start>`, with `type: mig`, `parentUUID`, `profile` and the parent's attributes but no
  `uuid` (it does not exist until Prepare creates it), the profile's capacities, and one
  `consumesCounters` entry on its GPU's set: its capacities as counters plus the memory slices of its
  placement. Two partitions whose placements overlap both need one memory slice (of capacity 1), so the
  scheduler never allocates both; engines and SMs bound what memory slices alone do not (one +me).

NVIDIA's A100 rule, for every architecture here: the driver never toggles MIG mode, so a GPU in MIG mode
publishes its partitions only (not the full GPU: CUDA cannot use it while MIG is on), and a GPU with MIG
off publishes the full GPU only, without counters. `full_gpu_consumption` is what NVIDIA's full GPU
consumes on Hopper (every counter in full), kept so the exclusion is checked against NVIDIA's shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.dra.devices import (
    DEFAULT_DRIVER_NAME,
    binary_si,
    engine_capacities,
    gpu_attributes,
    health_taint,
)
from kubegpu.dra.slices import counters_entry
from kubegpu.node.inventory import Gpu, Inventory, MigEngines

NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")  # NVIDIA's parse regex for MIG device names
# Kubernetes limits a device to 2 counter consumptions and a slice to 8 counter sets (resource.k8s.io/v1).
MAX_COUNTER_SETS_PER_SLICE = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a GPU whose compute instance spans it, with its possible placements."""

    name: str  # go-nvlib's profile string, e.g. "1g.10gb", "1g.10gb+me"
    gi_profile_id: int  # NVML's GPU instance profile ID (`nvidia-smi mig -lgip`'s ID column)
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning the GPU instance
    memory_bytes: int
    engines: MigEngines
    placement_size: int  # memory slices
    placements: tuple[int, ...]  # first memory slice of each possible placement

    def capacities(self) -> dict[str, int]:
        """NVIDIA's capacity names (camelCase) and values."""
        return {**engine_capacities(self.engines), "memory": self.memory_bytes}


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition device: a profile at a placement on a GPU. It exists on the GPU only while prepared."""

    gpu: Gpu
    profile: MigProfile
    start: int

    @property
    def name(self) -> str:
        return partition_name(self.gpu.minor, self.profile, self.start)

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.placement_size)


def partition_name(minor: int, profile: MigProfile, start: int) -> str:
    """`gpu-<minor>-mig-<profile>-<GI profile ID>-<start>`; the profile without dots, lower-cased, anything
    outside [a-z0-9-.] a dash (so `1g.10gb+me` is `1g10gb-me`)."""
    text = re.sub(r"[^a-z0-9-.]", "-", profile.name.replace(".", "").lower())
    return f"gpu-{minor}-mig-{text}-{profile.gi_profile_id}-{start}"


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def _dns(name: str) -> str:
    """camelCase capacity name -> DNS-style counter name (copyEngines -> copy-engines)."""
    return re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), name)


def counter_values(profiles: Sequence[MigProfile]) -> dict[str, int]:
    """The GPU's counters: each dimension's largest value over its profiles, then one per memory slice."""
    out: dict[str, int] = {}
    for profile in profiles:
        for name, value in profile.capacities().items():
            out[_dns(name)] = max(out.get(_dns(name), 0), value)
    slices = max((p.placement_size for p in profiles), default=0)
    out.update({f"memory-slice-{i}": 1 for i in range(slices)})
    return out


def consumption(partition: Partition) -> dict[str, int]:
    """What a partition takes of its GPU's counters."""
    out = {_dns(name): value for name, value in partition.profile.capacities().items()}
    out.update({f"memory-slice-{i}": 1 for i in partition.memory_slices})
    return out


def full_gpu_consumption(profiles: Sequence[MigProfile]) -> dict[str, int]:
    """NVIDIA's full GPU on a MIG-capable Hopper: every counter of its set, in full."""
    return counter_values(profiles)


def partitions(gpu: Gpu, profiles: Sequence[MigProfile]) -> list[Partition]:
    """Every possible partition of the GPU, in device-name order (the scheduler takes the first that fits)."""
    found = [Partition(gpu, p, start) for p in profiles for start in p.placements]
    return sorted(found, key=lambda d: d.name)


def _counters(values: Mapping[str, int]) -> dict[str, dict[str, str]]:
    return {name: {"value": binary_si(value)} for name, value in values.items()}


def counter_set(gpu: Gpu, profiles: Sequence[MigProfile]) -> dict[str, Any]:
    """The GPU's `sharedCounters` entry."""
    return {"name": counter_set_name(gpu), "counters": _counters(counter_values(profiles))}


def partition_entry(
    partition: Partition, inventory: Inventory, driver_name: str = DEFAULT_DRIVER_NAME
) -> dict[str, Any]:
    """The v1 `Device` of a partition: NVIDIA's attributes (no `uuid`), capacities and consumption, and its
    GPU's taint when the GPU is unhealthy."""
    gpu = partition.gpu
    attributes = {
        "type": {"string": "mig"},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": partition.profile.name},
        **gpu_attributes(gpu, inventory),
    }
    entry: dict[str, Any] = {
        "name": partition.name,
        "attributes": attributes,
        "capacity": {k: {"value": binary_si(v)} for k, v in partition.profile.capacities().items()},
        "consumesCounters": [
            {"counterSet": counter_set_name(gpu), "counters": _counters(consumption(partition))}
        ],
    }
    taint = health_taint(gpu.health, driver_name)
    if taint is not None:
        entry["taints"] = [taint]
    return entry


@dataclass(frozen=True, slots=True)
class PartitionedNode:
    """What a node with DynamicMIG publishes: its counter sets and its partition devices, by GPU."""

    counter_sets: list[dict[str, Any]]
    devices: list[dict[str, Any]]


def partitioned_node(
    inventory: Inventory,
    tables: Mapping[str, Sequence[MigProfile]],
    gpus: Sequence[Gpu],
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> PartitionedNode:
    """The counter sets and partition devices of `gpus` (those in MIG mode with a profile table, by UUID),
    GPUs by PCI bus ID as NVIDIA orders them."""
    sets: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    for gpu in sorted(gpus, key=lambda g: g.pci_bus_id):
        profiles = tables.get(gpu.uuid) or ()
        if not profiles:
            continue
        sets.append(counter_set(gpu, profiles))
        devices.extend(partition_entry(p, inventory, driver_name) for p in partitions(gpu, profiles))
    return PartitionedNode(sets, devices)


def published_entries(node: PartitionedNode) -> list[dict[str, Any]]:
    """What the publisher takes: the counter sets first (a counters-only slice per 8 sets, the API's limit:
    NVIDIA's split layout, the one Kubernetes 1.35+ accepts), then the partition devices."""
    sets = node.counter_sets
    counters = [
        counters_entry(sets[i : i + MAX_COUNTER_SETS_PER_SLICE])
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    return counters + node.devices
