"""What the MPS manager runs for each shared resource: pure functions of the resources and the GPUs.

One control daemon per resource shared with MPS. Its defaults are NVIDIA's, derived from the replica
count, so every client of a GPU gets an equal slice without asking for one:

- pinned device memory per GPU = total memory / replicas, in whole MiB, written `<n>M`
  (`set_default_device_pinned_mem_limit <gpu index> <n>M`; a GPU whose memory NVML reports as 0 gets none);
- active thread percentage = 100 // replicas per GPU (`set_default_active_thread_percentage <p>`).

An MPS server accepts at most 48 clients from Volta (compute capability 7.5 in NVIDIA's check) on, 16
before; more replicas than that is NVIDIA's configuration error, text included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubegpu.allocation.resources import Resource
from kubegpu.node.inventory import Inventory

MIB = 1024 * 1024
MAX_CLIENTS_VOLTA = 48
MAX_CLIENTS_PRE_VOLTA = 16
_VOLTA = (7, 5)  # NVIDIA compares against v7.5 although Volta proper is 7.0; we keep its cut-off


class MpsConfigError(ValueError):
    """The MPS configuration cannot run on this node; the message is NVIDIA's, `hint` says what to change."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def parse_compute_capability(text: str) -> tuple[int, int] | None:
    """ "7.5", "v7.5" or "9" as (major, minor); None when it is not a version (NVIDIA then allows 16)."""
    match = re.fullmatch(r"v?(\d+)(?:\.(\d+))?(?:\.\d+)?", text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2] or 0)


def max_clients(compute_capability: tuple[int, int] | str) -> int:
    """How many clients (replicas) one MPS server on this GPU accepts: 48 from 7.5 on, else 16."""
    cc = (
        parse_compute_capability(compute_capability)
        if isinstance(compute_capability, str)
        else compute_capability
    )
    return MAX_CLIENTS_VOLTA if cc is not None and cc >= _VOLTA else MAX_CLIENTS_PRE_VOLTA


@dataclass(frozen=True, slots=True)
class SharedGpu:
    """One physical GPU of a resource shared with MPS, and how many replicas of it the kubelet sees."""

    uuid: str
    index: str  # NVIDIA's device index, as set_default_device_pinned_mem_limit takes it
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    replicas: int

    @property
    def pinned_memory_limit(self) -> str | None:
        """`<MiB>M`, NVIDIA's per-client share of the GPU's memory; None when NVML did not report any."""
        if self.memory_bytes <= 0:
            return None
        return f"{self.memory_bytes // self.replicas // MIB}M"


@dataclass(frozen=True, slots=True)
class DaemonPlan:
    """Everything the manager does for one resource, before anything runs."""

    resource: str
    gpus: tuple[SharedGpu, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    @property
    def active_thread_percentage(self) -> int | None:
        # NVIDIA divides the resource's replica count by its GPU count, then 100 by that (integers).
        if not self.gpus:
            return None
        per_gpu = sum(g.replicas for g in self.gpus) // len(self.gpus)
        return 100 // per_gpu

    def control_commands(self) -> list[str]:
        """The commands piped into nvidia-cuda-mps-control after the daemon starts, one call each."""
        commands = [
            f"set_default_device_pinned_mem_limit {g.index} {g.pinned_memory_limit}"
            for g in self.gpus
            if g.pinned_memory_limit is not None
        ]
        percentage = self.active_thread_percentage
        if percentage is not None:
            commands.append(f"set_default_active_thread_percentage {percentage}")
        return commands


def check_replicas(gpu: SharedGpu) -> None:
    """NVIDIA's limit on MPS clients per GPU, with its text. Raises MpsConfigError."""
    limit = max_clients(gpu.compute_capability)
    if gpu.replicas > limit:
        cc = ".".join(str(p) for p in gpu.compute_capability)
        raise MpsConfigError(
            "invalid MPS configuration: invalid device maximum allowed replicas exceeded: "
            f"{gpu.replicas} > {limit}",
            hint=(
                f"GPU {gpu.index} ({gpu.name}, compute capability {cc}) accepts at most {limit} MPS clients; "
                f"set sharing.mps.resources[].replicas to {limit} or less"
            ),
        )


def plan_daemons(resources: Iterable[Resource], inventory: Inventory) -> list[DaemonPlan]:
    """One plan per resource shared with MPS that has devices. Raises MpsConfigError (too many replicas)."""
    plans = []
    for resource in resources:
        if resource.sharing != "mps" or not resource.devices:
            continue  # unshared resources (and time-slicing) need no daemon
        gpus = _shared_gpus(resource, inventory)
        for gpu in gpus:
            check_replicas(gpu)
        plans.append(DaemonPlan(resource.name, gpus))
    return plans


def _shared_gpus(resource: Resource, inventory: Inventory) -> tuple[SharedGpu, ...]:
    replicas: dict[str, int] = {}
    index: dict[str, tuple[int, str]] = {}
    for device in resource.devices:
        replicas[device.uuid] = replicas.get(device.uuid, 0) + 1
        index.setdefault(device.uuid, (device.gpu_index, device.index))
    out = []
    for uuid, (gpu_index, device_index) in sorted(index.items(), key=lambda item: item[1][0]):
        gpu = inventory.gpu_by_index(gpu_index)
        if gpu is None:  # build_resources only yields devices of the inventory it was given
            raise ValueError(f"resource {resource.name}: GPU {gpu_index} ({uuid}) is not in the inventory")
        out.append(
            SharedGpu(
                uuid=uuid,
                index=device_index,
                name=gpu.name,
                memory_bytes=gpu.memory_bytes,
                compute_capability=gpu.compute_capability,
                replicas=replicas[uuid],
            )
        )
    return tuple(out)


def describe(plans: Sequence[DaemonPlan]) -> str:
    """One line per daemon for the log: resource, GPUs, limits."""
    if not plans:
        return "no resource is shared with MPS"
    lines = []
    for plan in plans:
        limits = ", ".join(f"GPU {g.index}: {g.replicas} x {g.pinned_memory_limit or '-'}" for g in plan.gpus)
        lines.append(f"{plan.resource}: {limits}; active threads {plan.active_thread_percentage}%")
    return "\n".join(lines)
