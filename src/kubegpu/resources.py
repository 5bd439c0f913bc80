"""From an Inventory to the resources the kubelet sees.

`build_resources` is a pure function: inventory + options in, a list of `Resource` out. It is the one place
where naming, MIG strategies and sharing (replicas) plug in; the servers only serve what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kubegpu.inventory import Gpu, Health, Inventory

RESOURCE_DOMAIN = "nvidia.com"
DEFAULT_GPU_RESOURCE = f"{RESOURCE_DOMAIN}/gpu"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, slots=True)
class Device:
    """One device as advertised to the kubelet, and what Allocate needs to hand it to a container."""

    id: str  # what the kubelet sees: a GPU/MIG UUID (replicas later: "<uuid>::<r>")
    uuid: str  # the runtime's view: the UUID without any replica suffix
    index: str  # NVIDIA's index: "0" for a full GPU, "<gpu>:<mig>" for a MIG device
    gpu_index: int  # the physical GPU backing this device
    health: Health
    numa_node: int | None
    paths: tuple[str, ...]  # device nodes the container needs, without the dev root prefix

    @property
    def health_text(self) -> str:
        return HEALTHY if self.health.healthy else UNHEALTHY


@dataclass(frozen=True, slots=True)
class Resource:
    """An extended resource (e.g. nvidia.com/gpu) and its devices, in a stable order."""

    name: str
    devices: tuple[Device, ...]
    _by_id: dict[str, Device] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})

    @property
    def short_name(self) -> str:
        """The name without its domain: `gpu` for nvidia.com/gpu."""
        return self.name.split("/", 1)[-1]

    @property
    def socket_name(self) -> str:
        """NVIDIA's socket file name: nvidia-gpu.sock, nvidia-mig-1g.5gb.sock, nvidia-gpu.shared.sock."""
        return f"nvidia-{self.short_name}.sock"

    def device(self, device_id: str) -> Device | None:
        return self._by_id.get(device_id)

    @property
    def healthy_count(self) -> int:
        return sum(1 for d in self.devices if d.health.healthy)

    @property
    def is_whole_gpus(self) -> bool:
        """True when every device is a whole, unshared GPU: only then does link topology apply."""
        return all(":" not in d.index and d.id == d.uuid for d in self.devices)


@dataclass(frozen=True, slots=True)
class ResourceOptions:
    """What shapes the resource list. MIG strategies and sharing extend this (see issue 3)."""

    mig_strategy: str = "none"


def gpu_device(gpu: Gpu) -> Device:
    return Device(
        id=gpu.uuid,
        uuid=gpu.uuid,
        index=str(gpu.index),
        gpu_index=gpu.index,
        health=gpu.health,
        numa_node=gpu.numa_node,
        paths=(gpu.device_path,),
    )


def build_resources(inventory: Inventory, options: ResourceOptions | None = None) -> list[Resource]:
    """The resources to serve, one per name, each with at least one device."""
    options = options or ResourceOptions()
    if options.mig_strategy != "none":
        # The config layer rejects other strategies until MIG support lands; this guards the pure core.
        raise ValueError(f"unknown MIG strategy: {options.mig_strategy}")
    devices = [gpu_device(g) for g in sorted(inventory.gpus, key=lambda g: g.index)]
    return _group({DEFAULT_GPU_RESOURCE: devices})


def _group(by_name: dict[str, Sequence[Device]]) -> list[Resource]:
    return [Resource(name, tuple(devs)) for name, devs in sorted(by_name.items()) if devs]


def resources_by_name(resources: Iterable[Resource]) -> dict[str, Resource]:
    return {r.name: r for r in resources}
