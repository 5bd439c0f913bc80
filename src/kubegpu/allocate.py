"""Allocate: validate a kubelet request and build the container's runtime instructions.

Pure functions of a `Resource` and `AllocateOptions`. The gRPC server converts the result to protobuf.
Error texts that NVIDIA's plugin also produces are kept byte-identical (see the compatibility spec §4);
checks NVIDIA does not make (empty, duplicate, oversized requests) get texts of our own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kubegpu.resources import REPLICA_SEPARATOR, Resource

MAX_DEVICE_ID_LENGTH = 63  # the kubelet API's documented limit for Device.ID
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")


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


def validate_request(resource: Resource, device_ids: Sequence[str]) -> None:
    """Raise AllocationRequestError naming the first problem with a kubelet's device list."""
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
        if len(device_id) > MAX_DEVICE_ID_LENGTH:
            raise AllocationRequestError(
                prefix + f"device ID {device_id[:MAX_DEVICE_ID_LENGTH]!r}... is {len(device_id)} characters; "
                f"device IDs are at most {MAX_DEVICE_ID_LENGTH}, so it cannot be one of ours"
            )
        if resource.device(device_id) is None:
            # NVIDIA's exact text.
            raise AllocationRequestError(prefix + f"unknown device: {device_id}", nvidia_compatible=True)
        if device_id in seen:
            raise AllocationRequestError(prefix + f"device {device_id} requested more than once")
        seen.add(device_id)


def runtime_device_ids(resource: Resource, device_ids: Sequence[str], id_strategy: str) -> list[str]:
    """What the container runtime is told: UUIDs (replica suffix stripped) or NVIDIA indices, deduplicated."""
    out: list[str] = []
    for device_id in device_ids:
        device = resource.device(device_id)
        if id_strategy == "index" and device is not None:
            value = device.index
        else:
            value = device_id.split(REPLICA_SEPARATOR, 1)[0]
        if value not in out:
            out.append(value)
    return out


def _host_path(dev_root: str, path: str) -> str:
    return dev_root.rstrip("/") + path


def allocate_container(
    resource: Resource, device_ids: Sequence[str], options: AllocateOptions
) -> ContainerAllocation:
    """The runtime instructions for one container, after `validate_request` accepted its IDs."""
    ids = runtime_device_ids(resource, device_ids, options.device_id_strategy)
    result = ContainerAllocation()
    strategies = options.device_list_strategies
    if "envvar" in strategies:
        result.envs[VISIBLE_DEVICES_ENV] = ",".join(ids)
    if "volume-mounts" in strategies:
        # The toolkit reads the device list from mount targets; the env var points it there.
        result.envs[VISIBLE_DEVICES_ENV] = "/var/run/nvidia-container-devices"
        result.mounts.extend(
            MountSpec(container_path=f"/var/run/nvidia-container-devices/{i}", host_path="/dev/null")
            for i in ids
        )
    if options.pass_device_specs:
        paths = list(options.control_devices)
        for device_id in device_ids:
            device = resource.device(device_id)
            if device is not None:
                paths.extend(device.paths)
        result.devices.extend(DeviceNodeSpec(p, _host_path(options.dev_root, p)) for p in paths)
    return result
