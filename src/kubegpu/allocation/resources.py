"""From an Inventory to the resources the kubelet sees.

`build_resources` is a pure function: inventory + options in, a list of `Resource` out. It is the one place
where naming, MIG strategies and sharing (replicas) happen; the servers only serve what it returns.

Order of work, as in NVIDIA's plugin: (1) the base devices per resource name from the MIG strategy (and,
with kubegpu's opt-in, custom name patterns); (2) sharing replaces each selected device by N replicas
`<uuid>::<r>` under the same or the renamed resource; (3) one Resource per name with at least one device.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.allocation.device_ids import replica_id
from kubegpu.allocation.message_size import MAX_LIST_AND_WATCH_BYTES, list_bytes, max_replicas, replicas_bytes
from kubegpu.common.files import describe_size
from kubegpu.node.inventory import Gpu, Health, Inventory, MigDevice
from kubegpu.settings.nvidia_sharing import ReplicatedResource, Resources, SharingStrategy

log = logging.getLogger(__name__)

RESOURCE_DOMAIN = "nvidia.com"
DEFAULT_GPU_RESOURCE = f"{RESOURCE_DOMAIN}/gpu"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# NVIDIA's prefixes of its device map's errors (internal/rm/device_map.go).
DEVICE_MAP_ERROR = "error building device map from config.resources"
MIG_CONFIG_ERROR = "invalid MIG configuration"
MIG_NOT_CONFIGURED = "at least one device with migEnabled=true was not configured correctly"


class ResourceError(ValueError):
    """The node's devices cannot be exposed as configured (NVIDIA's texts)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device as advertised to the kubelet, and what Allocate needs to hand it to a container."""

    id: str  # what the kubelet sees: a GPU/MIG UUID, or "<uuid>::<r>" for a replica
    uuid: str  # the runtime's view: the UUID without any replica suffix
    index: str  # NVIDIA's index: "0" for a full GPU, "<gpu>:<mig>" for a MIG device
    gpu_index: int  # the physical GPU backing this device
    health: Health
    numa_node: int | None
    paths: tuple[str, ...]  # device nodes the container needs, without the dev root prefix
    memory_bytes: int = 0  # of the backing GPU or MIG device (MPS client memory limits)

    @property
    def health_text(self) -> str:
        return HEALTHY if self.health.healthy else UNHEALTHY

    @property
    def is_mig(self) -> bool:
        return ":" in self.index

    @property
    def is_replica(self) -> bool:
        return self.id != self.uuid


@dataclass(frozen=True, slots=True)
class Resource:
    """An extended resource (e.g. nvidia.com/gpu) and its devices, in a stable order."""

    name: str
    devices: tuple[Device, ...]
    sharing: str = "none"  # "none", "time-slicing" or "mps"
    fail_requests_greater_than_one: bool = False
    replicas: int = 1  # per device, for shared resources
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
        return all(not d.is_mig and not d.is_replica for d in self.devices)


@dataclass(frozen=True, slots=True)
class ResourceOptions:
    mig_strategy: str = "none"
    sharing_kind: str = "none"  # "time-slicing" or "mps" when `sharing` is the active block
    sharing: SharingStrategy | None = None
    custom_names: Resources | None = None  # kubegpu opt-in: NVIDIA's `resources` patterns, honoured
    mig_minors: Mapping[str, int] = field(default_factory=dict)  # "gpu0/gi1/access" -> capability minor


def gpu_device(gpu: Gpu) -> Device:
    return Device(
        id=gpu.uuid,
        uuid=gpu.uuid,
        index=str(gpu.index),
        gpu_index=gpu.index,
        health=gpu.health,
        numa_node=gpu.numa_node,
        paths=(gpu.device_path,),
        memory_bytes=gpu.memory_bytes,
    )


def mig_device(gpu: Gpu, mig: MigDevice, mig_minors: Mapping[str, int]) -> Device:
    """A MIG device: its parent's NUMA node and device node plus its GI and CI capability nodes."""
    paths = [gpu.device_path]
    for key in (f"gpu{gpu.minor}/gi{mig.gi}/access", f"gpu{gpu.minor}/gi{mig.gi}/ci{mig.ci}/access"):
        if key in mig_minors:
            paths.append(f"/dev/nvidia-caps/nvidia-cap{mig_minors[key]}")
    return Device(
        id=mig.uuid,
        uuid=mig.uuid,
        index=f"{gpu.index}:{mig.index}",
        gpu_index=gpu.index,
        health=mig.health,
        numa_node=gpu.numa_node,
        paths=tuple(paths),
        memory_bytes=mig.memory_bytes,
    )


def parse_mig_minors(text: str) -> dict[str, int]:
    """`/proc/driver/nvidia-caps/mig-minors`: lines like `gpu0/gi1/ci0/access 12`."""
    minors = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def mig_resource_name(profile: str) -> str:
    """nvidia.com/mig-<profile>, '+' becoming '.' (1g.10gb+me -> nvidia.com/mig-1g.10gb.me)."""
    return f"{RESOURCE_DOMAIN}/mig-{profile.replace('+', '.')}"


def _pattern_matches(pattern: str, value: str) -> bool:
    # NVIDIA v0.20: '*' is any run of characters, everything else literal, anchored at both ends.
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), value) is not None


def _gpu_name(gpu: Gpu, custom: Resources | None) -> str:
    for entry in custom.gpus if custom else ():
        if entry.pattern and _pattern_matches(entry.pattern, gpu.name):
            return entry.name or DEFAULT_GPU_RESOURCE
    return DEFAULT_GPU_RESOURCE


def _mig_name(profile: str, strategy: str, custom: Resources | None) -> str:
    for entry in custom.mig if custom else ():
        if entry.pattern and _pattern_matches(entry.pattern, profile):
            return entry.name or mig_resource_name(profile)
    if strategy == "single":
        return DEFAULT_GPU_RESOURCE
    if re.fullmatch(r"\d+g\.\d+gb(\+[a-z.,]+)?", profile) is None:
        # Profiles whose compute slices differ from GPU slices (1c.2g.10gb) have no default resource.
        raise ResourceError(f"MIG profile '{profile}' does not match any resource patterns")
    return mig_resource_name(profile)


def _check_single(gpus: Sequence[Gpu]) -> None:
    """NVIDIA's three checks for `single`, in its order and with its texts (its device map wraps each in
    go-nvlib's visitor prefixes): an empty MIG-enabled GPU, then MIG devices of more than one kind, then
    full GPUs next to MIG devices."""
    for g in gpus:
        if g.mig_enabled and not g.mig_devices:
            raise ResourceError(
                f"{DEVICE_MAP_ERROR}: {MIG_CONFIG_ERROR}: {MIG_NOT_CONFIGURED}: "
                f"error visiting device: device {g.index} has no MIG devices configured"
            )
    if len({m.profile for g in gpus if g.mig_enabled for m in g.mig_devices}) > 1:
        raise ResourceError(
            f"{DEVICE_MAP_ERROR}: {MIG_CONFIG_ERROR}: error visiting devices: error visiting device: "
            "error visiting device: error visiting MIG device: error visiting MIG device: "
            "more than one MIG device type present on node"
        )
    if any(not g.mig_enabled for g in gpus):
        raise ResourceError(
            f"{DEVICE_MAP_ERROR}: all devices on the node must be configured with the same migEnabled value"
        )


def base_devices(inventory: Inventory, options: ResourceOptions) -> dict[str, list[Device]]:
    """Devices per resource name before sharing, following the MIG strategy."""
    gpus = sorted(inventory.gpus, key=lambda g: g.index)
    strategy = options.mig_strategy
    if strategy not in ("none", "single", "mixed"):
        raise ResourceError(f"unknown MIG strategy: {strategy}")
    if strategy == "single" and any(g.mig_enabled for g in gpus):
        _check_single(gpus)
    out: dict[str, list[Device]] = {}
    for gpu in gpus:
        if strategy == "none" or not gpu.mig_enabled:
            out.setdefault(_gpu_name(gpu, options.custom_names), []).append(gpu_device(gpu))
            continue
        if not gpu.mig_devices:
            log.warning("GPU %d has MIG enabled but no MIG devices; nothing to advertise from it", gpu.index)
        for mig in gpu.mig_devices:
            name = _mig_name(mig.profile, strategy, options.custom_names)
            out.setdefault(name, []).append(mig_device(gpu, mig, options.mig_minors))
    return out


def _selected(devices: Sequence[Device], entry: ReplicatedResource) -> list[Device]:
    spec = entry.devices
    if spec.all:
        return list(devices)
    if spec.count is not None:
        return list(devices[: spec.count])
    wanted = set(spec.ids)
    return [d for d in devices if d.index in wanted or d.uuid in wanted]


def replicate(device: Device, replicas: int) -> list[Device]:
    d = device  # constructed directly: dataclasses.replace costs ~10x more, and 8 x 48 add up
    return [
        Device(
            replica_id(d.uuid, r),
            d.uuid,
            d.index,
            d.gpu_index,
            d.health,
            d.numa_node,
            d.paths,
            d.memory_bytes,
        )
        for r in range(replicas)
    ]


def build_resources(inventory: Inventory, options: ResourceOptions | None = None) -> list[Resource]:
    """The resources to serve, one per name, each with at least one device. Raises ResourceError."""
    options = options or ResourceOptions()
    by_name = base_devices(inventory, options)
    shared: dict[str, bool] = {}  # resource name -> failRequestsGreaterThanOne, for shared resources
    replica_counts: dict[str, int] = {}
    block = options.sharing
    if block is not None:
        for entry in block.resources or ():
            # ReplicatedResource has checked both: a resource name and replicas >= 2 (`or` narrows the type).
            source, per_device = entry.name or "", entry.replicas or 1
            devices = by_name.get(source, [])
            chosen = _selected(devices, entry)
            if not chosen:
                continue
            if options.sharing_kind == "mps" and any(d.is_mig for d in chosen):
                raise ResourceError("sharing using MPS is not supported for MIG devices")
            target = entry.rename or source
            chosen_ids = {d.id for d in chosen}
            by_name[source] = [d for d in devices if d.id not in chosen_ids]
            _check_fits(target, by_name.get(target, []), chosen, per_device)
            replicas = [r for d in chosen for r in replicate(d, per_device)]
            by_name.setdefault(target, []).extend(replicas)
            shared[target] = bool(block.failRequestsGreaterThanOne)
            replica_counts[target] = per_device
    for name, devices in by_name.items():
        _check_fits(name, devices, [], 0)
    return [
        Resource(
            name,
            tuple(devices),
            sharing=options.sharing_kind if name in shared else "none",
            fail_requests_greater_than_one=shared.get(name, False),
            replicas=replica_counts.get(name, 1),
        )
        for name, devices in sorted(by_name.items())
        if devices
    ]


def _check_fits(name: str, listed: Sequence[Device], chosen: Sequence[Device], replicas: int) -> None:
    """Refuse, before building them, devices the kubelet could not read in one ListAndWatch message."""
    used = list_bytes((len(d.id), d.numa_node) for d in listed)
    added = sum(replicas_bytes(len(d.uuid), d.numa_node, replicas) for d in chosen)
    if used + added <= MAX_LIST_AND_WATCH_BYTES:
        return
    count = len(listed) + len(chosen) * replicas
    message = (
        f"{name} would list {count} devices, {describe_size(used + added)} in one ListAndWatch message, over "
        f"the {describe_size(MAX_LIST_AND_WATCH_BYTES)} the kubelet reads (gRPC's receive limit)"
    )
    if chosen:
        fit = max_replicas(((len(d.uuid), d.numa_node) for d in chosen), MAX_LIST_AND_WATCH_BYTES - used)
        message += f"; lower replicas to at most {fit} for {len(chosen)} device(s) on this node"
    raise ResourceError(message)


def resources_by_name(resources: Iterable[Resource]) -> dict[str, Resource]:
    return {r.name: r for r in resources}
