from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.allocate import AllocateOptions, AllocationRequestError, allocate_container, validate_request
from kubegpu.resources import build_resources
from tests.builders import gpu_uuid, make_inventory

RESOURCE = build_resources(make_inventory(8))[0]


def test_envvar_uuid() -> None:
    ids = [gpu_uuid(3), gpu_uuid(1)]
    out = allocate_container(RESOURCE, ids, AllocateOptions())
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": f"{gpu_uuid(3)},{gpu_uuid(1)}"}  # request order kept
    assert out.mounts == [] and out.devices == []


def test_envvar_index() -> None:
    out = allocate_container(
        RESOURCE, [gpu_uuid(3), gpu_uuid(1)], AllocateOptions(device_id_strategy="index")
    )
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == "3,1"


def test_volume_mounts() -> None:
    out = allocate_container(
        RESOURCE, [gpu_uuid(0)], AllocateOptions(device_list_strategies=("volume-mounts",))
    )
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.container_path, m.host_path) for m in out.mounts] == [
        (f"/var/run/nvidia-container-devices/{gpu_uuid(0)}", "/dev/null")
    ]


def test_pass_device_specs_under_dev_root() -> None:
    options = AllocateOptions(
        pass_device_specs=True,
        dev_root="/run/nvidia/driver",
        control_devices=("/dev/nvidiactl", "/dev/nvidia-uvm"),
    )
    out = allocate_container(RESOURCE, [gpu_uuid(2), gpu_uuid(5)], options)
    assert [(d.container_path, d.host_path, d.permissions) for d in out.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2", "rw"),
        ("/dev/nvidia5", "/run/nvidia/driver/dev/nvidia5", "rw"),
    ]


def test_unknown_device_has_nvidias_exact_text() -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, [gpu_uuid(0), "GPU-nope"])
    assert (
        str(err.value)
        == 'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-nope'
    )
    assert err.value.nvidia_compatible


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        ([], "no devices requested"),
        ([gpu_uuid(1), gpu_uuid(1)], "requested more than once"),
        ([f"GPU-{i}" for i in range(10_000)], "10000 devices requested but this node advertises only 8"),
        (["G" * 64], "is 64 characters; device IDs are at most 63"),
    ],
)
def test_bad_requests_are_explained(ids: list[str], fragment: str) -> None:
    with pytest.raises(AllocationRequestError) as err:
        validate_request(RESOURCE, ids)
    assert fragment in str(err.value)
    assert str(err.value).startswith('invalid allocation request for "nvidia.com/gpu": invalid request: ')
    assert not err.value.nvidia_compatible


known = st.sampled_from([gpu_uuid(i) for i in range(8)])


@given(st.lists(known | st.text(max_size=80), max_size=20))
def test_validation_never_crashes_and_accepts_only_clean_requests(ids: list[str]) -> None:
    try:
        validate_request(RESOURCE, ids)
    except AllocationRequestError as err:
        assert str(err)
    else:
        assert ids and len(set(ids)) == len(ids) and all(RESOURCE.device(i) for i in ids)
        out = allocate_container(RESOURCE, ids, AllocateOptions())
        assert out.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == ids
