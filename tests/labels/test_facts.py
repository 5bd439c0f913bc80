"""Reading what the labels need beyond the inventory: vGPU config space, fabric, PCI class, machine type."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pynvml
import pytest

from kubegpu.labels.errors import LabelError
from kubegpu.labels.facts import FabricIds, read_fabric, read_machine_type, read_pci_class
from kubegpu.labels.vgpu import VgpuInfo, find_vgpus, host_driver, is_vgpu, vendor_capability
from kubegpu.node.inventory import Gpu, Inventory

# -- vGPU -----------------------------------------------------------------------------------------

VERSION, BRANCH = b"535.104\0\0\0", b"r535_00\0\0\0"


def vgpu_capability(records: bytes = b"") -> bytes:
    """A vendor capability: id 9, next, length, "VF", optional records, then the host driver record."""
    body = b"VF" + records + b"\x00\x16" + VERSION + BRANCH
    return bytes([0x09, 0x00, 3 + len(body)]) + body


def pci_config(capability: bytes | None, *, size: int = 256, chain: bytes = b"") -> bytes:
    """256 bytes of config space with the capability list pointing at `chain` then `capability` (at 0x60)."""
    config = bytearray(size if size >= 0x40 else 0x40)
    config[0:2] = b"\xde\x10"
    if capability is not None:
        config[0x06] = 0x10  # status: capability list present
        config[0x34] = 0x40 if chain else 0x60
        if chain:  # e.g. a power-management capability at 0x40 linking to 0x60
            config[0x40 : 0x40 + len(chain)] = chain
        config[0x60 : 0x60 + len(capability)] = capability
    return bytes(config[:size])


def test_host_driver_of_a_vgpu() -> None:
    capability = vgpu_capability()
    assert is_vgpu(capability)
    assert host_driver(capability) == ("535.104", "r535_00")


def test_host_driver_after_other_records() -> None:
    capability = vgpu_capability(records=b"\x01\x04\xaa\xbb" + b"\x02\x03\xcc")
    assert host_driver(capability) == ("535.104", "r535_00")


@pytest.mark.parametrize(
    "capability",
    [
        bytes([0x09, 0, 10]) + b"VF" + b"\x00\x16" + b"535",  # record cut short
        bytes([0x09, 0, 8]) + b"VF" + b"\x01\x00\x00",  # a zero-length record would loop forever
        bytes([0x09, 0, 8]) + b"VF" + b"\x01\x09\x00",  # a record running past the end
    ],
)
def test_broken_vgpu_records(capability: bytes) -> None:
    assert host_driver(capability) is None


def test_vendor_capability_follows_the_chain() -> None:
    capability = vgpu_capability()
    assert vendor_capability(pci_config(capability, chain=bytes([0x01, 0x60, 0x08]))) == capability
    assert vendor_capability(pci_config(None)) is None


def test_looped_capability_chain_ends() -> None:
    config = bytearray(pci_config(vgpu_capability(), chain=bytes([0x01, 0x40, 0x08])))  # 0x40 -> 0x40
    assert vendor_capability(bytes(config)) is None


def write_pci_device(root: Path, address: str, vendor: str, config: bytes | None) -> None:
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    if config is not None:
        (device / "config").write_bytes(config)


def test_find_vgpus(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_pci_device(tmp_path, "0000:00:05.0", "0x10de", pci_config(vgpu_capability()))
    write_pci_device(tmp_path, "0000:00:06.0", "0x10de", pci_config(None))  # a passthrough GPU
    write_pci_device(tmp_path, "0000:00:07.0", "0x8086", pci_config(vgpu_capability()))  # not NVIDIA
    write_pci_device(tmp_path, "0000:00:08.0", "0x10de", pci_config(vgpu_capability(), size=64))
    (tmp_path / "bus" / "pci" / "devices" / "0000:00:09.0").mkdir()  # no vendor file (the fake's GPUs)
    with caplog.at_level(logging.WARNING):
        assert find_vgpus(tmp_path) == (VgpuInfo("0000:00:05.0", "535.104", "r535_00"),)
    assert "only 64 bytes of its PCI config are readable; run privileged" in caplog.text


def test_find_vgpus_without_a_pci_bus(tmp_path: Path) -> None:
    assert find_vgpus(tmp_path) == ()


# -- PCI class and machine type -------------------------------------------------------------------


def test_pci_class(tmp_path: Path) -> None:
    device = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    device.mkdir(parents=True)
    (device / "class").write_text("0x030200\n")
    assert read_pci_class(tmp_path, "00000000:3B:00.0") == "0x030200"
    assert read_pci_class(tmp_path, "00000000:3C:00.0") is None
    assert read_pci_class(tmp_path, "") is None


def test_machine_type(tmp_path: Path) -> None:
    path = tmp_path / "product_name"
    path.write_text("  DGX A100 \n")
    assert read_machine_type(str(path)) == "DGX A100"
    assert read_machine_type(str(tmp_path / "absent")) is None
    assert read_machine_type("") is None


# -- fabric ---------------------------------------------------------------------------------------

CLUSTER = uuid.UUID("8a8c4f43-1f2c-4bd3-9c1d-6b5bb4c8f3a1")


class FabricNvml:
    """Just the NVML calls read_fabric makes; per GPU UUID: fields to report, or an NVML error code."""

    def __init__(self, answers: dict[str, dict[str, Any] | int], *, has_v: bool = True) -> None:
        self.answers = answers
        self.has_v = has_v

    def nvmlDeviceGetHandleByUUID(self, gpu_uuid: str) -> str:
        return gpu_uuid

    def nvmlDeviceGetGpuFabricInfoV(self, handle: str, ref: Any) -> None:
        if not self.has_v:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert ref._obj.version == pynvml.nvmlGpuFabricInfo_v2
        self._fill(handle, ref._obj)

    def nvmlDeviceGetGpuFabricInfo(self, handle: str, ref: Any) -> None:
        self._fill(handle, ref._obj)  # NVML fills the struct a pointer (ctypes.byref) points to

    def _fill(self, handle: str, info: Any) -> None:
        answer = self.answers[handle]
        if isinstance(answer, int):
            raise pynvml.NVMLError(answer)
        info.clusterUuid[:] = list(answer.get("cluster", CLUSTER).bytes)
        info.cliqueId = answer.get("clique", 3)
        info.state = answer.get("state", pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
        info.status = answer.get("status", pynvml.NVML_SUCCESS)


def inventory(count: int) -> Inventory:
    gpus = tuple(
        Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, i, (9, 0), f"00000000:{i + 1:02X}:00.0")
        for i in range(count)
    )
    return Inventory(gpus=gpus)


@pytest.mark.parametrize("has_v", [True, False])
def test_fabric_attached_gpus(has_v: bool) -> None:
    api = FabricNvml(
        {
            "GPU-0": {},
            "GPU-1": {"state": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS},
            "GPU-2": {"status": pynvml.NVML_ERROR_UNKNOWN},
            "GPU-3": {"cluster": uuid.UUID(int=0)},
            "GPU-4": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "GPU-5": pynvml.NVML_ERROR_GPU_IS_LOST,
        },
        has_v=has_v,
    )
    assert read_fabric(api, inventory(6)) == {"GPU-0": FabricIds(str(CLUSTER), 3)}


def test_fabric_read_failure_fails_like_gfd() -> None:
    api = FabricNvml({"GPU-0": pynvml.NVML_ERROR_UNKNOWN})
    with pytest.raises(LabelError, match="error checking imex capability of GPU GPU-0"):
        read_fabric(api, inventory(1))
