"""What GFD's labels need beyond the `Inventory`: read once per labelling pass, then labelled purely.

- the machine type (DMI product name) from `--machine-type-file`;
- each MIG device's attributes (SMs, slices, engines, memory), from NVML;
- each GPU's PCI class (display vs 3D controller) from sysfs, for `gpu.mode`;
- each GPU's NVLink fabric cluster and clique, from NVML, for `gpu.clique`;
- vGPU functions on the PCI bus (see `vgpu.py`).

Reading is kept apart from labelling so that the label rules can be tested on hand-made facts.
"""

from __future__ import annotations

import ctypes
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from kubegpu.common.files import FileProblem, read_bytes
from kubegpu.labels.errors import LabelError
from kubegpu.labels.vgpu import VgpuInfo, find_vgpus
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlApi
from kubegpu.node.nvml.pci import sysfs_bus_id

log = logging.getLogger(__name__)

_NO_FABRIC = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@dataclass(frozen=True, slots=True)
class MigAttributes:
    """nvmlDeviceGetAttributes of a MIG device, under the label suffixes GFD gives them."""

    memory: int  # MiB
    multiprocessors: int
    gi_slices: int
    ci_slices: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int

    def by_label_suffix(self) -> dict[str, int]:
        return {
            "memory": self.memory,
            "multiprocessors": self.multiprocessors,
            "slices.gi": self.gi_slices,
            "slices.ci": self.ci_slices,
            "engines.copy": self.copy_engines,
            "engines.decoder": self.decoders,
            "engines.encoder": self.encoders,
            "engines.jpeg": self.jpegs,
            "engines.ofa": self.ofas,
        }


@dataclass(frozen=True, slots=True)
class FabricIds:
    cluster_uuid: str
    clique_id: int


@dataclass(frozen=True, slots=True)
class NodeFacts:
    machine_type: str | None = None  # None: the machine type file could not be read
    mig_attributes: Mapping[str, MigAttributes] = field(default_factory=dict)  # by MIG device UUID
    pci_classes: Mapping[str, str | None] = field(default_factory=dict)  # by GPU UUID; None: unreadable
    fabric: Mapping[str, FabricIds] = field(default_factory=dict)  # by GPU UUID, fabric-attached GPUs only
    vgpus: tuple[VgpuInfo, ...] = ()


def read_machine_type(path: str) -> str | None:
    """The DMI product name in `path` (whitespace-trimmed); None when it cannot be read."""
    if not path:
        return None
    try:
        # A DMI name is a few bytes; reading at most 64 KiB keeps a wrong path (/dev/zero) harmless.
        return read_bytes(path, limit=64 * 1024, what="machine type file").decode("utf-8", "replace").strip()
    except FileProblem as err:
        log.warning("Error getting machine type from %s", err)
        return None


def read_pci_class(sysfs_root: Path, pci_bus_id: str) -> str | None:
    """The GPU's PCI class from sysfs, e.g. "0x030200"; None when unreadable."""
    try:
        path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(pci_bus_id) / "class"
        return path.read_text().strip()
    except (OSError, ValueError) as err:
        log.debug("cannot read the PCI class of GPU %s: %s", pci_bus_id, err)
        return None


def read_mig_attributes(api: NvmlApi, inventory: Inventory) -> dict[str, MigAttributes]:
    """Attributes of every MIG device NVML can read, by UUID. Raises LabelError where GFD fails.

    A device on a GPU that has fallen off the bus is left out (the labels then use another device of the
    same profile); GFD would stop labelling the whole node for it.
    """
    out: dict[str, MigAttributes] = {}
    for gpu in inventory.gpus:
        for mig in gpu.mig_devices:
            try:
                a = api.nvmlDeviceGetAttributes(api.nvmlDeviceGetHandleByUUID(mig.uuid))
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    log.warning("no attributes for MIG device %s: its GPU is lost: %s", mig.uuid, err)
                    continue
                raise LabelError(f"unable to get attributes of MIG device {mig.uuid}: {err}") from err
            out[mig.uuid] = MigAttributes(
                memory=a.memorySizeMB,
                multiprocessors=a.multiprocessorCount,
                gi_slices=a.gpuInstanceSliceCount,
                ci_slices=a.computeInstanceSliceCount,
                copy_engines=a.sharedCopyEngineCount,
                decoders=a.sharedDecoderCount,
                encoders=a.sharedEncoderCount,
                jpegs=a.sharedJpegCount,
                ofas=a.sharedOfaCount,
            )
    return out


def _fabric_info(api: NvmlApi, handle: Any) -> pynvml.c_nvmlGpuFabricInfoV_t | pynvml.c_nvmlGpuFabricInfo_t:
    """The GPU's fabric info, newest NVML call first (the structs are filled in place, hence byref)."""
    try:
        info_v2 = pynvml.c_nvmlGpuFabricInfoV_t()
        info_v2.version = pynvml.nvmlGpuFabricInfo_v2
        api.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info_v2))
        return info_v2
    except pynvml.NVMLError as err:
        if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    info = pynvml.c_nvmlGpuFabricInfo_t()
    api.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return info


def read_fabric(api: NvmlApi, inventory: Inventory) -> dict[str, FabricIds]:
    """Cluster UUID and clique of each GPU whose fabric registration completed (go-nvlib IsFabricAttached)."""
    out: dict[str, FabricIds] = {}
    for gpu in inventory.gpus:
        try:
            info = _fabric_info(api, api.nvmlDeviceGetHandleByUUID(gpu.uuid))
        except pynvml.NVMLError as err:
            if err.value in _NO_FABRIC:
                continue
            if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                log.warning("leaving GPU %s out of the fabric clique: it is lost: %s", gpu.uuid, err)
                continue
            raise LabelError(f"error checking imex capability of GPU {gpu.uuid}: {err}") from err
        cluster = bytes(info.clusterUuid)
        if (
            info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            or info.status != pynvml.NVML_SUCCESS
            or not any(cluster)
        ):
            continue
        out[gpu.uuid] = FabricIds(str(uuid.UUID(bytes=cluster)), info.cliqueId)
    return out


def gather_facts(
    api: NvmlApi, sysfs_root: Path, inventory: Inventory, machine_type_file: str, *, mig_attributes: bool
) -> NodeFacts:
    """Everything GFD reads besides the inventory. NVML must be initialised. Raises LabelError."""
    return NodeFacts(
        machine_type=read_machine_type(machine_type_file),
        mig_attributes=read_mig_attributes(api, inventory) if mig_attributes else {},
        pci_classes={g.uuid: read_pci_class(sysfs_root, g.pci_bus_id) for g in inventory.gpus},
        fabric=read_fabric(api, inventory),
        vgpus=find_vgpus(sysfs_root),
    )
