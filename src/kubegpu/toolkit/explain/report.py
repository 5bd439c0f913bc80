"""What `kubegpu explain` reports: per-node verdicts with GPU counts, fixes, fragmentation, and its JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.toolkit.model import Node

if TYPE_CHECKING:
    from kubegpu.toolkit.explain.dra import DraExplanation

POOL_LABELS = (
    "pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "nvidia.com/gpu.product",
    "node.kubernetes.io/instance-type",
)


def pool_of(node: Node) -> str:
    node_labels = node.metadata.labels or {}
    for key in POOL_LABELS:
        if key in node_labels:
            return node_labels[key]
    return "-"


@dataclass
class GpuCount:
    capacity: int
    allocatable: int
    requested: int

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)


@dataclass
class NodeVerdict:
    node: str
    pool: str
    fits: bool
    plugin: str | None
    reasons: list[str]
    gpus: dict[str, GpuCount]


@dataclass
class Fix:
    kind: (
        str  # free-gpus, unhealthy-gpus, fragmentation, toleration, selector, uncordon, no-such-resource, ...
    )
    summary: str
    nodes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FragmentationRow:
    size: int
    free: int
    fits: int  # how many pods of this size the free GPUs can take
    stranded: int  # free GPUs no pod of this size can use
    percent: float  # stranded / free
    largest_block: int


@dataclass
class Explanation:
    pod: str
    phase: str
    node_name: str | None
    status: str  # pending-unschedulable, would-fit, bound, finished, admission-rejected
    requests: dict[str, str]
    gpu_resources: list[str]
    message: str | None
    recorded_message: str | None
    feasible_nodes: list[str]
    nodes: list[NodeVerdict]
    fixes: list[Fix]
    fragmentation: dict[str, list[FragmentationRow]]
    notes: list[str]
    dra: DraExplanation | None = None  # the pod's DRA claims, node by node

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "pending-unschedulable" else 0

    def to_json(self) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies, which is most of the cost with 5,000 nodes.
        return {
            "pod": self.pod,
            "phase": self.phase,
            "node_name": self.node_name,
            "status": self.status,
            "requests": self.requests,
            "gpu_resources": self.gpu_resources,
            "message": self.message,
            "recorded_message": self.recorded_message,
            "feasible_nodes": self.feasible_nodes,
            "nodes": [
                {
                    "node": v.node,
                    "pool": v.pool,
                    "fits": v.fits,
                    "plugin": v.plugin,
                    "reasons": v.reasons,
                    "gpus": {
                        n: {
                            "capacity": c.capacity,
                            "allocatable": c.allocatable,
                            "requested": c.requested,
                            "free": c.free,
                        }
                        for n, c in v.gpus.items()
                    },
                }
                for v in self.nodes
            ],
            "fixes": [asdict(f) for f in self.fixes],
            "fragmentation": {n: [asdict(r) for r in rows] for n, rows in self.fragmentation.items()},
            "notes": self.notes,
            "dra": self.dra.to_json() if self.dra else None,
            "exit_code": self.exit_code,
        }
