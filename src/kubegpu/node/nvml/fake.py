"""A fake NVML at the nvidia-ml-py (`pynvml`) API surface, driven by a node profile.

`FakeNvml` has the functions the plugin calls, with pynvml's names and signatures, returning pynvml's
own structs and raising pynvml's own `NVMLError` subclasses with the real codes. Device, GPU instance
and event set handles are real pynvml ctypes pointer types whose (never dereferenced) addresses encode
what they point at (see `fake_handles.py`), so code that works on them works on real NVML handles too:
they do not compare equal, and `pci.device_handle_id()` identifies them. pynvml constants and
classes are reachable as attributes (`fake.NVML_ERROR_NOT_FOUND`); a pynvml function the fake lacks
raises NVML_ERROR_FUNCTION_NOT_FOUND, as an old driver would.

The node comes from a profile (`fake_profile.py`); faults and events from a state directory another
process can write (`fake_state.py`, `kubegpu fake-nvml inject`); the event calls are in `fake_events.py`,
the telemetry calls (utilisation, power, processes; `fake_usage.py` says what `inject` can set) in
`fake_telemetry.py`.

Behaviour worth knowing:
- Every call before nvmlInit (or after the last nvmlShutdown) raises NVML_ERROR_UNINITIALIZED; nvmlInit
  raises the profile's `init_error` (driver not loaded, library not found, ...).
- A lost GPU (`kubegpu fake-nvml inject --lost`) makes every call on it, its MIG devices and its GPU
  instances raise NVML_ERROR_GPU_IS_LOST, nvmlDeviceGetHandleByIndex included.
- MIG device handles support UUID, name, memory, attributes, GI/CI id, PCI info and compute capability
  (the parent's); other calls on them raise NVML_ERROR_NOT_SUPPORTED.
- NVLink slots past the model's link count raise NOT_SUPPORTED (as real GPUs do, which is why
  go-gpuallocator skips that code); past NVML_NVLINK_MAX_LINKS, INVALID_ARGUMENT.
- An event set delivers only events appended after it was created and its device registered, for the
  registered types.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import tempfile
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from kubegpu.common.files import write_atomic
from kubegpu.node.nvml.fake_events import EventCalls
from kubegpu.node.nvml.fake_handles import (
    Gpu,
    Link,
    build_gpus,
    device_handle,
    fail,
    pci_info,
)
from kubegpu.node.nvml.fake_mig import MigCalls
from kubegpu.node.nvml.fake_profile import MigSupport, PciePlacement, Profile, load_profile, summarize
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.node.nvml.fake_telemetry import TelemetryCalls
from kubegpu.node.nvml.pci import parse_pci_bus_id, sysfs_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def _architecture(cc: tuple[int, int]) -> int:
    """NVML's architecture of a model, from its compute capability."""
    if cc == (7, 5):
        return int(pynvml.NVML_DEVICE_ARCH_TURING)
    if cc == (8, 9):
        return int(pynvml.NVML_DEVICE_ARCH_ADA)
    return int(_ARCHITECTURE_BY_CC_MAJOR.get(cc[0], pynvml.NVML_DEVICE_ARCH_UNKNOWN))


_ARCHITECTURE_BY_CC_MAJOR = {
    3: pynvml.NVML_DEVICE_ARCH_KEPLER,
    5: pynvml.NVML_DEVICE_ARCH_MAXWELL,
    6: pynvml.NVML_DEVICE_ARCH_PASCAL,
    7: pynvml.NVML_DEVICE_ARCH_VOLTA,
    8: pynvml.NVML_DEVICE_ARCH_AMPERE,
    9: pynvml.NVML_DEVICE_ARCH_HOPPER,
    10: pynvml.NVML_DEVICE_ARCH_BLACKWELL,
    12: pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}


def _topology_level(a: PciePlacement, b: PciePlacement) -> int:
    if a.cpu != b.cpu:
        return pynvml.NVML_TOPOLOGY_SYSTEM
    if a.host_bridge != b.host_bridge:
        return pynvml.NVML_TOPOLOGY_NODE
    if not a.switches or not b.switches or a.switches[0] != b.switches[0]:
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    return pynvml.NVML_TOPOLOGY_SINGLE if a.switches == b.switches else pynvml.NVML_TOPOLOGY_MULTIPLE


class FakeNvml(MigCalls, EventCalls, TelemetryCalls):
    """A node's NVML as described by a `Profile`, with faults and events from a `StateDir`."""

    def __init__(self, profile: Profile, *, name: str = "custom", state_dir: Path | None = None) -> None:
        self.profile = profile
        self.profile_name = name
        if state_dir is None:
            state_dir = Path(tempfile.mkdtemp(prefix="kubegpu-fake-nvml-"))
            weakref.finalize(self, shutil.rmtree, state_dir, ignore_errors=True)
        super().__init__(build_gpus(profile), StateDir(state_dir).create())
        self._write_sysfs()
        self.state.write_meta(
            {
                "profile": name,
                "pid": os.getpid(),
                "gpus": [{"index": g.index, "uuid": g.spec.uuid} for g in self._gpus],
            }
        )

    @classmethod
    def from_profile(cls, ref: str, *, state_dir: Path | None = None) -> FakeNvml:
        name, profile = load_profile(ref)
        return cls(profile, name=name, state_dir=state_dir)

    @property
    def sysfs_root(self) -> Path:
        return self.state.sysfs_root

    @property
    def description(self) -> str:
        if self.profile.init_error:
            what = f"nvmlInit fails with NVML_ERROR_{self.profile.init_error}"
        else:
            what = summarize(self.profile_name, self.profile).gpus
        return f"fake NVML, profile {self.profile_name} ({what}), state {self.state.path}"

    def _write_sysfs(self) -> None:
        for gpu in self._gpus:
            directory = self.sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(gpu.spec.pci_bus_id)
            directory.mkdir(parents=True, exist_ok=True)
            numa = gpu.spec.numa_node if gpu.spec.numa_node is not None else -1
            write_atomic(directory / "numa_node", f"{numa}\n".encode(), durable=False)
            # PCI class 0x0302xx: a 3D controller, i.e. a GPU in compute mode (GFD's gpu.mode label).
            write_atomic(directory / "class", b"0x030200\n", durable=False)

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and NVMLError classes are pynvml's own; functions the fake lacks fail
        # the way a missing symbol in an old libnvidia-ml does.
        value = getattr(pynvml, name)  # AttributeError for names pynvml does not have either
        if isinstance(value, types.FunctionType) and name.startswith("nvml"):
            return _missing_function(name)
        return value

    # -- library ------------------------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.profile.init_error:
            fail(getattr(pynvml, f"NVML_ERROR_{self.profile.init_error}"))
        with self._lock:
            self._init_count += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._init_count == 0:
                fail(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.profile.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._require_init()
        return f"{self.profile.cuda_driver_version.split('.')[0]}.{self.profile.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._require_init()
        major, minor = self.profile.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    # -- devices ------------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return device_handle(self._gpu_by_index(index).index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._require_init()
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self._gpus:
            slot = None
            if gpu.spec.uuid != wanted:
                slot = next((m.slot for m in gpu.migs if m.spec.uuid == wanted), None)
                if slot is None:
                    continue
            self._check_alive(gpu)
            return device_handle(gpu.index, slot)
        fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        self._require_init()
        wanted = parse_pci_bus_id(pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId)
        for gpu in self._gpus:
            if parse_pci_bus_id(gpu.spec.pci_bus_id) == wanted:
                self._check_alive(gpu)
                return device_handle(gpu.index)
        fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._resolve(handle)
        return mig.spec.uuid if mig else gpu.spec.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu, mig = self._resolve(handle)
        return f"{gpu.model.name} MIG {mig.profile_name}" if mig else gpu.model.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, mig = self._resolve(handle)  # once: a flaky GPU fails one call with the injected rate
        total = (mig.gi_profile.memory_mib if mig else gpu.model.memory_mib) * MIB
        used = min(self._usage(gpu).used_mib(mig.spec.gi if mig else None) * MIB, total)
        memory = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        if version:
            memory.version = version
        memory.total, memory.free, memory.used = total, total - used, used
        return memory

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle).spec.minor

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return _architecture(self._gpu(device).model.cc)

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        self._gpu(handle)
        return pynvml.NVML_BRAND_NVIDIA  # what data-center GPUs report since Ampere

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._resolve(handle)[0].model.cc

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        gpu, _ = self._resolve(handle)
        return pci_info(gpu.spec.pci_bus_id, gpu.model.pci_device_id)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    # -- MIG ----------------------------------------------------------------------------------------

    def _mig_capable(self, device: Any) -> tuple[Gpu, MigSupport]:
        gpu = self._gpu(device)
        if gpu.model.mig is None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.model.mig

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu, _ = self._mig_capable(device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.spec.mig.enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]  # [current, pending]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        return self._mig_capable(device)[1].max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu, mig = self._mig_capable(device)
        if not 0 <= index < mig.max_devices:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not any(m.slot == index for m in gpu.migs):
            fail(pynvml.NVML_ERROR_NOT_FOUND)
        return device_handle(gpu.index, index)

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        # pynvml returns the ctypes c_uint itself here, not its value; so does the fake.
        return ctypes.c_uint(int(self._resolve(device)[1] is not None))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu, mig = self._resolve(migDevice)
        if mig is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device_handle(gpu.index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].spec.gi

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].spec.ci

    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        _, mig = self._mig(device)
        gi = mig.gi_profile
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = gi.multiprocessors * mig.compute_slices // gi.slices
        attrs.sharedCopyEngineCount = gi.copy_engines
        attrs.sharedDecoderCount = gi.decoders
        attrs.sharedEncoderCount = gi.encoders
        attrs.sharedJpegCount = gi.jpegs
        attrs.sharedOfaCount = gi.ofas
        attrs.gpuInstanceSliceCount = gi.slices
        attrs.computeInstanceSliceCount = mig.compute_slices
        attrs.memorySizeMB = gi.memory_mib
        return attrs

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        return self.nvmlDeviceGetAttributes_v2(device)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        _, mig = self._mig_capable(device)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = next((p for p in mig.profiles if p.index == profile), None)
        if found is None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: pynvml.c_nvmlGpuInstanceProfileInfo_t | pynvml.c_nvmlGpuInstanceProfileInfo_v2_t
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.name = f"MIG {found.name}".encode()
        elif version == 1:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
        else:
            fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id, info.isP2pSupported, info.sliceCount = found.id, 0, found.slices
        info.instanceCount, info.multiprocessorCount = found.instances, found.multiprocessors
        info.copyEngineCount, info.decoderCount, info.encoderCount = (
            found.copy_engines,
            found.decoders,
            found.encoders,
        )
        info.jpegCount, info.ofaCount, info.memorySizeMB = found.jpegs, found.ofas, found.memory_mib
        return info

    # -- topology -----------------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._gpu(device1), self._gpu(device2)
        if a.index == b.index:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        return _topology_level(a.spec.pcie, b.spec.pcie)

    def _nvlink(self, device: Any, link: int) -> Link | None:
        gpu = self._gpu(device)
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= len(gpu.links):
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.links[link]

    def _active_nvlink(self, device: Any, link: int) -> Link:
        found = self._nvlink(device, link)
        if found is None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return found

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        active = self._nvlink(device, link) is not None
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        found = self._active_nvlink(device, link)
        return pci_info(found.remote_bus_id, found.remote_device_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._active_nvlink(handle, link).remote_type

    # -- health -------------------------------------------------------------------------------------

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu = self._gpu(device)
        if gpu.model.ecc_recovery != "page_retirement":
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pending = self.state.faults().gpu(gpu.index).remap_pending
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(device)
        if gpu.model.ecc_recovery != "row_remapping":
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.state.faults().gpu(gpu.index)
        return (0, faults.ecc_uncorrected, int(faults.remap_pending), 0)  # corr, unc, pending, failure

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        if gpu.model.ecc_recovery == "none":
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        faults = self.state.faults().gpu(gpu.index)
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return faults.ecc_corrected
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return faults.ecc_uncorrected
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _missing_function(name: str) -> Callable[..., NoReturn]:
    def missing(*args: Any, **kwargs: Any) -> NoReturn:
        log.debug("fake NVML has no %s; raising NVML_ERROR_FUNCTION_NOT_FOUND", name)
        fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    missing.__name__ = name
    return missing
