"""The fake NVML's devices and handles: GPUs, MIG devices and NVLinks built from a profile, as pointers.

Handles are real pynvml ctypes pointer types whose (never dereferenced) addresses encode what they point
at: BASE | (gpu index + 1) << 8 | x. So they do not compare equal, as real handles do not, and passing a
handle of the wrong type fails with NVML_ERROR_INVALID_ARGUMENT as the real library's type checks do.
"""

from __future__ import annotations

import ctypes
import dataclasses
import random
import threading
from dataclasses import dataclass
from typing import Any, NoReturn

import pynvml

from kubegpu.node.nvml.fake_profile import GpuInstanceProfile, GpuModel, GpuSpec, MigDeviceSpec, Profile
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.node.nvml.pci import parse_pci_bus_id

_DEVICE_BASE = 0x7E57_0000_0000  # x = MIG slot + 1, 0 for the GPU itself
_GPU_INSTANCE_BASE = 0x7E58_0000_0000  # x = GPU instance id
_EVENT_SET_BASE = 0x7E59_0000_0000  # low bits = event set serial
_COMPUTE_INSTANCE_BASE = 0x7E5A_0000_0000  # (gpu + 1) << 16 | GPU instance id << 8 | compute instance id


def fail(code: int) -> NoReturn:
    """Raise pynvml's own NVMLError subclass for `code`, as the real binding does."""
    raise pynvml.NVMLError(code)


def _pointer(ptr_type: Any, address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), ptr_type)


def _address(handle: Any, ptr_type: Any) -> int:
    if not isinstance(handle, ptr_type):
        fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def device_handle(gpu: int, mig_slot: int | None = None) -> Any:
    low = (gpu + 1) << 8 | (0 if mig_slot is None else mig_slot + 1)
    return _pointer(pynvml.c_nvmlDevice_t, _DEVICE_BASE | low)


def gpu_instance_handle(gpu: int, gi: int) -> Any:
    return _pointer(pynvml.c_nvmlGpuInstance_t, _GPU_INSTANCE_BASE | (gpu + 1) << 8 | gi)


def gpu_instance_address(handle: Any) -> tuple[int, int]:
    """(GPU index, GPU instance id) a GPU instance handle encodes; (-1, -1) when it encodes none."""
    low = _address(handle, pynvml.c_nvmlGpuInstance_t) - _GPU_INSTANCE_BASE
    if not 0 < low < 1 << 32:
        return -1, -1
    return (low >> 8) - 1, low & 0xFF


def compute_instance_handle(gpu: int, gi: int, ci: int) -> Any:
    return _pointer(pynvml.c_nvmlComputeInstance_t, _COMPUTE_INSTANCE_BASE | (gpu + 1) << 16 | gi << 8 | ci)


def compute_instance_address(handle: Any) -> tuple[int, int, int]:
    """(GPU index, GPU instance id, compute instance id); (-1, -1, -1) when it encodes none."""
    low = _address(handle, pynvml.c_nvmlComputeInstance_t) - _COMPUTE_INSTANCE_BASE
    if not 0 < low < 1 << 32:
        return -1, -1, -1
    return (low >> 16) - 1, (low >> 8) & 0xFF, low & 0xFF


def event_set_handle(serial: int) -> Any:
    return _pointer(pynvml.c_nvmlEventSet_t, _EVENT_SET_BASE | serial)


def event_set_serial(handle: Any) -> int:
    return _address(handle, pynvml.c_nvmlEventSet_t) - _EVENT_SET_BASE


def pci_info(bus_id: str, device_id: int = 0) -> Any:
    """An nvmlPciInfo_t for a PCI bus ID, with both the legacy and the 8-digit-domain form."""
    domain, bus, device, function = parse_pci_bus_id(bus_id)
    info = pynvml.nvmlPciInfo_t()
    info.busIdLegacy = f"{domain:04X}:{bus:02X}:{device:02X}.{function:X}"
    info.busId = f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"
    info.domain, info.bus, info.device = domain, bus, device
    info.pciDeviceId = device_id
    info.pciSubSystemId = 0
    return info


@dataclass(frozen=True, slots=True)
class Link:
    remote_bus_id: str
    remote_type: int  # NVML_NVLINK_DEVICE_TYPE_*
    remote_device_id: int = 0


@dataclass(frozen=True, slots=True)
class Mig:
    slot: int
    spec: MigDeviceSpec
    gi_profile: GpuInstanceProfile
    compute_slices: int
    placement_start: int = 0  # first memory slice of its GPU instance
    created: bool = False  # created through NVML (`fake_mig.py`), not listed in the profile

    @property
    def placement_size(self) -> int:
        return self.gi_profile.placement_size or self.gi_profile.slices

    @property
    def profile_name(self) -> str:
        if self.compute_slices == self.gi_profile.slices:
            return self.gi_profile.name
        return f"{self.compute_slices}c.{self.gi_profile.name}"


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    spec: GpuSpec
    model: GpuModel
    links: tuple[Link | None, ...]  # one per NVLink port; None = inactive
    migs: tuple[Mig, ...] = ()

    def mig_by_gi(self, gi: int) -> Mig | None:
        return next((m for m in self.migs if m.spec.gi == gi), None)


def build_gpus(profile: Profile) -> tuple[Gpu, ...]:
    """The profile's GPUs with their NVLink ports wired (direct pairs first, then NVSwitch links)."""
    ports: list[list[Link | None]] = [[] for _ in profile.gpus]

    def link_to(i: int) -> Link:
        gpu = profile.gpus[i]
        return Link(
            gpu.pci_bus_id, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, profile.models[gpu.model].pci_device_id
        )

    for pair in profile.nvlink.pairs:
        a, b = pair.gpus
        ports[a] += [link_to(b)] * pair.links
        ports[b] += [link_to(a)] * pair.links
    switches = profile.nvlink.switches
    for links in ports:
        for n in range(profile.nvlink.switch_links_per_gpu):  # spread round-robin, as on DGX boards
            links.append(Link(switches[n % len(switches)], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH))
    gpus = []
    for i, spec in enumerate(profile.gpus):
        model = profile.models[spec.model]
        by_port = tuple(ports[i] + [None] * (model.nvlinks - len(ports[i])))
        gpus.append(Gpu(i, spec, model, by_port, _build_migs(spec, model)))
    return tuple(gpus)


def _build_migs(spec: GpuSpec, model: GpuModel) -> tuple[Mig, ...]:
    if not spec.mig.enabled or model.mig is None:
        return ()
    migs = []
    starts: dict[int, int] = {}  # GPU instances packed in order of first appearance
    next_start = 0
    for slot, dev in enumerate(spec.mig.devices):
        gi_profile = model.mig.profile(dev.profile)
        assert gi_profile is not None  # checked by the schema
        if dev.gi not in starts:
            starts[dev.gi] = next_start
            next_start += gi_profile.slices
        migs.append(
            Mig(
                slot, dev, gi_profile, dev.compute_slices or gi_profile.slices, placement_start=starts[dev.gi]
            )
        )
    return tuple(migs)


def with_created_migs(gpus: tuple[Gpu, ...], created: dict[str, Any]) -> tuple[Gpu, ...]:
    """`gpus` with the MIG devices of `mig.json` (a GPU instance only counts once it has a compute
    instance: before that NVML enumerates no MIG device for it)."""
    out = []
    for gpu in gpus:
        key = str(gpu.index)
        removed = set(created.get("removed", {}).get(key, []))
        removed_ci = {tuple(pair) for pair in created.get("removed_ci", {}).get(key, [])}
        migs = [m for m in gpu.migs if m.spec.gi not in removed and (m.spec.gi, m.spec.ci) not in removed_ci]
        for entry in created.get("gpus", {}).get(key, []):
            if entry.get("ci") is None or gpu.model.mig is None:
                continue
            profile = next(p for p in gpu.model.mig.profiles if p.id == entry["profile_id"])
            spec = MigDeviceSpec(uuid=entry["uuid"], profile=profile.name, gi=entry["gi"], ci=entry["ci"])
            migs.append(Mig(entry["slot"], spec, profile, profile.slices, entry["start"], created=True))
        out.append(dataclasses.replace(gpu, migs=tuple(migs)) if tuple(migs) != gpu.migs else gpu)
    return tuple(out)


class DeviceTable:
    """The fake's GPUs behind their handles, with the checks every NVML call makes first: the library is
    initialized, the handle is one of ours, the GPU is not lost (nor, when flaky, failing this call)."""

    def __init__(self, gpus: tuple[Gpu, ...], state: StateDir) -> None:
        self.state = state
        self._profile_gpus = gpus
        self._lock = threading.Lock()
        self._init_count = 0
        self._created_key: tuple[int, int, int] | None = None
        self._with_created = gpus

    @property
    def _gpus(self) -> tuple[Gpu, ...]:
        """The profile's GPUs with the MIG devices created through NVML (any process) on top."""
        key = self.state.mig_key()
        if key != self._created_key:
            self._with_created = with_created_migs(self._profile_gpus, self.state.read_mig())
            self._created_key = key
        return self._with_created

    def _require_init(self) -> None:
        if self._init_count == 0:
            fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _check_alive(self, gpu: Gpu) -> None:
        faults = self.state.faults().gpu(gpu.index)
        if faults.lost:
            fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        if faults.flaky and random.random() < faults.flaky:
            fail(pynvml.NVML_ERROR_UNKNOWN)

    def _resolve(self, handle: Any) -> tuple[Gpu, Mig | None]:
        self._require_init()
        low = _address(handle, pynvml.c_nvmlDevice_t) - _DEVICE_BASE
        gpu_index, slot = (low >> 8) - 1, (low & 0xFF) - 1
        if not (0 < low < 1 << 32 and 0 <= gpu_index < len(self._gpus)):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[gpu_index]
        self._check_alive(gpu)
        if slot < 0:
            return gpu, None
        mig = next((m for m in gpu.migs if m.slot == slot), None)
        if mig is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, mig

    def _gpu(self, handle: Any) -> Gpu:
        """The physical GPU behind a full-GPU handle; MIG handles are not supported by the caller."""
        gpu, mig = self._resolve(handle)
        if mig is not None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, handle: Any) -> tuple[Gpu, Mig]:
        gpu, mig = self._resolve(handle)
        if mig is None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig

    def _gpu_by_index(self, index: int) -> Gpu:
        self._require_init()
        if not 0 <= index < len(self._gpus):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[index]
        self._check_alive(gpu)
        return gpu

    def _gpu_instance(self, handle: Any) -> tuple[Gpu, Mig]:
        """The GPU and the MIG device of a GPU instance handle."""
        self._require_init()
        low = _address(handle, pynvml.c_nvmlGpuInstance_t) - _GPU_INSTANCE_BASE
        gpu_index, gi = (low >> 8) - 1, low & 0xFF
        if not (0 < low < 1 << 32 and 0 <= gpu_index < len(self._gpus)):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[gpu_index]
        self._check_alive(gpu)
        mig = gpu.mig_by_gi(gi)
        if mig is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, mig
