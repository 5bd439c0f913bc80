"""Allocate: validate a kubelet request and build the container's runtime instructions.

Pure functions of a `Resource` and `AllocateOptions`. The gRPC server converts the result to protobuf.
Error texts that NVIDIA's plugin also produces are kept byte-identical (see the compatibility spec §4);
checks NVIDIA does not make (empty, duplicate, oversized requests) get texts of our own.

The response is built in NVIDIA's order (spec §4 step 3), which matters where one step overrides another:
  1. any `cdi-*` strategy: the CDI device names (GPUs, then IMEX channels, then the gdrcopy/gds/mofed
     modes whose spec is not empty) as one annotation (`cdi-annotations`) and/or `cdi_devices` (`cdi-cri`);
  2. MPS-shared resources: CUDA_MPS_PIPE_DIRECTORY and the pipe and /dev/shm mounts;
  3. `NVIDIA_GDRCOPY` / `NVIDIA_GDS` / `NVIDIA_MOFED=enabled` for each enabled mode, CDI or not (v0.19+);
  4. when every strategy is a CDI one, stop: no NVIDIA_VISIBLE_DEVICES, mounts or device specs;
  5. `envvar`: NVIDIA_VISIBLE_DEVICES=<ids>, and NVIDIA_IMEX_CHANNELS=<channels> when there are any;
  6. `volume-mounts`: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices (overriding 5) and one
     /dev/null mount per ID, then one per IMEX channel under .../imex/;
  7. `passDeviceSpecs`: the control devices, each requested device's nodes, then the IMEX channel nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kubegpu.allocation.cdi import CDI_ANNOTATION_PLUGIN, GPU_CLASS, IMEX_CLASS, qualified_name
from kubegpu.allocation.device_ids import any_annotated, backing_id
from kubegpu.allocation.resources import Resource
from kubegpu.common.quoting import plain_id, quote_id
from kubegpu.node.driverfiles import MODE_ENV, MODES, imex_channel_path, join
from kubegpu.settings.choices import CDI_STRATEGIES, DEFAULT_ANNOTATION_PREFIX, DISTRIBUTED

MAX_DEVICE_ID_LENGTH = 63  # the kubelet API's documented limit for Device.ID
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
MPS_THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MIB = 1024 * 1024
IMEX_CHANNELS_ENV = "NVIDIA_IMEX_CHANNELS"
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"


def _response_id() -> str:
    return str(uuid.uuid4())


class AllocationRequestError(ValueError):
    """A request the plugin refuses. `nvidia_compatible` errors keep NVIDIA's gRPC code (UNKNOWN)."""

    def __init__(self, message: str, *, nvidia_compatible: bool = False) -> None:
        super().__init__(message)
        self.nvidia_compatible = nvidia_compatible


@dataclass(frozen=True, slots=True)
class AllocateOptions:
    device_list_strategies: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    dev_root: str = "/"
    # Control device nodes that exist on this node (NVIDIA only passes those that exist); computed once.
    control_devices: tuple[str, ...] = ()
    cdi_annotation_prefix: str = DEFAULT_ANNOTATION_PREFIX
    # Modes (gdrcopy, gds, mofed) switched on by their flags: each sets its env var.
    enabled_modes: tuple[str, ...] = ()
    # The enabled modes whose CDI spec has something in it: only those get a CDI name.
    cdi_modes: tuple[str, ...] = ()
    # IMEX channel IDs ("0") whose device node exists; every container gets all of them, as with NVIDIA.
    imex_channels: tuple[str, ...] = ()
    # Host directory of the MPS control daemons (--mps-root), for MPS-shared resources.
    mps_root: str = ""
    # Beyond NVIDIA: per-container MPS limits from the replica count (--mps-client-limits, on by default).
    mps_client_limits: bool = True
    # Replicas and MIG: GetPreferredAllocation's greedy policy (whole GPUs ignore it).
    shared_allocation_policy: str = DISTRIBUTED
    # The random part of the cdi-annotations key, new per response (NVIDIA: a UUID). Injectable for tests.
    response_id: Callable[[], str] = _response_id

    @property
    def any_cdi(self) -> bool:
        return any(s in CDI_STRATEGIES for s in self.device_list_strategies)

    @property
    def only_cdi(self) -> bool:
        return all(s in CDI_STRATEGIES for s in self.device_list_strategies)


@dataclass(frozen=True, slots=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNodeSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(slots=True)
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[MountSpec] = field(default_factory=list)
    devices: list[DeviceNodeSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


def validate_containers(resource: Resource, device_counts: Sequence[int]) -> None:
    """Raise AllocationRequestError when the request as a whole cannot be one a kubelet sends.

    `device_counts`: how many IDs each container request lists. Checked after NVIDIA's per-container
    checks (`validate_allocate`), which stop at the first unknown ID: a request of many containers costs at
    most one dict probe per ID it holds, and the gRPC message bound caps those.
    """
    prefix = f'invalid allocation request for "{resource.name}": '
    if not device_counts:
        raise AllocationRequestError(prefix + "no container requests (the kubelet sends one per container)")
    total = sum(device_counts)
    if len(device_counts) > 1 and total > len(resource.devices):
        raise AllocationRequestError(
            prefix + f"{total} devices requested in {len(device_counts)} containers but this node "
            f"advertises only {len(resource.devices)} for {resource.name}"
        )


def validate_allocate(resource: Resource, containers: Sequence[Sequence[str]]) -> None:
    """Raise AllocationRequestError naming the first problem with a kubelet's AllocateRequest.

    NVIDIA's checks run first, container by container in NVIDIA's order (every ID known, then the shared
    request size), so a request NVIDIA refuses gets NVIDIA's text and code whatever else is wrong with it.
    Only then come ours: the whole request against the node, then each container's count and duplicates.
    """
    for device_ids in containers:
        _nvidia_checks(resource, device_ids)
    validate_containers(resource, [len(ids) for ids in containers])
    for device_ids in containers:
        _our_checks(resource, device_ids)


def validate_request(resource: Resource, device_ids: Sequence[str]) -> None:
    """Raise AllocationRequestError naming the first problem with one container's device list.

    IDs in messages are the client's text: NVIDIA's unknown-device text keeps a printable ID as it is and
    quotes (escapes, cuts) any other, so no ID can end the log line and start a forged one.
    """
    _nvidia_checks(resource, device_ids)
    _our_checks(resource, device_ids)


def _nvidia_checks(resource: Resource, device_ids: Sequence[str]) -> None:
    """NVIDIA's two checks, in its order: every ID known, then shared requests of more than one."""
    prefix = f'invalid allocation request for "{resource.name}": invalid request: '
    # Each lookup is a dict probe, and the gRPC message bound caps the list.
    for device_id in device_ids:
        if len(device_id) > MAX_DEVICE_ID_LENGTH:
            raise AllocationRequestError(
                prefix + f"device ID {device_id[:MAX_DEVICE_ID_LENGTH]!r}... is {len(device_id)} characters; "
                f"device IDs are at most {MAX_DEVICE_ID_LENGTH}, so it cannot be one of ours"
            )
        if resource.device(device_id) is None:
            # NVIDIA's exact text for every printable ID.
            raise AllocationRequestError(
                prefix + f"unknown device: {plain_id(device_id)}", nvidia_compatible=True
            )
    shared = any_annotated(device_ids)
    if shared and len(device_ids) > 1 and resource.fail_requests_greater_than_one:
        raise AllocationRequestError(
            prefix + f"maximum request size for shared resources is 1; found {len(device_ids)}",
            nvidia_compatible=True,
        )


def _our_checks(resource: Resource, device_ids: Sequence[str]) -> None:
    """What NVIDIA lets through and a kubelet never sends: no IDs, more than the node has, an ID twice."""
    prefix = f'invalid allocation request for "{resource.name}": invalid request: '
    if not device_ids:
        raise AllocationRequestError(prefix + "no devices requested; the kubelet sends at least one ID")
    if len(device_ids) > len(resource.devices):
        raise AllocationRequestError(
            prefix + f"{len(device_ids)} devices requested but this node advertises only "
            f"{len(resource.devices)} for {resource.name}"
        )
    seen: set[str] = set()
    for device_id in device_ids:
        if device_id in seen:
            raise AllocationRequestError(prefix + f"device {quote_id(device_id)} requested more than once")
        seen.add(device_id)


def runtime_device_ids(resource: Resource, device_ids: Sequence[str], id_strategy: str) -> list[str]:
    """What the container runtime is told: UUIDs (replica suffix stripped) or NVIDIA indices, deduplicated."""
    out: list[str] = []
    for device_id in device_ids:
        device = resource.device(device_id)
        value = device.index if id_strategy == "index" and device is not None else backing_id(device_id)
        if value not in out:
            out.append(value)
    return out


def allocate_container(
    resource: Resource, device_ids: Sequence[str], options: AllocateOptions
) -> ContainerAllocation:
    """The runtime instructions for one container, after `validate_request` accepted its IDs."""
    ids = runtime_device_ids(resource, device_ids, options.device_id_strategy)
    result = ContainerAllocation()
    if options.any_cdi:
        _add_cdi(result, ids, options)
    if resource.sharing == "mps":
        _add_mps(result, resource.name, options.mps_root)
        if options.mps_client_limits:
            _add_mps_client_limits(result, resource, device_ids)
    for mode in options.enabled_modes:
        result.envs[MODE_ENV[mode]] = "enabled"
    if options.only_cdi:
        return result
    strategies = options.device_list_strategies
    if "envvar" in strategies:
        result.envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
        if options.imex_channels:
            result.envs[IMEX_CHANNELS_ENV] = ",".join(options.imex_channels)
    if "volume-mounts" in strategies:
        _add_device_list_mounts(result, ids, options.imex_channels)
    if options.pass_device_specs:
        _add_device_specs(result, resource, device_ids, options)
    return result


def cdi_device_names(ids: Sequence[str], options: AllocateOptions) -> list[str]:
    """The qualified CDI names of a container's devices, in NVIDIA's order."""
    return [
        *(qualified_name(GPU_CLASS, i) for i in ids),
        *(qualified_name(IMEX_CLASS, c) for c in options.imex_channels),
        *(qualified_name(mode, "all") for mode in MODES if mode in options.cdi_modes),
    ]


def _add_cdi(result: ContainerAllocation, ids: Sequence[str], options: AllocateOptions) -> None:
    names = cdi_device_names(ids, options)
    if not names:
        return
    if "cdi-annotations" in options.device_list_strategies:
        # The CDI library's AnnotationKey(plugin, id) is "cdi.k8s.io/<plugin>_<id>"; NVIDIA then swaps a
        # custom prefix in for "cdi.k8s.io/". The random ID keeps keys of several containers apart.
        key = f"{options.cdi_annotation_prefix}{CDI_ANNOTATION_PLUGIN}_{options.response_id()}"
        result.annotations[key] = ",".join(names)
    if "cdi-cri" in options.device_list_strategies:
        result.cdi_devices.extend(names)


def _add_mps(result: ContainerAllocation, resource_name: str, mps_root: str) -> None:
    # The MPS control daemon for this resource listens in <mps root>/<resource>/pipe (spec §4.1).
    pipe = f"/mps/{resource_name}/pipe"
    result.envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    result.mounts.append(MountSpec(pipe, f"{mps_root.rstrip('/')}/{resource_name}/pipe"))
    result.mounts.append(MountSpec("/dev/shm", f"{mps_root.rstrip('/')}/shm"))


def _add_mps_client_limits(
    result: ContainerAllocation, resource: Resource, device_ids: Sequence[str]
) -> None:
    """The container's share of each GPU, as the MPS client env vars that enforce it.

    The control daemon's defaults (NVIDIA's mps-daemon) give every client 1/replicas of a GPU; a container
    holding k replicas of one GPU (failRequestsGreaterThanOne off) is entitled to k shares, which only
    per-client env vars can express. Device ordinals follow the container's device list order.
    """
    if resource.replicas < 2:
        return
    held: dict[str, int] = {}
    memory: dict[str, int] = {}
    for device_id in device_ids:
        device = resource.device(device_id)
        if device is None:
            continue
        held[device.uuid] = held.get(device.uuid, 0) + 1
        memory[device.uuid] = device.memory_bytes
    if not held:
        return
    share = 100 // resource.replicas
    result.envs[MPS_THREAD_ENV] = str(min(100, share * max(held.values())))
    limits = [
        f"{ordinal}={memory[uuid] // resource.replicas * count // MIB}M"
        for ordinal, (uuid, count) in enumerate(held.items())
        if memory[uuid]
    ]
    if limits:
        result.envs[MPS_MEMORY_ENV] = ",".join(limits)


def _add_device_list_mounts(result: ContainerAllocation, ids: Sequence[str], channels: Sequence[str]) -> None:
    # The toolkit reads the device list from mount targets; the env var points it there.
    result.envs[VISIBLE_DEVICES_ENV] = DEVICE_LIST_ROOT
    result.mounts.extend(MountSpec(f"{DEVICE_LIST_ROOT}/{i}", "/dev/null") for i in ids)
    result.mounts.extend(MountSpec(f"{DEVICE_LIST_ROOT}/imex/{c}", "/dev/null") for c in channels)


def _add_device_specs(
    result: ContainerAllocation, resource: Resource, device_ids: Sequence[str], options: AllocateOptions
) -> None:
    paths = list(options.control_devices)
    for device_id in device_ids:
        device = resource.device(device_id)
        if device is not None:
            paths.extend(device.paths)  # replicas of one GPU repeat its path, as with NVIDIA
    paths.extend(imex_channel_path(c) for c in options.imex_channels)
    result.devices.extend(DeviceNodeSpec(p, join(options.dev_root, p)) for p in paths)
