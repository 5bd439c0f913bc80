"""GFD's resource labels: `nvidia.com/gpu.*` for full GPUs, and the MIG strategies' `mig-<profile>.*`.

Each labelled resource is named like the plugin's resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`);
its labels are `<resource>.<suffix>`, and its sharing is looked up by that name. GFD builds these from
Go maps, so where several models or profiles write the same keys the winner is random there; here the
order is the GPUs' NVML order, so the output is stable (and is one of GFD's possible outputs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import NodeFacts
from kubegpu.labels.naming import arch_family, mig_profile_name, product_name
from kubegpu.labels.sharing import SharingSettings
from kubegpu.node.inventory import Gpu, MigDevice

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIB = 1024 * 1024

Labels = dict[str, str]


@dataclass(frozen=True, slots=True)
class _Resource:
    """One resource's labels. `sharing` None means "labelled without sharing" (MIG-enabled parents)."""

    name: str
    sharing: SharingSettings | None

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"

    def _replicas_configured(self) -> int:
        replication = self.sharing.replication(self.name) if self.sharing else None
        return replication.replicas if replication else 0

    def replicas(self) -> int:
        if self.sharing is None:
            return 0  # GFD's marker for "sharing does not apply here"
        return self._replicas_configured() or 1

    def shared(self) -> bool:
        return self._replicas_configured() > 1

    def renamed(self) -> bool:
        replication = self.sharing.replication(self.name) if self.sharing else None
        return bool(replication and replication.renamed)

    def product(self, *parts: str) -> str:
        return product_name(parts, shared_suffix=self.shared() and not self.renamed())

    def base(self, count: int, *parts: str) -> Labels:
        """product, count, replicas and sharing-strategy."""
        replicas = self.replicas()
        strategy = self.sharing.strategy if self.sharing is not None and replicas > 1 else "none"
        return {
            self.key("product"): self.product(*parts),
            self.key("count"): str(count),
            self.key("replicas"): str(replicas),
            self.key("sharing-strategy"): strategy,
        }


def _full_gpu_labels(resource: _Resource, gpu: Gpu, count: int) -> Labels:
    labels = resource.base(count, gpu.name)
    memory_mib = gpu.memory_bytes // MIB
    if memory_mib != 0:
        labels[resource.key("memory")] = str(memory_mib)
    major, minor = gpu.compute_capability
    if major != 0:  # compute capability unknown: no family or compute labels
        labels[resource.key("family")] = arch_family(major, minor)
        labels[resource.key("compute.major")] = str(major)
        labels[resource.key("compute.minor")] = str(minor)
    return labels


def gpu_labels(gpus: Sequence[Gpu], sharing: SharingSettings) -> Labels:
    """`nvidia.com/gpu.*` for the physical GPUs, whatever the MIG strategy.

    `count` is every GPU of the model, MIG-enabled or not. MIG-enabled GPUs are labelled without sharing
    (replicas 0) and GPUs with MIG disabled, labelled with sharing, override them.
    """
    counts: dict[str, int] = {}
    first_mig_enabled: dict[str, Gpu] = {}
    first_full: dict[str, Gpu] = {}
    for gpu in gpus:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
        (first_mig_enabled if gpu.mig_enabled else first_full).setdefault(gpu.name, gpu)
    if len(counts) > 1:
        log.warning("Multiple device types detected: %s", sorted(counts))
    labels: Labels = {}
    for name, gpu in first_mig_enabled.items():
        labels.update(_full_gpu_labels(_Resource(GPU_RESOURCE, None), gpu, counts[name]))
    for name, gpu in first_full.items():
        labels.update(_full_gpu_labels(_Resource(GPU_RESOURCE, sharing), gpu, counts[name]))
    return labels


@dataclass(frozen=True, slots=True)
class _MigGroup:
    """The MIG devices of one profile, in NVML order; GFD labels the profile from the first one."""

    profile: str  # as GFD names it: "1g.10gb.me"
    parent: Gpu  # of the first device
    devices: tuple[MigDevice, ...]


def _mig_groups(gpus: Iterable[Gpu]) -> list[_MigGroup]:
    groups: dict[str, _MigGroup] = {}
    for gpu in gpus:
        for mig in gpu.mig_devices:
            name = mig_profile_name(mig.profile)
            group = groups.get(name)
            if group is None:
                groups[name] = _MigGroup(name, gpu, (mig,))
            else:
                groups[name] = _MigGroup(name, group.parent, (*group.devices, mig))
    return list(groups.values())


def _mig_labels(resource: _Resource, group: _MigGroup, facts: NodeFacts) -> Labels:
    # devices of one profile share their attributes; any readable one will do (a lost GPU's cannot be read)
    attributes = next(
        (facts.mig_attributes[d.uuid] for d in group.devices if d.uuid in facts.mig_attributes), None
    )
    if attributes is None:
        raise LabelError(f"unable to get attributes of MIG device {group.devices[0].uuid}")
    labels = resource.base(len(group.devices), group.parent.name, "MIG", group.profile)
    labels.update({resource.key(k): str(v) for k, v in attributes.by_label_suffix().items()})
    return labels


def _invalid_single(model: str, reason: str) -> Labels:
    log.warning("Invalid configuration detected for mig-strategy=single: %s", reason)
    resource = _Resource(GPU_RESOURCE, None)
    return {
        resource.key("product"): resource.product(model, "MIG", "INVALID"),
        resource.key("count"): "0",
        resource.key("replicas"): "0",
        resource.key("sharing-strategy"): "",
        resource.key("memory"): "0",
    }


def mig_single_labels(gpus: Sequence[Gpu], facts: NodeFacts, sharing: SharingSettings) -> Labels:
    """mig-strategy=single: every GPU MIG-enabled with one profile throughout, exposed as nvidia.com/gpu."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return {}  # nothing to do: the same as strategy none
    model = enabled[0].name
    if any(not g.mig_devices for g in enabled):
        return _invalid_single(model, "at least one MIG device is enabled but empty")
    if len(enabled) != len(gpus):
        return _invalid_single(model, "devices with MIG enabled and disable detected")
    groups = _mig_groups(enabled)
    if len(groups) != 1:
        return _invalid_single(model, "more than one MIG device type present on node")
    return _mig_labels(_Resource(GPU_RESOURCE, sharing), groups[0], facts)


def mig_mixed_labels(gpus: Sequence[Gpu], facts: NodeFacts, sharing: SharingSettings) -> Labels:
    """mig-strategy=mixed: `nvidia.com/mig-<profile>.*` per profile; empty MIG-enabled GPUs are ignored."""
    labels: Labels = {}
    for group in _mig_groups(g for g in gpus if g.mig_enabled):
        labels.update(_mig_labels(_Resource(MIG_RESOURCE_PREFIX + group.profile, sharing), group, facts))
    return labels


def resource_labels(
    gpus: Sequence[Gpu], facts: NodeFacts, mig_strategy: str, sharing: SharingSettings
) -> Labels:
    """GFD's resource labeler: full GPU labels, then the MIG strategy's (which override them)."""
    labels = gpu_labels(gpus, sharing)
    if mig_strategy == "none":
        return labels
    if mig_strategy == "single":
        mig = mig_single_labels(gpus, facts, sharing)
    elif mig_strategy == "mixed":
        mig = mig_mixed_labels(gpus, facts, sharing)
    else:
        raise LabelError(f"unknown strategy: {mig_strategy}")
    labels[MIG_STRATEGY_LABEL] = mig_strategy
    labels.update(mig)
    return labels
