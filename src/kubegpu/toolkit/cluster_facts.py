"""What the tools need to know about a cluster: GPU nodes, the plugin's DaemonSet, the resources offered.

`lint --snapshot` asks which nodes offer which GPU resources, how those are shared, which RuntimeClasses
exist and whether GPU pods must name one; `doctor --cluster` which nodes promise GPUs by their labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.model import Container, DaemonSet, Node, allocatable, capacity
from kubegpu.toolkit.snapshot import Snapshot

PLUGIN_IMAGES = ("k8s-device-plugin", "nvidia-device-plugin", "kubegpu")
PRESENT_LABELS = ("nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present")
ACCELERATOR_LABELS = ("cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator")


def label_count(text: str | None) -> int:
    """A count label's value; 0 when it is absent or not a number."""
    try:
        return int(text or "0")
    except ValueError:
        return 0


def promises_gpus(node: Node) -> bool:
    """The node's labels (GFD, NFD, a cloud's accelerator label) say it has NVIDIA GPUs."""
    labels = node.metadata.labels or {}
    return (
        any(labels.get(k) == "true" for k in PRESENT_LABELS)
        or any(k in labels for k in ACCELERATOR_LABELS)
        or label_count(labels.get("nvidia.com/gpu.count")) > 0
    )


# The other daemons shipped in the plugin's image: GFD, the MPS control daemon, the config-manager.
NOT_THE_PLUGIN = ("gpu-feature-discovery", "mps-control-daemon", "config-manager")


def _runs_plugin(container: Container) -> bool:
    if not any(marker in container.image for marker in PLUGIN_IMAGES):
        return False
    command = container.command or []
    if not command:
        return True  # the image's entrypoint: NVIDIA's image starts the plugin
    text = " ".join(command)
    if "kubegpu" in text:  # `kubegpu plugin`, `python -m kubegpu plugin`; not `python -m kubegpu.mps run`
        return re.search(r"\bkubegpu plugin\b", text) is not None
    return command[0].rpartition("/")[2] not in NOT_THE_PLUGIN


def is_plugin_daemonset(ds: DaemonSet) -> bool:
    """The NVIDIA (or our) device plugin, recognised by the command its image runs, or its name; not the
    GFD, labels or MPS DaemonSets that run the same image."""
    name = ds.metadata.name
    return any(_runs_plugin(c) for c in ds.spec.template.spec.containers or []) or (
        "device-plugin" in name and ("nvidia" in name or "gpu" in name)
    )


@dataclass
class ClusterFacts:
    offered: dict[str, list[tuple[Node, int]]] = field(
        default_factory=dict
    )  # resource -> (node, allocatable)
    runtime_classes: dict[str, str] = field(default_factory=dict)  # name -> handler
    plugin_runtime_class: str | None = None  # set when the plugin DaemonSet itself runs under one
    plugin_daemonset: str | None = None
    nodes: list[Node] = field(default_factory=list)
    # resource.k8s.io objects by kind, as the snapshot holds them; a kind is present when it was listed
    dra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, snap: Snapshot) -> ClusterFacts:
        facts = cls(nodes=list(snap.nodes), dra=snap.dra)
        for node in snap.nodes:
            amounts = res.node_amounts(allocatable(node) or capacity(node))
            for name, amount in amounts.items():
                if is_extended_resource_name(name) and amount > 0:
                    facts.offered.setdefault(name, []).append((node, amount))
        facts.runtime_classes = {rc.metadata.name: rc.handler for rc in snap.runtime_classes}
        for ds in snap.daemonsets:
            if is_plugin_daemonset(ds):
                facts.plugin_daemonset = f"{ds.metadata.namespace}/{ds.metadata.name}"
                facts.plugin_runtime_class = ds.spec.template.spec.runtime_class_name or None
                break
        return facts

    def sharing(self, resource: str) -> str | None:
        """'mps' or 'time-slicing' when the nodes offering `resource` label it as shared (GFD labels)."""
        base = resource.removesuffix(".shared")
        prefix = base if res.is_mig(base) else "nvidia.com/gpu"  # GFD labels MIG profiles separately
        strategies = set()
        for node, _ in self.offered.get(resource, []):
            node_labels = node.metadata.labels or {}
            strategy = node_labels.get(f"{prefix}.sharing-strategy")
            if strategy in ("mps", "time-slicing"):
                strategies.add(strategy)
            elif node_labels.get(f"{prefix}.replicas", "1") not in ("0", "1"):
                strategies.add("time-slicing")
        if "mps" in strategies:
            return "mps"
        return "time-slicing" if strategies else None
