"""The DRA devices as NVIDIA's DRA driver (gpu.nvidia.com) publishes them, from real discovery on the fake
NVML. Expected names, attribute names, types and values are NVIDIA's (cmd/gpu-kubelet-plugin deviceinfo.go,
mig.go, device_health.go; go-nvlib's architecture and brand names), written out here."""

from __future__ import annotations

import dataclasses
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.dra.devices import binary_si, device_entries, device_table, pci_bus_id, semver
from kubegpu.node.discovery import discover, nvml_session, pcie_root
from kubegpu.node.inventory import Health, Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.dra_selection import parse_gpu_selection
from kubegpu.settings.env import NvmlSelection


def discovered(profile: str) -> Inventory:
    backend = load_nvml(NvmlSelection.fake(profile))
    with nvml_session(backend):
        return discover(backend)


ALL = parse_gpu_selection("all")


def test_full_gpu_as_nvidia_publishes_it() -> None:
    entries = device_entries(discovered("a100-mig"), parse_gpu_selection("3"))
    assert entries == [
        {
            "name": "gpu-3",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": "GPU-95b57a48-af3a-4c20-aa33-09248d7e4165"},
                "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": "Ampere"},
                "cudaComputeCapability": {"version": "8.0.0"},
                "driverVersion": {"version": "550.90.7"},
                "cudaDriverVersion": {"version": "12.4.0"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:c1:00.0"},
            },
            "capacity": {"memory": {"value": "40Gi"}},
        }
    ]


def test_no_index_or_minor_attribute() -> None:
    # NVIDIA stopped publishing both (neither is stable); selectors using them are a lint finding.
    for entry in device_entries(discovered("hgx-h100"), ALL):
        assert "index" not in entry["attributes"] and "minor" not in entry["attributes"]


def test_names_follow_the_minor_not_the_index() -> None:
    # hgx-h100: GPU index 0 has minor 2, index 2 has minor 0.
    table = device_table(discovered("hgx-h100"), parse_gpu_selection("0,2"))
    assert {name: d.gpu.index for name, d in table.items()} == {"gpu-0": 2, "gpu-2": 0}
    assert list(table) == ["gpu-0", "gpu-2"]


def test_mig_devices_replace_their_parent() -> None:
    entries = device_entries(discovered("a100-mig"), parse_gpu_selection("1,2"))
    assert [e["name"] for e in entries] == [
        "gpu-1-mig-3g20gb-9-0",
        "gpu-1-mig-3g20gb-9-3",
        "gpu-2-mig-1g5gb-19-5",
        "gpu-2-mig-2g10gb-14-3",
        "gpu-2-mig-3g20gb-9-0",
    ]
    assert entries[3] == {
        "name": "gpu-2-mig-2g10gb-14-3",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": "MIG-c071dfee-c905-445a-b14c-3df0e65d880d"},
            "parentUUID": {"string": "GPU-0fc1cef9-414a-4851-9e15-3c8b3f8c10eb"},
            "profile": {"string": "2g.10gb"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "550.90.7"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:81:00.0"},
        },
        "capacity": {
            "multiprocessors": {"value": "28"},
            "copyEngines": {"value": "2"},
            "decoders": {"value": "1"},
            "encoders": {"value": "0"},
            "jpegEngines": {"value": "0"},
            "ofaEngines": {"value": "0"},
            "memory": {"value": "9856Mi"},
            "memorySlice3": {"value": "1"},
            "memorySlice4": {"value": "1"},
        },
    }


def test_mig_profile_attributes_in_the_name() -> None:
    # "+me" becomes "-me" (RFC 1123), dots go: NVIDIA's MigSpecTuple.ToCanonicalName.
    inventory = discovered("a100-mig")
    gpu = inventory.gpus[0]
    mig = dataclasses.replace(gpu.mig_devices[0], profile="1g.5gb+me", gi_profile_id=20, placement_start=6)
    gpu = dataclasses.replace(gpu, mig_devices=(mig,))
    names = list(device_table(dataclasses.replace(inventory, gpus=(gpu,)), ALL))
    assert names == ["gpu-0-mig-1g5gb-me-20-6"]


def test_mig_device_without_profile_id_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    inventory = discovered("a100-mig")
    gpu = inventory.gpus[1]
    unknown = dataclasses.replace(gpu.mig_devices[0], gi_profile_id=None)
    gpu = dataclasses.replace(gpu, mig_devices=(unknown, gpu.mig_devices[1]))
    names = list(device_table(dataclasses.replace(inventory, gpus=(gpu,)), ALL))
    assert names == ["gpu-1-mig-3g20gb-9-3"]
    assert "leaving MIG device MIG-c9192047-d716-4c07-9f3b-fcfeea3ab71c out of DRA" in caplog.text


def test_selection_none_publishes_nothing() -> None:
    assert device_entries(discovered("a100-mig"), parse_gpu_selection("none")) == []


def test_xid_and_lost_become_nvidia_taints() -> None:
    inventory = discovered("a100-mig")
    xid_gpu, lost_gpu = inventory.gpus[2].uuid, inventory.gpus[3].uuid
    sick = inventory.with_gpu_health(
        {
            xid_gpu: Health.failed("XID 79 (GPU has fallen off the bus)", 79),
            lost_gpu: Health.failed("GPU is lost"),
        }
    )
    entries = {e["name"]: e for e in device_entries(sick, parse_gpu_selection("1,2,3"))}
    xid_taint = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    assert entries["gpu-2-mig-1g5gb-19-5"]["taints"] == xid_taint  # every MIG device of the GPU
    assert entries["gpu-2-mig-3g20gb-9-0"]["taints"] == xid_taint
    assert entries["gpu-3"]["taints"] == [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}]
    assert "taints" not in entries["gpu-1-mig-3g20gb-9-0"]
    # another driver name keeps NVIDIA's key shape under its own domain
    renamed = device_entries(sick, parse_gpu_selection("3"), driver_name="gpu.kubegpu.io")
    assert renamed[0]["taints"] == [{"key": "gpu.kubegpu.io/gpu-lost", "effect": "NoSchedule"}]


def test_architectures_of_the_profiles() -> None:
    assert {g.architecture for g in discovered("dgx1-volta").gpus} == {"Volta"}
    assert {g.architecture for g in discovered("t4-pcie").gpus} == {"Turing"}
    assert {g.architecture for g in discovered("hgx-h100").gpus} == {"Hopper"}


def test_pcie_root_from_the_sysfs_link(tmp_path: Path) -> None:
    real = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    real.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    os.symlink(real, links / "0000:3b:00.0")
    assert pcie_root(tmp_path, "00000000:3B:00.0") == "pci0000:3a"
    assert pcie_root(tmp_path, "00000000:3C:00.0") is None  # no such device: attribute left out


def test_pcie_root_attribute() -> None:
    inventory = discovered("t4-pcie")
    gpu = dataclasses.replace(inventory.gpus[0], pcie_root="pci0000:3a")
    entry = device_entries(dataclasses.replace(inventory, gpus=(gpu,)), ALL)[0]
    assert entry["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8.0", "8.0.0"),
        ("550.90.07", "550.90.7"),
        ("12.4", "12.4.0"),
        ("535", "535.0.0"),
        ("", None),
        ("x1", None),
    ],
)
def test_semver_as_masterminds_prints_it(text: str, expected: str | None) -> None:
    assert semver(text) == expected


@pytest.mark.parametrize(
    ("amount", "expected"),
    [
        (0, "0"),
        (14, "14"),
        (1000, "1k"),
        (1024, "1Ki"),
        (4864 * 2**20, "4864Mi"),
        (40 * 2**30, "40Gi"),
        (1500, "1500"),
    ],
)
def test_binary_si_as_apimachinery_prints_it(amount: int, expected: str) -> None:
    assert binary_si(amount) == expected


@given(st.integers(min_value=0, max_value=2**62))
def test_binary_si_round_trips(amount: int) -> None:
    from kubegpu.common.quantity import value

    assert value(binary_si(amount)) == amount


def test_pci_bus_id() -> None:
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id("0000:3b:00.0") == "0000:3b:00.0"


def test_selectors_written_for_nvidias_driver_allocate_our_devices() -> None:
    # The scheduler's structured allocator (CEL on cel-python) over the devices we publish: selectors as
    # users write them for gpu.nvidia.com pick the same devices; one on `index` (NVIDIA dropped it) fails.
    from kubegpu.resourceapi import AllocationError, Allocator, parse_claim, parse_class, parse_slice
    from tests.dra_objects import claim, device_class, request, resource_slice

    entries = device_entries(discovered("a100-mig"), ALL)
    slices = [parse_slice(resource_slice("node-a", entries))]
    classes = [parse_class(device_class())]

    def picked(*selectors: str) -> list[str] | None:
        allocator = Allocator(
            [parse_claim(claim("c", [request("gpu", selectors=selectors)]))], classes, slices
        )
        found = allocator.allocate("node-a")
        return None if found is None else [r["device"] for r in found[0]["devices"]["results"]]

    attrs = 'device.attributes["gpu.nvidia.com"]'
    assert picked(
        f'{attrs}.type == "gpu"', f'{attrs}.cudaComputeCapability.isGreaterThan(semver("7.5.0"))'
    ) == ["gpu-3"]
    assert picked(f'{attrs}.profile == "2g.10gb"', f'{attrs}.architecture == "Ampere"') == [
        "gpu-2-mig-2g10gb-14-3"
    ]
    assert picked(
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("19Gi")) >= 0', f'{attrs}.type == "mig"'
    ) == ["gpu-1-mig-3g20gb-9-0"]
    with pytest.raises(
        AllocationError, match="CEL runtime error: no such key: index"
    ):  # the scheduler's error
        picked(f"{attrs}.index == 0")


def test_a_mig_mode_gpu_without_mig_devices_is_warned_about_once_not_at_every_publish(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory = discovered("a100-mig")
    # a GPU no other test has warned about (the warning is throttled per GPU for the process)
    gpu = dataclasses.replace(inventory.gpus[0], uuid=f"GPU-{uuid.uuid4()}", mig_devices=())
    for _ in range(3):  # three publishes
        assert list(device_table(dataclasses.replace(inventory, gpus=(gpu,)), ALL)) == []
    warned = [r.getMessage() for r in caplog.records if "without MIG devices" in r.getMessage()]
    assert warned == ["GPU gpu-0 is in MIG mode without MIG devices: nothing of it is published"]
