"""DynamicMig on the fake NVML: what Prepare's seam does when NVML refuses; tear-down is idempotent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from kubegpu.dra.dynamic_mig import DynamicMig, MigError, read_tables
from kubegpu.node.discovery import discover
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml


@pytest.fixture
def node(tmp_path: Path) -> tuple[Any, Inventory, DynamicMig]:
    fake = FakeNvml.from_profile("mig-dynamic", state_dir=tmp_path)
    fake.nvmlInit()
    inventory = discover(NvmlBackend(fake, fake.sysfs_root, True, "fake"))
    return fake, inventory, DynamicMig(fake, read_tables(fake, inventory))


def test_a_failed_claim_leaves_none_of_its_partitions_behind(node: tuple[Any, Inventory, DynamicMig]) -> None:
    _, inventory, dynamic = node
    table = dynamic.devices(inventory)
    wanted = [table["gpu-2-mig-3g40gb-9-4"], table["gpu-2-mig-1g10gb-19-5"]]  # the second overlaps the first
    with pytest.raises(MigError) as err:
        dynamic.prepare("claim default/c1", wanted)
    assert str(err.value) == (
        "claim default/c1: prepare devices failed: error creating MIG device: error creating GPU instance "
        "for 'gpu-2-mig-1g10gb-19-5': Insufficient Resources"
    )
    assert dynamic.live(inventory.gpus) == []


def test_a_failed_compute_instance_destroys_its_gpu_instance(
    node: tuple[Any, Inventory, DynamicMig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, inventory, dynamic = node

    def refuse(gpu_instance: Any, profile_id: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    monkeypatch.setattr(fake, "nvmlGpuInstanceCreateComputeInstance", refuse, raising=False)
    device = dynamic.devices(inventory)["gpu-3-mig-7g141gb-0-0"]
    with pytest.raises(MigError, match="error creating Compute instance for 'gpu-3-mig-7g141gb-0-0'"):
        dynamic.create(device)
    monkeypatch.undo()
    assert dynamic.create(device).mig is not None  # the placement was given back


def test_create_adopts_a_live_device_and_destroy_is_idempotent(
    node: tuple[Any, Inventory, DynamicMig],
) -> None:
    _, inventory, dynamic = node
    device = dynamic.devices(inventory)["gpu-1-mig-2g20gb-14-2"]
    first = dynamic.create(device)
    again = dynamic.create(device)  # prepared again after a lost checkpoint: the same MIG device
    assert first.mig is not None and again.mig is not None and first.mig.uuid == again.mig.uuid
    dynamic.destroy(["gpu-1-mig-2g20gb-14-2", "gpu-1"], inventory)
    dynamic.destroy(["gpu-1-mig-2g20gb-14-2"], inventory)  # gone already: nothing to do
    assert dynamic.live(inventory.gpus) == []
