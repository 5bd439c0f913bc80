"""DynamicMIG through Prepare and Unprepare on the fake NVML's mig-dynamic node: a claim's partition is
created as a MIG device at Prepare and destroyed at Unprepare, also when only its CDI spec names it (the
checkpoint entry lost); with ConsumableShares it stays while another claim holds a share of it; a claim
whose partitions NVML refuses fails with NVIDIA's text and leaves none of them behind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.dynamic_mig import DynamicMig, read_tables
from kubegpu.dra.prepare import Preparer
from kubegpu.node.discovery import discover
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.dra.test_prepare import Reader, allocated, make, ref
from tests.dra.test_unprepare_paths import messages, sharing_claim, spec_of

PARTITION = "gpu-1-mig-2g20gb-14-2"  # GPU 1 (A100 80GB): 2g.20gb, placement start 2


class Node:
    """The mig-dynamic node's NVML (its state under `root`), its inventory and DynamicMIG."""

    def __init__(self, root: Path) -> None:
        self.fake: Any = FakeNvml.from_profile("mig-dynamic", state_dir=root / "nvml")
        self.fake.nvmlInit()
        self.inventory: Inventory = discover(NvmlBackend(self.fake, self.fake.sysfs_root, True, "fake"))
        self.dynamic = DynamicMig(self.fake, read_tables(self.fake, self.inventory))
        self.table = self.dynamic.devices(self.inventory)

    def driver(self, root: Path) -> tuple[Preparer, Reader]:
        """A driver process on `root` with DynamicMIG on (the same node's NVML each time)."""
        preparer, reader = make(root, self.inventory)
        preparer.devices = lambda: (self.inventory, self.table)
        preparer.partitions = self.dynamic
        return preparer, reader

    def live(self) -> list[str]:
        return sorted(m.name for m in self.dynamic.live(self.inventory.gpus))


async def test_a_partition_lives_from_prepare_to_unprepare(tmp_path: Path) -> None:
    node = Node(tmp_path)
    preparer, reader = node.driver(tmp_path)
    reader.objects["c"] = allocated("c", "u1", [PARTITION])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    assert node.live() == [PARTITION]
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert node.live() == []


async def test_an_orphans_partition_is_destroyed_by_the_name_its_spec_gives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    first, reader = node.driver(tmp_path)
    reader.objects["c"] = allocated("c", "u1", [PARTITION])
    assert (await first.prepare([ref("c", "u1")]))["u1"].error == ""
    first.checkpoint.remove("u1")

    restarted, _ = node.driver(tmp_path)
    caplog.set_level(logging.INFO)
    assert await restarted.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert node.live() == []
    assert not spec_of(tmp_path, "u1").exists()
    assert messages(caplog)[-1] == "unprepared claim default/c (u1) (known from its CDI spec only)"


async def test_a_shared_partition_stays_until_its_last_holder_is_unprepared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    preparer, reader = node.driver(tmp_path)
    preparer.gates, preparer.shares = parse_feature_gates("ConsumableShares=true"), "memory"
    reader.objects["a"] = sharing_claim("a", "u-a", PARTITION, None, share="s-a")
    reader.objects["b"] = sharing_claim("b", "u-b", PARTITION, None, share="s-b")
    out = await preparer.prepare([ref("a", "u-a"), ref("b", "u-b")])
    assert {uid: o.error for uid, o in out.items()} == {"u-a": "", "u-b": ""}
    caplog.set_level(logging.INFO)
    assert await preparer.unprepare([ref("a", "u-a")]) == {"u-a": ""}
    assert node.live() == [PARTITION]
    assert messages(caplog) == [
        f"claim default/a: device {PARTITION} is still used by another claim: kept",
        "unprepared claim default/a (u-a)",
    ]
    assert await preparer.unprepare([ref("b", "u-b")]) == {"u-b": ""}
    assert node.live() == []


async def test_partitions_nvml_refuses_fail_the_claim_with_nvidias_text_and_leave_nothing(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    preparer, reader = node.driver(tmp_path)
    # the second overlaps the first on GPU 2: NVML has no room for its GPU instance
    reader.objects["c"] = allocated("c", "u1", ["gpu-2-mig-3g40gb-9-4", "gpu-2-mig-1g10gb-19-5"])
    out = await preparer.prepare([ref("c", "u1")])
    assert (out["u1"].error, out["u1"].kind) == (
        "claim default/c: prepare devices failed: error creating MIG device: error creating GPU instance for "
        "'gpu-2-mig-1g10gb-19-5': Insufficient Resources",
        "mig",
    )
    assert node.live() == []
    assert preparer.checkpoint.claims == {} and not spec_of(tmp_path, "u1").exists()
