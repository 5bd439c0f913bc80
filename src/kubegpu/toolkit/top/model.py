"""The cluster's GPUs as `kubegpu top` shows them, from the plugins' /metrics samples (a pure function).

One row per GPU or MIG device (dcgm-exporter's series: `UUID`, and `GPU_I_ID` for a MIG device) and
holder: model, health (kubegpu_device_healthy), the holder pod, utilisation, memory used and total
(FB_USED + FB_FREE) and how long the holder has held it idle (kubegpu_device_idle_seconds). Then the
fragmentation: free healthy whole GPUs per node, the largest whole-GPU request each node could still take,
and the pending GPU pods that the free GPUs could hold only together (more GPUs than any one node has free,
no more than all nodes have).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
HEALTHY = "kubegpu_device_healthy"
IDLE = "kubegpu_device_idle_seconds"
NVLINK = "kubegpu_gpu_nvlink_lanes"
WANTED = (UTIL, FB_USED, FB_FREE, HEALTHY, IDLE, NVLINK)


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """What one plugin's /metrics said (or why it could not be read)."""

    node: str
    samples: tuple[Sample, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class GpuRow:
    node: str
    gpu: str  # "3", or "3/GI 5" for a MIG device
    uuid: str
    model: str
    health: str  # Healthy, Unhealthy, or "" when the plugin does not serve the device
    holder: str  # namespace/pod/container, "" when free
    utilization: float | None  # %
    memory_used_mib: float | None
    memory_total_mib: float | None
    idle_seconds: float | None
    mig: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "model": self.model,
            "health": self.health or None,
            "holder": self.holder or None,
            "utilizationPercent": self.utilization,
            "memoryUsedMiB": self.memory_used_mib,
            "memoryTotalMiB": self.memory_total_mib,
            "idleSeconds": self.idle_seconds,
        }


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    gpus: int  # whole GPUs requested (the sum over its containers)


@dataclass(frozen=True, slots=True)
class SplitGroup:
    """GPUs joined by NVLink on one node, some held and some free: a job as large as the group no longer
    fits it, and the free ones may not reach each other over NVLink."""

    node: str
    gpus: tuple[str, ...]  # GPU indices, as dcgm-exporter's `gpu` label
    held: int
    free: int


@dataclass
class Fragmentation:
    free_by_node: dict[str, int] = field(default_factory=dict)
    only_together: list[PendingPod] = field(default_factory=list)  # fit the free GPUs, on no one node
    split_nvlink_groups: list[SplitGroup] = field(default_factory=list)

    @property
    def total_free(self) -> int:
        return sum(self.free_by_node.values())

    def to_json(self) -> dict[str, object]:
        return {
            "freeGpusByNode": dict(sorted(self.free_by_node.items())),
            "largestRequestByNode": dict(sorted(self.free_by_node.items())),
            "totalFree": self.total_free,
            "pendingOnlyTogether": [
                {"namespace": p.namespace, "pod": p.name, "gpus": p.gpus} for p in self.only_together
            ],
            "splitNvlinkGroups": [
                {"node": g.node, "gpus": list(g.gpus), "held": g.held, "free": g.free}
                for g in self.split_nvlink_groups
            ],
        }


def gpu_rows(nodes: Iterable[NodeMetrics]) -> list[GpuRow]:
    rows: list[GpuRow] = []
    for node in nodes:
        healthy = {s.labels.get("uuid", ""): s.value for s in node.samples if s.name == HEALTHY}
        idle = {
            (s.labels.get("UUID", ""), s.labels.get("namespace", ""), s.labels.get("pod", "")): s.value
            for s in node.samples
            if s.name == IDLE
        }
        devices: dict[tuple[str, str, str], dict[str, float]] = {}
        info: dict[tuple[str, str, str], Mapping[str, str]] = {}
        for s in node.samples:
            if s.name not in (UTIL, FB_USED, FB_FREE):
                continue
            holder = "/".join(
                p for p in (s.labels.get("namespace"), s.labels.get("pod"), s.labels.get("container")) if p
            )
            key = (s.labels.get("UUID", ""), s.labels.get("GPU_I_ID", ""), holder)
            devices.setdefault(key, {})[s.name] = s.value
            info[key] = s.labels
        for key in sorted(devices, key=lambda k: (_index(info[k].get("gpu", "")), k[1], k[2])):
            uuid, gi, holder = key
            labels, values = info[key], devices[key]
            used, free = values.get(FB_USED), values.get(FB_FREE)
            namespace, pod = labels.get("namespace", ""), labels.get("pod", "")
            health = healthy.get(uuid)
            rows.append(
                GpuRow(
                    node=labels.get("Hostname") or node.node,
                    gpu=labels.get("gpu", "") + (f"/GI {gi}" if gi else ""),
                    uuid=uuid,
                    model=labels.get("modelName", ""),
                    health="" if health is None else ("Healthy" if health else "Unhealthy"),
                    holder=holder,
                    utilization=values.get(UTIL),
                    memory_used_mib=used,
                    memory_total_mib=None if used is None or free is None else used + free,
                    idle_seconds=None if gi else idle.get((uuid, namespace, pod)),
                    mig=bool(gi),
                )
            )
    return rows


def _index(text: str) -> int:
    return int(text) if text.isdigit() else 1 << 30


def nvlink_groups(nodes: Iterable[NodeMetrics]) -> dict[str, list[set[str]]]:
    """Per node, the GPUs (by UUID) NVLink joins, as connected groups of two or more."""
    out: dict[str, list[set[str]]] = {}
    for node in nodes:
        groups: list[set[str]] = []
        for s in node.samples:
            if s.name != NVLINK or s.value <= 0:
                continue
            pair = {s.labels.get("UUID", ""), s.labels.get("peer_UUID", "")}
            touching = [g for g in groups if g & pair]
            merged = pair.union(*touching)
            groups = [g for g in groups if not g & pair] + [merged]
        name = next((s.labels["Hostname"] for s in node.samples if s.labels.get("Hostname")), node.node)
        out[name] = [g for g in groups if len(g) > 1]
    return out


def fragmentation(
    rows: Sequence[GpuRow], pending: Iterable[PendingPod], groups: Mapping[str, list[set[str]]] | None = None
) -> Fragmentation:
    result = Fragmentation()
    held = {(r.node, r.uuid) for r in rows if r.holder}
    for r in rows:
        result.free_by_node.setdefault(r.node, 0)
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if r.mig or (r.node, r.uuid) in held or (r.node, r.uuid) in seen or r.health == "Unhealthy":
            continue
        seen.add((r.node, r.uuid))
        result.free_by_node[r.node] += 1
    most = max(result.free_by_node.values(), default=0)
    result.only_together = [p for p in pending if most < p.gpus <= result.total_free]
    index = {(r.node, r.uuid): r.gpu for r in rows if not r.mig}
    for node, node_groups in sorted((groups or {}).items()):
        for group in node_groups:
            taken = sum(1 for uuid in group if (node, uuid) in held)
            if 0 < taken < len(group):
                gpus = tuple(sorted((index.get((node, u), u) for u in group), key=_index))
                result.split_nvlink_groups.append(SplitGroup(node, gpus, taken, len(group) - taken))
    return result


def idle_over(rows: Iterable[GpuRow], seconds: float) -> list[GpuRow]:
    """The held devices idle for at least `seconds`."""
    return [r for r in rows if r.holder and r.idle_seconds is not None and r.idle_seconds >= seconds]
