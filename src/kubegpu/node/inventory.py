"""The node's GPUs as one immutable snapshot.

Discovery produces an `Inventory`; the health monitor produces new ones with changed health. Nothing
mutates a snapshot, so the daemon can diff the resources built from the old and the new one and a
device that recovers simply shows up as healthy again.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class LinkLevel(enum.IntEnum):
    """PCIe/P2P proximity of two GPUs, as NVML's `nvmlGpuTopologyLevel_t` values.

    Lower is closer. The values are NVML's so discovery can store what NVML returns unchanged.
    """

    INTERNAL = 0  # same board (e.g. the two dies of a K80)
    SINGLE = 10  # one PCIe switch between them
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # through a host bridge
    NODE = 40  # same NUMA node / CPU, across host bridges
    SYSTEM = 50  # across CPUs (SMP interconnect)


@dataclass(frozen=True, slots=True)
class GpuLink:
    """How two GPUs (by index, a < b) reach each other."""

    a: int
    b: int
    level: LinkLevel
    nvlinks: int = 0  # number of NVLink lanes between the pair (via NVSwitch: min of both sides)


@dataclass(frozen=True, slots=True)
class Health:
    """Health of one physical GPU or MIG device. `reason` says why it is unhealthy (None when healthy)."""

    healthy: bool = True
    reason: str | None = None
    xid: int | None = None

    @classmethod
    def ok(cls) -> Health:
        return _HEALTHY

    @classmethod
    def failed(cls, reason: str, xid: int | None = None) -> Health:
        return cls(healthy=False, reason=reason, xid=xid)


_HEALTHY = Health()


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device (GPU instance + compute instance) living on a parent GPU."""

    uuid: str
    index: int  # enumeration position on the parent GPU (the j in NVIDIA's "i:j" index)
    gi: int  # GPU instance id
    ci: int  # compute instance id
    profile: str  # e.g. "1g.5gb", "1g.10gb+me", "1c.2g.10gb"
    memory_bytes: int
    health: Health = field(default_factory=Health.ok)
    # The GPU instance's profile ID and placement (start slice, slice count), and its engines as the
    # GPU instance profile lists them; None/0 when NVML could not say (e.g. not privileged). NVIDIA's DRA
    # driver names a MIG device by profile ID and placement start.
    gi_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int = 0
    engines: MigEngines | None = None


@dataclass(frozen=True, slots=True)
class MigEngines:
    """A GPU instance profile's engine counts (NVML's nvmlGpuInstanceProfileInfo_t)."""

    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    minor: int
    compute_capability: tuple[int, int]
    pci_bus_id: str  # NVML form, e.g. "00000000:3B:00.0"
    numa_node: int | None = None  # None when sysfs does not know (missing file or negative value)
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    health: Health = field(default_factory=Health.ok)
    architecture: str = ""  # as go-nvlib names NVML's architecture, e.g. "Ampere", "Ada Lovelace"; "" unknown
    pcie_root: str | None = None  # the PCIe root complex from sysfs, e.g. "pci0000:00"; None unknown
    brand: str = ""  # as go-nvlib names NVML's brand, e.g. "Nvidia", "Tesla", "GeForceRTX"; "" unknown

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True, slots=True)
class Inventory:
    """Everything the plugin knows about the node's GPUs at one moment."""

    gpus: tuple[Gpu, ...] = ()
    links: tuple[GpuLink, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""  # e.g. "12.4", from nvmlSystemGetCudaDriverVersion
    # What is derived from this snapshot once (the link map): not part of its value, not copied by replace.
    _derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def gpu_by_index(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def link_map(self) -> Mapping[tuple[int, int], GpuLink]:
        """Links keyed by both (a, b) and (b, a); built once per snapshot, so the same mapping each call
        (GetPreferredAllocation keys what it derives from the node's topology by it)."""
        out: dict[tuple[int, int], GpuLink] | None = self._derived.get("link_map")
        if out is None:
            out = {}
            for link in self.links:
                out[(link.a, link.b)] = link
                out[(link.b, link.a)] = link
            self._derived["link_map"] = out
        return out

    def with_gpu_health(self, updates: Mapping[str, Health]) -> Inventory:
        """A new snapshot where the GPUs named by UUID carry the given health.

        A GPU's health also applies to every MIG device on it: a fault of the physical GPU takes all of
        them down, and its recovery brings them back.
        """
        if not updates:
            return self
        gpus = []
        for gpu in self.gpus:
            new = updates.get(gpu.uuid)
            if new is None or new == gpu.health:
                gpus.append(gpu)
                continue
            migs = tuple(dataclasses.replace(m, health=new) for m in gpu.mig_devices)
            gpus.append(dataclasses.replace(gpu, health=new, mig_devices=migs))
        return dataclasses.replace(self, gpus=tuple(gpus))

    def unhealthy_gpus(self) -> Iterable[Gpu]:
        return (g for g in self.gpus if not g.health.healthy)
