"""Discovery of a GPU's MIG mode and MIG devices, named as NVIDIA names them (go-nvlib's profiles)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import pynvml

from kubegpu.node.inventory import MigDevice, MigEngines
from kubegpu.node.nvml.backend import NvmlApi

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 * MIB
NVMLError = pynvml.NVMLError
_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a GPU without MIG

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


def mig_mode(api: NvmlApi, handle: Any, gpu: str = "?") -> tuple[bool, bool]:
    """(MIG capable, MIG enabled). GPUs without MIG answer NOT_SUPPORTED. `gpu` names it in the log."""
    try:
        current, _pending = api.nvmlDeviceGetMigMode(handle)
    except NVMLError as err:
        if err.value not in _ABSENT:
            log.warning("GPU %s: cannot read MIG mode, treating it as not MIG capable: %s", gpu, err)
        return False, False
    return True, current == pynvml.NVML_DEVICE_MIG_ENABLE


def mig_devices(api: NvmlApi, parent: Any, gpu_index: int, parent_memory: int) -> tuple[MigDevice, ...]:
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
    facts = gi_profiles.facts(gi)
    return MigDevice(
        uuid=api.nvmlDeviceGetUUID(handle),
        index=slot,
        gi=gi,
        ci=api.nvmlDeviceGetComputeInstanceId(handle),
        profile=profile + facts.suffix,
        memory_bytes=attrs.memorySizeMB * MIB,
        gi_profile_id=facts.profile_id,
        placement_start=facts.placement_start,
        placement_size=facts.placement_size,
        engines=facts.engines,
    )


def engines_of(profile: Any) -> MigEngines:
    """A GPU instance profile's engines, from NVML's nvmlGpuInstanceProfileInfo(_v2)_t."""
    return MigEngines(
        multiprocessors=profile.multiprocessorCount,
        copy_engines=profile.copyEngineCount,
        decoders=profile.decoderCount,
        encoders=profile.encoderCount,
        jpegs=profile.jpegCount,
        ofas=profile.ofaCount,
    )


def gi_profile_name(index: int, slices: int, memory_mib: int, gpu_memory_bytes: int) -> str:
    """go-nvlib's name of a GPU instance profile (NVML_GPU_INSTANCE_PROFILE_* `index`), e.g. "1g.10gb+me"."""
    return f"{slices}g.{mig_memory_gb(memory_mib, gpu_memory_bytes)}gb" + _GI_PROFILE_SUFFIX.get(index, "")


GI_PROFILE_COUNT = max(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT, max(_GI_PROFILE_SUFFIX) + 1)


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


@dataclass(frozen=True, slots=True)
class _GiFacts:
    suffix: str = ""
    profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int = 0
    engines: MigEngines | None = None


class _GiProfiles:
    """A GPU instance's profile (attribute suffix +me..., ID, placement, engines), looked up once per GPU."""

    def __init__(self, api: NvmlApi, parent: Any) -> None:
        self._api = api
        self._parent = parent
        self._by_id: dict[int, tuple[int, Any]] | None = None
        self._warned = False

    def facts(self, gi: int) -> _GiFacts:
        try:
            info = self._api.nvmlGpuInstanceGetInfo(self._api.nvmlDeviceGetGpuInstanceById(self._parent, gi))
        except NVMLError as err:  # e.g. NO_PERMISSION when not privileged: names lose only the suffix
            # Once per GPU: the same cause would repeat for each of its up to 7 MIG devices.
            (log.debug if self._warned else log.warning)(
                "cannot read the profile of GPU instance %d, naming it without attributes: %s", gi, err
            )
            self._warned = True
            return _GiFacts()
        index, profile = self._profiles().get(info.profileId, (-1, None))
        engines = engines_of(profile) if profile is not None else None
        return _GiFacts(
            suffix=_GI_PROFILE_SUFFIX.get(index, ""),
            profile_id=info.profileId,
            placement_start=info.placement.start,
            placement_size=info.placement.size,
            engines=engines,
        )

    def _profiles(self) -> dict[int, tuple[int, Any]]:
        """GPU instance profile id -> (NVML_GPU_INSTANCE_PROFILE_* index, its profile info)."""
        if self._by_id is None:
            self._by_id = {}
            for index in range(_GI_PROFILE_COUNT):
                info = self._profile_info(index)
                if info is not None:
                    self._by_id[info.id] = (index, info)
        return self._by_id

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
