"""The fake NVML's MIG management calls: GPU and compute instances created and destroyed at placements.

What NVML enforces, the fake enforces, with NVML's codes:
- on a GPU whose MIG mode is off, creating anything is NOT_SUPPORTED (the fake never toggles MIG mode,
  and neither does the driver: NVIDIA's A100 rule);
- a profile ID the GPU does not have, or a placement that is not one of the profile's possible placements
  (`nvidia-smi mig -lgipp`), is INVALID_ARGUMENT;
- a placement whose memory slices another GPU instance holds, one more instance of a profile than it
  allows, more compute slices than the GPU has, or a second media-extended (+me) instance, is
  INSUFFICIENT_RESOURCES;
- destroying a GPU instance that still has a compute instance is IN_USE; a handle to an instance that is
  gone is INVALID_ARGUMENT (NVML validates the handle).
Only the compute instance that covers its whole GPU instance can be created (the one NVIDIA's DRA driver
uses); others are NOT_SUPPORTED.

The instances live in the state directory's `mig.json` (`fake_state.py`), so they outlive the process that
created them and every process on the node sees them, as on a real node; discovery sees a created
instance as a MIG device once it has its compute instance.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

import pynvml

from kubegpu.node.nvml.fake_handles import (
    DeviceTable,
    Gpu,
    compute_instance_address,
    compute_instance_handle,
    device_handle,
    fail,
    gpu_instance_address,
    gpu_instance_handle,
)
from kubegpu.node.nvml.fake_profile import GpuInstanceProfile, MigSupport

# NVML_COMPUTE_INSTANCE_PROFILE_* index of the compute instance spanning a GPU instance of n slices
FULL_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def _ref_value(ref: Any) -> Any:
    """The object behind ctypes.byref(x) or ctypes.pointer(x)."""
    return ref._obj if hasattr(ref, "_obj") else ref.contents


class MigCalls(DeviceTable):
    """GPU and compute instance management on the fake's GPUs."""

    # -- what the GPU holds ---------------------------------------------------------------------------

    def _instances(self, gpu: Gpu) -> list[dict[str, Any]]:
        """Every GPU instance on the GPU: the profile's (static) and the created ones, with their
        profile, placement and compute instance (None: none yet)."""
        assert gpu.model.mig is not None
        state = self.state.read_mig()
        removed = set(state.get("removed", {}).get(str(gpu.index), []))
        out: list[dict[str, Any]] = []
        for mig in self._profile_gpus[gpu.index].migs:  # the profile's, whatever CI was destroyed
            if mig.spec.gi not in removed and not any(i["gi"] == mig.spec.gi for i in out):
                out.append({"gi": mig.spec.gi, "profile_id": mig.gi_profile.id, "start": mig.placement_start})
        return out + list(state.get("gpus", {}).get(str(gpu.index), []))

    def _enabled(self, device: Any) -> tuple[Gpu, MigSupport]:
        gpu = self._gpu(device)
        if gpu.model.mig is None or not gpu.spec.mig.enabled:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.model.mig

    @staticmethod
    def _profile_by_id(mig: MigSupport, profile_id: int) -> GpuInstanceProfile:
        found = next((p for p in mig.profiles if p.id == profile_id), None)
        if found is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    # -- GPU instances --------------------------------------------------------------------------------

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        """NVML's two-call convention: a null placements array asks for the count only."""
        gpu, _ = self._mig_capable_gpu(device)
        assert gpu.model.mig is not None
        profile = self._profile_by_id(gpu.model.mig, profileId)
        count = _ref_value(countRef)
        if not profile.placements:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if placementsRef is None:
            count.value = len(profile.placements)
            return int(pynvml.NVML_SUCCESS)
        if count.value < len(profile.placements):
            count.value = len(profile.placements)
            fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for n, start in enumerate(profile.placements):
            placementsRef[n].start, placementsRef[n].size = start, profile.placement_size
        count.value = len(profile.placements)
        return int(pynvml.NVML_SUCCESS)

    def _mig_capable_gpu(self, device: Any) -> tuple[Gpu, MigSupport]:
        gpu = self._gpu(device)
        if gpu.model.mig is None:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, gpu.model.mig

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        gpu, mig = self._enabled(device)
        profile = self._profile_by_id(mig, profileId)
        if not profile.placements:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        start, size = int(placement.start), int(placement.size)
        if start not in profile.placements or size != profile.placement_size:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        created: dict[str, int] = {}

        def take(state: dict[str, Any]) -> dict[str, Any]:
            self._check_fits(gpu, mig, profile, start)  # under the directory lock: no two take one slice
            held = {i["gi"] for i in self._instances(gpu)}
            gi = next(n for n in range(1, 255) if n not in held)
            entry = {
                "gi": gi,
                "profile_id": profile.id,
                "start": start,
                "ci": None,
                "slot": None,
                "uuid": None,
            }
            state.setdefault("gpus", {}).setdefault(str(gpu.index), []).append(entry)
            created["gi"] = gi
            return state

        self.state.update_mig(take)
        return gpu_instance_handle(gpu.index, created["gi"])

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        """The first possible placement that is free, as NVML picks one."""
        _, mig = self._enabled(device)
        profile = self._profile_by_id(mig, profileId)
        for start in profile.placements:
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, profile.placement_size or 0
            try:
                return self.nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
                    raise
        fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        gpu, mig = self._enabled(device)
        profile = self._profile_by_id(mig, profileId)
        free = 0
        for start in profile.placements:
            try:
                self._check_fits(gpu, mig, profile, start)
            except pynvml.NVMLError:
                continue
            free += 1
        return min(free, profile.instances - self._count(gpu, profile.id))

    def _count(self, gpu: Gpu, profile_id: int) -> int:
        return sum(1 for i in self._instances(gpu) if i["profile_id"] == profile_id)

    def _check_fits(self, gpu: Gpu, mig: MigSupport, profile: GpuInstanceProfile, start: int) -> None:
        wanted = set(range(start, start + (profile.placement_size or profile.slices)))
        compute = profile.slices
        media = profile.ofas
        for instance in self._instances(gpu):
            other = self._profile_by_id(mig, instance["profile_id"])
            size = other.placement_size or other.slices
            if wanted & set(range(instance["start"], instance["start"] + size)):
                fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            compute += other.slices
            media += other.ofas
        if self._count(gpu, profile.id) >= profile.instances:
            fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if compute > max(p.slices for p in mig.profiles) or media > max(p.ofas for p in mig.profiles):
            fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def _instance(self, gpuInstance: Any) -> tuple[Gpu, dict[str, Any]]:
        """The GPU and the instance behind a GPU instance handle; INVALID_ARGUMENT when it is gone."""
        self._require_init()
        gpu_index, gi = gpu_instance_address(gpuInstance)
        if not 0 <= gpu_index < len(self._gpus):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[gpu_index]
        self._check_alive(gpu)
        if gpu.model.mig is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = next((i for i in self._instances(gpu) if i["gi"] == gi), None)
        if found is None:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, found

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu, _ = self._mig_capable_gpu(device)
        if not any(i["gi"] == gpuInstanceId for i in self._instances(gpu)):
            fail(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu_instance_handle(gpu.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gpu, instance = self._instance(gpuInstance)
        assert gpu.model.mig is not None
        profile = self._profile_by_id(gpu.model.mig, instance["profile_id"])
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = device_handle(gpu.index)
        info.id, info.profileId = instance["gi"], profile.id
        info.placement.start = instance["start"]
        info.placement.size = profile.placement_size or profile.slices
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gpu, instance = self._instance(gpuInstance)
        gi = instance["gi"]
        if any(m.spec.gi == gi for m in gpu.migs):
            fail(pynvml.NVML_ERROR_IN_USE)

        def drop(state: dict[str, Any]) -> dict[str, Any]:
            key = str(gpu.index)
            entries = state.setdefault("gpus", {}).get(key, [])
            if any(e["gi"] == gi for e in entries):
                state["gpus"][key] = [e for e in entries if e["gi"] != gi]
            else:  # one the profile lists: remembered as gone
                state.setdefault("removed", {}).setdefault(key, []).append(gi)
            return state

        self.state.update_mig(drop)
        return int(pynvml.NVML_SUCCESS)

    # -- compute instances ----------------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        gpu, instance = self._instance(device)
        assert gpu.model.mig is not None
        gi_profile = self._profile_by_id(gpu.model.mig, instance["profile_id"])
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if profile != FULL_CI_PROFILE.get(gi_profile.slices):
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any
        if version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.name = f"MIG {gi_profile.name}".encode()
        elif version == 1:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
        else:
            fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info.id, info.sliceCount, info.instanceCount = profile, gi_profile.slices, 1
        info.multiprocessorCount = gi_profile.multiprocessors
        info.sharedCopyEngineCount, info.sharedDecoderCount = gi_profile.copy_engines, gi_profile.decoders
        info.sharedEncoderCount, info.sharedJpegCount = gi_profile.encoders, gi_profile.jpegs
        info.sharedOfaCount = gi_profile.ofas
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gpu, instance = self._instance(gpuInstance)
        assert gpu.model.mig is not None
        gi_profile = self._profile_by_id(gpu.model.mig, instance["profile_id"])
        if profileId != FULL_CI_PROFILE.get(gi_profile.slices):
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = instance["gi"]

        def take(state: dict[str, Any]) -> dict[str, Any]:
            entries = state.setdefault("gpus", {}).get(str(gpu.index), [])
            entry = next((e for e in entries if e["gi"] == gi), None)
            if entry is None or entry["ci"] is not None:  # a profile-listed GI has its CI already
                fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            slots = {m.slot for m in self._gpus[gpu.index].migs}
            entry["slot"] = next(n for n in range(gpu.model.mig.max_devices) if n not in slots)  # type: ignore[union-attr]
            entry["ci"] = 0
            entry["uuid"] = f"MIG-{uuidlib.uuid4()}"
            return state

        self.state.update_mig(take)
        return compute_instance_handle(gpu.index, gi, 0)

    def _compute_instance(self, computeInstance: Any) -> tuple[Gpu, dict[str, Any], int]:
        self._require_init()
        gpu_index, gi, ci = compute_instance_address(computeInstance)
        if not 0 <= gpu_index < len(self._gpus):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu, instance = self._instance(gpu_instance_handle(gpu_index, gi))
        if not any(m.spec.gi == gi and m.spec.ci == ci for m in gpu.migs):
            fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, instance, ci

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Any, computeInstanceId: int) -> Any:
        gpu, instance = self._instance(gpuInstance)
        if not any(m.spec.gi == instance["gi"] and m.spec.ci == computeInstanceId for m in gpu.migs):
            fail(pynvml.NVML_ERROR_NOT_FOUND)
        return compute_instance_handle(gpu.index, instance["gi"], computeInstanceId)

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        gpu, instance, ci = self._compute_instance(computeInstance)
        assert gpu.model.mig is not None
        gi_profile = self._profile_by_id(gpu.model.mig, instance["profile_id"])
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = device_handle(gpu.index)
        info.gpuInstance = gpu_instance_handle(gpu.index, instance["gi"])
        info.id, info.profileId = ci, FULL_CI_PROFILE.get(gi_profile.slices, 0)
        info.placement.start, info.placement.size = 0, gi_profile.slices
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        gpu, instance, ci = self._compute_instance(computeInstance)
        gi = instance["gi"]

        def drop(state: dict[str, Any]) -> dict[str, Any]:
            key = str(gpu.index)
            for entry in state.setdefault("gpus", {}).get(key, []):
                if entry["gi"] == gi:
                    entry["ci"], entry["slot"], entry["uuid"] = None, None, None
                    return state
            # a profile-listed MIG device: its GI stays, its CI is gone
            state.setdefault("removed_ci", {}).setdefault(key, []).append([gi, ci])
            return state

        self.state.update_mig(drop)
        return int(pynvml.NVML_SUCCESS)
