"""Discovery: read the node's GPUs from NVML into an `Inventory` snapshot.

Written only against the nvidia-ml-py (`pynvml`) API, so the same code runs on real NVML and on the
fake. It reads what NVIDIA's plugin reads (go-nvlib, go-gpuallocator) and tolerates what real nodes do:
NOT_SUPPORTED means "absent", and a GPU that fails part-way costs only what could not be read.

What happens to a GPU NVML cannot fully read:
- no handle or no UUID (e.g. it fell off the bus before we started): skipped with a warning, since
  every device the plugin advertises is named by its UUID;
- UUID readable but another basic property not: included, unhealthy, the reason naming the field;
- errors while reading its links: its links are left out (and it is marked unhealthy if NVML says
  it is lost), the rest of the node is discovered as usual;
- a MIG device whose identity cannot be read: skipped with a warning.

MIG devices are read in `discovery_mig`, the links between GPUs in `discovery_links`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from kubegpu.node.discovery_links import read_links
from kubegpu.node.discovery_mig import mig_devices, mig_mode
from kubegpu.node.inventory import Gpu, Health, Inventory
from kubegpu.node.nvml.backend import NvmlApi, NvmlBackend
from kubegpu.node.nvml.pci import sysfs_bus_id
from kubegpu.node.nvml_names import ARCHITECTURES, BRANDS

log = logging.getLogger(__name__)
NVMLError = pynvml.NVMLError

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------
# Session and errors
# ------------------------------------------------------------------------------------------------


def _api(nvml: NvmlBackend | NvmlApi) -> NvmlApi:
    return nvml.nvml if isinstance(nvml, NvmlBackend) else nvml


@contextmanager
def nvml_session(nvml: NvmlBackend | NvmlApi) -> Iterator[NvmlApi]:
    """nvmlInit on entry (its NVMLError propagates; see `explain_nvml_error`), nvmlShutdown on exit."""
    api = _api(nvml)
    api.nvmlInit()
    try:
        yield api
    finally:
        try:
            api.nvmlShutdown()
        except NVMLError as err:
            log.warning("nvmlShutdown failed: %s", err)


_EXPLANATIONS: dict[int, str] = {
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "The NVIDIA kernel driver isn't loaded on this node: install the driver or load it "
        "(`modprobe nvidia`; with the GPU operator, check its driver pod), then restart the plugin"
    ),
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 not found: is the NVIDIA container toolkit the runtime (default runtime "
        "`nvidia` in containerd/CRI-O, or runtimeClassName: nvidia on this pod)? Without it the driver "
        "libraries are not mounted into the plugin container"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "NVML was denied access to the GPUs: run the plugin privileged (or as root) with the "
        "/dev/nvidia* device nodes available"
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "libnvidia-ml and the loaded NVIDIA kernel module are from different driver versions "
        "(usually a driver upgrade without a reboot): reboot the node or reload the nvidia modules"
    ),
    pynvml.NVML_ERROR_GPU_IS_LOST: (
        "A GPU has fallen off the bus (XID 79): drain the node, then reset the GPU or reboot it"
    ),
    pynvml.NVML_ERROR_RESET_REQUIRED: "A GPU needs a reset: drain the node and reset the GPU or reboot it",
    pynvml.NVML_ERROR_IRQ_ISSUE: (
        "The NVIDIA driver cannot get interrupts from a GPU: check `dmesg` for NVRM errors and the "
        "BIOS/kernel interrupt settings"
    ),
    pynvml.NVML_ERROR_OPERATING_SYSTEM: (
        "The operating system blocked the NVML request: check SELinux/AppArmor policy and that "
        "/dev/nvidia* is accessible to the plugin"
    ),
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: (
        "The installed NVIDIA driver is too old for this NVML call: upgrade the driver"
    ),
    pynvml.NVML_ERROR_INSUFFICIENT_POWER: "A GPU lacks external power: check its power cables",
    pynvml.NVML_ERROR_UNINITIALIZED: (
        "NVML was used before nvmlInit succeeded: this is a kubegpu bug, please report it"
    ),
}


def explain_nvml_error(err: NVMLError) -> str:
    """A sentence naming the cause of an NVML (init) failure and the fix."""
    code = getattr(err, "value", None)
    explanation = _EXPLANATIONS.get(code) if isinstance(code, int) else None
    if explanation is None:
        explanation = (
            "NVML is not usable on this node: check the NVIDIA driver (`nvidia-smi` on the node) "
            "and the plugin logs"
        )
    return f"{explanation} (NVML error {code}: {err})."


# ------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------


@dataclass
class _Found:
    """A GPU being discovered: what goes into the Inventory plus what link discovery needs."""

    gpu: Gpu
    handle: Any
    problems: list[str] = field(default_factory=list)


def discover(nvml: NvmlBackend | NvmlApi, sysfs_root: Path | None = None) -> Inventory:
    """The node's GPUs as an Inventory. NVML must be initialised (see `nvml_session`).

    `sysfs_root` defaults to the backend's (or /sys for a bare pynvml module). System-level NVML
    failures (no device count) raise NVMLError; per-GPU failures are logged and contained.
    """
    api = _api(nvml)
    if sysfs_root is None:
        sysfs_root = nvml.sysfs_root if isinstance(nvml, NvmlBackend) else Path("/sys")
    found = [f for f in (_read_gpu(api, i, sysfs_root) for i in range(api.nvmlDeviceGetCount())) if f]
    links, lost = read_links(api, [(f.gpu, f.handle) for f in found])
    for f in found:
        if f.gpu.index in lost:
            f.problems.append(lost[f.gpu.index])
    return Inventory(
        gpus=tuple(_with_health(f) for f in found),
        links=links,
        driver_version=_optional(api.nvmlSystemGetDriverVersion, "", "driver version"),
        cuda_driver_version=_cuda_version(api),
    )


def _optional(call: Any, default: T, what: str) -> T:
    try:
        return call()
    except NVMLError as err:
        log.warning("cannot read %s from NVML: %s", what, err)
        return default


def _cuda_version(api: NvmlApi) -> str:
    try:
        version = api.nvmlSystemGetCudaDriverVersion_v2()
    except NVMLError:
        version = _optional(api.nvmlSystemGetCudaDriverVersion, 0, "CUDA driver version")
    if not version:
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"  # 12040 -> "12.4"


def _with_health(found: _Found) -> Gpu:
    if not found.problems:
        return found.gpu
    health = Health.failed("; ".join(found.problems))
    migs = tuple(replace(m, health=health) for m in found.gpu.mig_devices)
    return replace(found.gpu, health=health, mig_devices=migs)


def _read_gpu(api: NvmlApi, index: int, sysfs_root: Path) -> _Found | None:
    try:
        handle = api.nvmlDeviceGetHandleByIndex(index)
        uuid = api.nvmlDeviceGetUUID(handle)
    except NVMLError as err:
        log.warning("skipping GPU index=%d: NVML cannot read its handle or UUID: %s", index, err)
        return None
    problems: list[str] = []

    def read(call: Any, default: T, what: str) -> T:
        try:
            return call(handle)
        except NVMLError as err:
            log.warning("GPU index=%d uuid=%s: cannot read %s: %s", index, uuid, what, err)
            problems.append(f"NVML cannot read the {what}: {err}")
            return default

    memory = read(lambda h: api.nvmlDeviceGetMemoryInfo(h).total, 0, "memory size")
    pci_bus_id = read(lambda h: api.nvmlDeviceGetPciInfo(h).busId, "", "PCI bus id")
    major, minor = read(api.nvmlDeviceGetCudaComputeCapability, (0, 0), "compute capability")
    mig_capable, mig_enabled = mig_mode(api, handle, f"index={index} uuid={uuid}")
    gpu = Gpu(
        index=index,
        uuid=uuid,
        name=read(api.nvmlDeviceGetName, "unknown", "name"),
        memory_bytes=memory,
        minor=read(api.nvmlDeviceGetMinorNumber, -1, "minor number"),
        compute_capability=(major, minor),
        pci_bus_id=pci_bus_id,
        numa_node=numa_node(sysfs_root, pci_bus_id) if pci_bus_id else None,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=mig_devices(api, handle, index, memory) if mig_enabled else (),
        pcie_root=pcie_root(sysfs_root, pci_bus_id) if pci_bus_id else None,
        architecture=_named(api.nvmlDeviceGetArchitecture, handle, ARCHITECTURES, "architecture"),
        brand=_named(api.nvmlDeviceGetBrand, handle, BRANDS, "brand"),
    )
    return _Found(gpu, handle, problems)


def _named(call: Any, handle: Any, names: dict[int, str], what: str) -> str:
    """An enum NVML reports, by go-nvlib's name; "" when NVML cannot say (not a health problem)."""
    try:
        return names.get(call(handle), "")
    except NVMLError as err:
        log.debug("cannot read the %s: %s", what, err)
        return ""


def numa_node(sysfs_root: Path, pci_bus_id: str) -> int | None:
    """The GPU's NUMA node from sysfs, None when sysfs does not know (missing file or a negative value)."""
    try:
        path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(pci_bus_id) / "numa_node"
        node = int(path.read_text().strip())
    except (OSError, ValueError) as err:
        log.debug("no NUMA node for PCI device %s: %s", pci_bus_id, err)
        return None
    return node if node >= 0 else None


def pcie_root(sysfs_root: Path, pci_bus_id: str) -> str | None:
    """The PCIe root complex the GPU hangs under ("pci0000:00"), from where its sysfs link points (the
    standard `resource.kubernetes.io/pcieRoot` attribute). None when sysfs does not show it."""
    try:
        target = (sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(pci_bus_id)).resolve(strict=True)
    except OSError:
        return None
    return next((part for part in target.parts if _PCIE_ROOT.fullmatch(part)), None)


_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
