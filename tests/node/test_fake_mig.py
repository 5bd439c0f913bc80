"""The fake NVML's MIG management: placements and limits as NVML enforces them, state shared by processes."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pynvml
import pytest

from kubegpu.node.discovery import discover
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml

H100 = 2  # GPU index in the mig-dynamic profile
A100_40 = 0


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    nvml = FakeNvml.from_profile("mig-dynamic", state_dir=tmp_path)
    nvml.nvmlInit()
    return nvml


def placement(start: int, size: int) -> Any:
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return p


def create(nvml: Any, gpu: int, profile_id: int, start: int, size: int) -> tuple[Any, Any]:
    device = nvml.nvmlDeviceGetHandleByIndex(gpu)
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, placement(start, size))
    full = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(device, _index(profile_id)).sliceCount
    ]
    info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, full, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return gi, nvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def _index(profile_id: int) -> int:
    return {19: 0, 20: 7, 15: 9, 14: 1, 9: 2, 5: 3, 0: 4}[profile_id]


def code(call: Any, *args: Any) -> int:
    with pytest.raises(pynvml.NVMLError) as err:
        call(*args)
    return int(err.value.value)


@pytest.mark.parametrize(
    ("gpu", "profile_id", "expected"),
    [
        (A100_40, 19, [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
        (A100_40, 15, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (A100_40, 14, [(0, 2), (2, 2), (4, 2)]),
        (A100_40, 9, [(0, 4), (4, 4)]),
        (A100_40, 5, [(0, 4)]),
        (A100_40, 0, [(0, 8)]),
        (H100, 9, [(0, 4), (4, 4)]),
    ],
)
def test_possible_placements_as_nvidia_smi_mig_lgipp_lists_them(
    fake: Any, gpu: int, profile_id: int, expected: list[tuple[int, int]]
) -> None:
    device = fake.nvmlDeviceGetHandleByIndex(gpu)
    count = ctypes.c_uint(0)
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    assert count.value == len(expected)
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    fake.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array] == expected


def test_a_placement_taken_twice_or_overlapped_is_insufficient_resources(fake: Any) -> None:
    create(fake, H100, 14, 2, 2)  # 2g.20gb on memory slices 2-3
    device = fake.nvmlDeviceGetHandleByIndex(H100)
    take = fake.nvmlDeviceCreateGpuInstanceWithPlacement
    assert code(take, device, 14, placement(2, 2)) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert code(take, device, 19, placement(3, 1)) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert code(take, device, 9, placement(0, 4)) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    create(fake, H100, 19, 1, 1)  # next to it: fine
    assert code(take, device, 19, placement(7, 1)) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # not a placement
    assert code(take, device, 14, placement(1, 2)) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_profile_limits_hold_beyond_the_memory_slices(fake: Any) -> None:
    create(fake, A100_40, 20, 0, 1)  # 1g.5gb+me: one media-extended instance per GPU
    device = fake.nvmlDeviceGetHandleByIndex(A100_40)
    take = fake.nvmlDeviceCreateGpuInstanceWithPlacement
    assert code(take, device, 20, placement(1, 1)) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


def test_created_instances_are_mig_devices_discovery_sees_until_destroyed(fake: Any, tmp_path: Path) -> None:
    gi, ci = create(fake, H100, 19, 3, 1)
    backend = NvmlBackend(fake, fake.sysfs_root, True, "fake")
    (mig,) = discover(backend).gpus[H100].mig_devices
    assert (mig.profile, mig.gi_profile_id, mig.placement_start, mig.placement_size) == ("1g.10gb", 19, 3, 1)
    assert mig.uuid.startswith("MIG-")
    # another process on the same state directory (a restarted driver) sees it
    other = FakeNvml.from_profile("mig-dynamic", state_dir=tmp_path)
    other.nvmlInit()
    assert [
        m.uuid for m in discover(NvmlBackend(other, other.sysfs_root, True, "x")).gpus[H100].mig_devices
    ] == [mig.uuid]
    assert code(fake.nvmlGpuInstanceDestroy, gi) == pynvml.NVML_ERROR_IN_USE
    fake.nvmlComputeInstanceDestroy(ci)
    fake.nvmlGpuInstanceDestroy(gi)
    assert discover(backend).gpus[H100].mig_devices == ()
    assert code(fake.nvmlGpuInstanceDestroy, gi) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    create(fake, H100, 19, 3, 1)  # the placement is free again


def test_a_gpu_with_mig_mode_off_creates_nothing(tmp_path: Path) -> None:
    nvml = FakeNvml.from_profile("a100-mig", state_dir=tmp_path)
    nvml.nvmlInit()
    device = nvml.nvmlDeviceGetHandleByIndex(3)  # MIG capable, MIG disabled
    err = code(nvml.nvmlDeviceCreateGpuInstanceWithPlacement, device, 19, placement(0, 1))
    assert err == pynvml.NVML_ERROR_NOT_SUPPORTED
