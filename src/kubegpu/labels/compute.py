"""The labels GFD puts on a node, computed from an `Inventory` and `NodeFacts` (no I/O here).

GFD merges its labelers in this order (a later one overrides an earlier one's keys): timestamp; then, only
when NVML found GPUs: machine type, driver and CUDA versions, MIG capability, MPS capability, resources
(`gpu.*`, MIG strategy), GPU mode, fabric clique; then vGPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import NodeFacts
from kubegpu.labels.naming import sanitise
from kubegpu.labels.resource_labels import Labels, resource_labels
from kubegpu.labels.sharing import SharingSettings
from kubegpu.node.inventory import Gpu, Inventory

log = logging.getLogger(__name__)

MACHINE_TYPE_UNKNOWN = "unknown"
PCI_CLASS_MODES = {"0x030000": "graphics", "0x030200": "compute"}  # VGA controller / 3D controller


def timestamp_labels(timestamp: int | None) -> Labels:
    return {} if timestamp is None else {"nvidia.com/gfd.timestamp": str(timestamp)}


def machine_type_labels(machine_type: str | None) -> Labels:
    value = MACHINE_TYPE_UNKNOWN if machine_type is None else sanitise(machine_type)
    return {"nvidia.com/gpu.machine": value}


def version_labels(driver_version: str, cuda_version: str) -> Labels:
    """Driver "X.Y[.Z]" and CUDA "M.m" versions, under their deprecated and current keys."""
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3:
        raise LabelError(
            f'error getting driver version: Version "{driver_version}" does not match format "X.Y[.Z]"'
        )
    major, minor = parts[0], parts[1]
    rev = parts[2] if len(parts) == 3 else ""
    try:
        cuda_major, cuda_minor = (int(p) for p in cuda_version.split("."))
    except ValueError:
        raise LabelError(
            f"error getting cuda driver version: NVML reported {cuda_version!r}, expected e.g. 12.4"
        ) from None
    return {
        # deprecated keys, still written by GFD
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": str(cuda_major),
        "nvidia.com/cuda.runtime.minor": str(cuda_minor),
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver_version,
        "nvidia.com/cuda.runtime-version.major": str(cuda_major),
        "nvidia.com/cuda.runtime-version.minor": str(cuda_minor),
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


def mig_capable_labels(gpus: Sequence[Gpu]) -> Labels:
    return {"nvidia.com/mig.capable": str(any(g.mig_capable for g in gpus)).lower()}


def mps_capable_labels(gpus: Sequence[Gpu], sharing: SharingSettings) -> Labels:
    if sharing.strategy != "mps":
        return {"nvidia.com/mps.capable": "false"}
    if any(g.mig_enabled for g in gpus):
        raise LabelError("failed to check MPS-capable: MPS sharing is not supported for mig devices")
    return {"nvidia.com/mps.capable": "true"}


def gpu_mode_labels(gpus: Sequence[Gpu], facts: NodeFacts) -> Labels:
    """compute / graphics when every GPU's PCI class says so; unknown when mixed or unreadable."""
    classes = {facts.pci_classes.get(g.uuid) for g in gpus}
    only = classes.pop() if len(classes) == 1 else None  # None also when a class is unreadable
    mode = PCI_CLASS_MODES.get(only, "unknown") if only is not None else "unknown"
    return {"nvidia.com/gpu.mode": mode}


def clique_labels(gpus: Sequence[Gpu], facts: NodeFacts) -> Labels:
    """`<cluster UUID>.<clique>` when every fabric-attached GPU agrees on both."""
    attached = [facts.fabric[g.uuid] for g in gpus if g.uuid in facts.fabric]
    clusters = {f.cluster_uuid for f in attached}
    cliques = {f.clique_id for f in attached}
    if len(clusters) > 1 or len(cliques) > 1:
        log.warning("GPUs disagree on their NVLink fabric: clusters %s, cliques %s", clusters, cliques)
        return {}
    if not attached:
        return {}
    return {"nvidia.com/gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def vgpu_labels(facts: NodeFacts) -> Labels:
    labels = {"nvidia.com/vgpu.present": str(bool(facts.vgpus)).lower()}
    for vgpu in facts.vgpus:  # GFD keeps the last device's
        labels["nvidia.com/vgpu.host-driver-version"] = vgpu.host_driver_version
        labels["nvidia.com/vgpu.host-driver-branch"] = vgpu.host_driver_branch
    return labels


def device_labels(
    inventory: Inventory, facts: NodeFacts, mig_strategy: str, sharing: SharingSettings
) -> Labels:
    """The labels of GFD's device labeler; none when NVML found no GPU."""
    gpus = inventory.gpus
    if not gpus:
        return {}
    labels = machine_type_labels(facts.machine_type)
    labels.update(version_labels(inventory.driver_version, inventory.cuda_driver_version))
    labels.update(mig_capable_labels(gpus))
    labels.update(mps_capable_labels(gpus, sharing))
    labels.update(resource_labels(gpus, facts, mig_strategy, sharing))
    labels.update(gpu_mode_labels(gpus, facts))
    labels.update(clique_labels(gpus, facts))
    return labels


def node_labels(
    inventory: Inventory | None,
    facts: NodeFacts,
    *,
    mig_strategy: str,
    sharing: SharingSettings,
    timestamp: int | None,
) -> Labels:
    """All of GFD's labels. `inventory` None: NVML unavailable and tolerated (--fail-on-init-error=false).

    Raises LabelError where GFD fails to label (e.g. a driver version not shaped X.Y[.Z], MPS with MIG).
    """
    labels = timestamp_labels(timestamp)
    if inventory is not None:
        labels.update(device_labels(inventory, facts, mig_strategy, sharing))
    labels.update(vgpu_labels(facts))
    return labels
