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
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from kubegpu.node.inventory import Gpu, GpuLink, Health, Inventory, LinkLevel, MigDevice
from kubegpu.node.nvml.backend import NvmlApi, NvmlBackend
from kubegpu.node.nvml.pci import parse_pci_bus_id, sysfs_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 * MIB
NVMLError = pynvml.NVMLError
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_NO_SUCH_LINK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)

# MIG profile attribute suffix per GPU instance profile (go-nvlib's MigProfile.String()). The values
# are NVML's ABI; older nvidia-ml-py releases lack some of the names.
_GI_PROFILE_SUFFIX = {
    getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{name}", value): suffix
    for name, value, suffix in [
        ("1_SLICE_REV1", 0x7, "+me"),
        ("2_SLICE_REV1", 0x8, "+me"),
        ("1_SLICE_GFX", 0xA, "+gfx"),
        ("2_SLICE_GFX", 0xB, "+gfx"),
        ("4_SLICE_GFX", 0xC, "+gfx"),
        ("1_SLICE_NO_ME", 0xD, "-me"),
        ("2_SLICE_NO_ME", 0xE, "-me"),
        ("1_SLICE_ALL_ME", 0xF, "+me.all"),
        ("2_SLICE_ALL_ME", 0x10, "+me.all"),
        ("3_SLICE_GFX", 0x11, "+gfx"),
    ]
}
_GI_PROFILE_COUNT = max(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT, max(_GI_PROFILE_SUFFIX) + 1)

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
    links = _read_links(api, found)
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
    mig_capable, mig_enabled = _mig_mode(api, handle)
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
        mig_devices=_mig_devices(api, handle, index, memory) if mig_enabled else (),
    )
    return _Found(gpu, handle, problems)


def numa_node(sysfs_root: Path, pci_bus_id: str) -> int | None:
    """The GPU's NUMA node from sysfs, None when sysfs does not know (missing file or a negative value)."""
    try:
        path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(pci_bus_id) / "numa_node"
        node = int(path.read_text().strip())
    except (OSError, ValueError) as err:
        log.debug("no NUMA node for PCI device %s: %s", pci_bus_id, err)
        return None
    return node if node >= 0 else None


# -- MIG -----------------------------------------------------------------------------------------


def _mig_mode(api: NvmlApi, handle: Any) -> tuple[bool, bool]:
    """(MIG capable, MIG enabled). GPUs without MIG answer NOT_SUPPORTED."""
    try:
        current, _pending = api.nvmlDeviceGetMigMode(handle)
    except NVMLError as err:
        if err.value not in _ABSENT:
            log.warning("cannot read MIG mode, treating the GPU as not MIG capable: %s", err)
        return False, False
    return True, current == pynvml.NVML_DEVICE_MIG_ENABLE


def _mig_devices(api: NvmlApi, parent: Any, gpu_index: int, parent_memory: int) -> tuple[MigDevice, ...]:
    try:
        slots = api.nvmlDeviceGetMaxMigDeviceCount(parent)
    except NVMLError as err:
        log.warning("GPU index=%d: cannot count MIG devices: %s", gpu_index, err)
        return ()
    gi_profiles = _GiProfiles(api, parent)
    devices = []
    for slot in range(slots):
        try:
            handle = api.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except NVMLError as err:
            if err.value != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: an empty slot
                log.warning("GPU index=%d: cannot open MIG device %d: %s", gpu_index, slot, err)
            continue
        try:
            devices.append(_read_mig_device(api, handle, slot, parent_memory, gi_profiles))
        except NVMLError as err:
            log.warning("skipping MIG device %d:%d: NVML cannot read it: %s", gpu_index, slot, err)
    return tuple(devices)


def _read_mig_device(
    api: NvmlApi, handle: Any, slot: int, parent_memory: int, gi_profiles: _GiProfiles
) -> MigDevice:
    attrs = api.nvmlDeviceGetAttributes(handle)
    gi = api.nvmlDeviceGetGpuInstanceId(handle)
    gpu_slices, compute_slices = attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount
    size = f"{gpu_slices}g.{mig_memory_gb(attrs.memorySizeMB, parent_memory)}gb"
    profile = size if compute_slices == gpu_slices else f"{compute_slices}c.{size}"
    return MigDevice(
        uuid=api.nvmlDeviceGetUUID(handle),
        index=slot,
        gi=gi,
        ci=api.nvmlDeviceGetComputeInstanceId(handle),
        profile=profile + gi_profiles.suffix(gi),
        memory_bytes=attrs.memorySizeMB * MIB,
    )


def mig_memory_gb(mig_memory_mib: int, gpu_memory_bytes: int) -> int:
    """The GB in a MIG profile name, as go-nvlib computes it.

    The MIG device's share of the GPU's memory is rounded up to eighths and applied to the GPU's size
    in whole GB. A plain ceil(MiB/1024) agrees on A100 but not everywhere (an H200's 1g slice holds
    about 16.5 GiB yet is "1g.18gb"), and names must match NVIDIA's for resources and labels to match.
    """
    if gpu_memory_bytes <= 0:
        return math.ceil(mig_memory_mib / 1024)
    fraction = math.ceil(mig_memory_mib * MIB / gpu_memory_bytes * 8) / 8
    total_gb = (gpu_memory_bytes + GIB - 1) // GIB
    return math.floor(fraction * total_gb + 0.5)  # Go's math.Round: halves away from zero


class _GiProfiles:
    """Attribute suffix (+me, ...) of a GPU instance, from its profile, looked up once per GPU."""

    def __init__(self, api: NvmlApi, parent: Any) -> None:
        self._api = api
        self._parent = parent
        self._index_by_id: dict[int, int] | None = None
        self._warned = False

    def suffix(self, gi: int) -> str:
        try:
            profile_id = self._api.nvmlGpuInstanceGetInfo(
                self._api.nvmlDeviceGetGpuInstanceById(self._parent, gi)
            ).profileId
        except NVMLError as err:  # e.g. NO_PERMISSION when not privileged: names lose only the suffix
            # Once per GPU: the same cause would repeat for each of its up to 7 MIG devices.
            (log.debug if self._warned else log.warning)(
                "cannot read the profile of GPU instance %d, naming it without attributes: %s", gi, err
            )
            self._warned = True
            return ""
        return _GI_PROFILE_SUFFIX.get(self._profiles().get(profile_id, -1), "")

    def _profiles(self) -> dict[int, int]:
        """GPU instance profile id -> NVML_GPU_INSTANCE_PROFILE_* index."""
        if self._index_by_id is None:
            self._index_by_id = {}
            for index in range(_GI_PROFILE_COUNT):
                info = self._profile_info(index)
                if info is not None:
                    self._index_by_id[info.id] = index
        return self._index_by_id

    def _profile_info(self, index: int) -> Any:
        try:
            return self._api.nvmlDeviceGetGpuInstanceProfileInfo(self._parent, index)
        except NVMLError as err:
            if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:  # driver without the v2 call
                try:
                    return self._api.nvmlDeviceGetGpuInstanceProfileInfo(self._parent, index, 1)
                except NVMLError:
                    return None
            return None  # NOT_SUPPORTED / INVALID_ARGUMENT: no such profile on this GPU


# -- links ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _NvlinkPeers:
    gpus: Counter[tuple[int, int, int, int]]  # NVLinks per remote GPU PCI address
    switch_links: int


def _read_links(api: NvmlApi, found: list[_Found]) -> tuple[GpuLink, ...]:
    addresses = {_pci_key(f.gpu.pci_bus_id) for f in found}
    peers: dict[int, _NvlinkPeers] = {}
    for f in found:
        try:
            peers[f.gpu.index] = _nvlink_peers(api, f.handle, addresses)
        except NVMLError as err:
            _link_failure(f, "NVLinks", err)
    links = []
    for a, b in itertools.combinations(found, 2):
        if a.gpu.index not in peers or b.gpu.index not in peers:
            continue  # one of them failed: leave the pair out rather than guess
        try:
            level = LinkLevel(api.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
        except NVMLError as err:
            log.warning(
                "no link for GPUs %d-%d: cannot read their PCIe topology: %s", a.gpu.index, b.gpu.index, err
            )
            continue
        pa, pb = peers[a.gpu.index], peers[b.gpu.index]
        nvlinks = pa.gpus[_pci_key(b.gpu.pci_bus_id)] + min(pa.switch_links, pb.switch_links)
        links.append(GpuLink(a.gpu.index, b.gpu.index, level, nvlinks))
    return tuple(links)


def _link_failure(found: _Found, what: str, err: NVMLError) -> None:
    log.warning(
        "GPU index=%d uuid=%s: leaving out its links, cannot read its %s: %s",
        found.gpu.index,
        found.gpu.uuid,
        what,
        err,
    )
    if err.value == pynvml.NVML_ERROR_GPU_IS_LOST:
        found.problems.append(f"GPU is lost (fallen off the bus): {err}")


def _pci_key(bus_id: str) -> tuple[int, int, int, int]:
    try:
        return parse_pci_bus_id(bus_id)
    except ValueError:
        return (-1, -1, -1, -1)


def _nvlink_peers(api: NvmlApi, handle: Any, gpu_addresses: set[tuple[int, int, int, int]]) -> _NvlinkPeers:
    """Who each active NVLink of a GPU reaches: counts per remote GPU, and links into NVSwitches."""
    gpus: Counter[tuple[int, int, int, int]] = Counter()
    switch_links = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if api.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = _pci_key(api.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except NVMLError as err:
            if err.value in _NO_SUCH_LINK:
                continue  # past this GPU's last NVLink, or a GPU without NVLink
            raise
        if remote in gpu_addresses:
            gpus[remote] += 1
        elif _remote_is_switch(api, handle, link):
            switch_links += 1
    return _NvlinkPeers(gpus, switch_links)


def _remote_is_switch(api: NvmlApi, handle: Any, link: int) -> bool:
    try:
        return api.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    except NVMLError as err:
        if err.value in _ABSENT:
            return False  # driver too old to tell; a link to something that is not one of our GPUs
        raise
