"""The pure part of keeping lost GPUs published: which saved entries come back, and the saved file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubegpu.dra.lost_devices import PublishedStore, lost_entries

LOST = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
GPU_1 = {
    "name": "gpu-1",
    "attributes": {"uuid": {"string": "GPU-1"}},
    "capacity": {"memory": {"value": "16Gi"}},
}
GPU_2 = {"name": "gpu-2", "attributes": {"uuid": {"string": "GPU-2"}}}


def test_a_held_device_discovery_did_not_find_comes_back_from_its_saved_entry_tainted_lost() -> None:
    saved = {"gpu-1": GPU_1, "gpu-2": GPU_2}
    assert lost_entries(saved, found={"gpu-0", "gpu-2"}, held={"gpu-1", "gpu-2"}, taint=LOST) == [
        {
            "name": "gpu-1",
            "attributes": {"uuid": {"string": "GPU-1"}},
            "capacity": {"memory": {"value": "16Gi"}},
            "taints": [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}],
        }
    ]


def test_an_earlier_taint_is_replaced_and_nothing_comes_back_unheld_or_unsaved() -> None:
    xid = {**GPU_1, "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]}
    (entry,) = lost_entries({"gpu-1": xid}, found=(), held={"gpu-1"}, taint=LOST)
    assert entry["taints"] == [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}]
    assert lost_entries({"gpu-1": GPU_1}, found=(), held=(), taint=LOST) == []  # no claim holds it
    assert lost_entries({}, found=(), held={"gpu-1"}, taint=LOST) == []  # never published: nothing to say


def test_the_store_survives_a_restart_and_writes_only_changes(tmp_path: Path) -> None:
    store = PublishedStore(tmp_path)
    assert store.saved == {}
    store.save([GPU_1, GPU_2])
    path = tmp_path / "published.json"
    written = path.stat().st_mtime_ns
    os.utime(path, ns=(1, 1))
    store.save([GPU_1, GPU_2])
    assert path.stat().st_mtime_ns == 1  # unchanged: not written again
    assert PublishedStore(tmp_path).saved == {"gpu-1": GPU_1, "gpu-2": GPU_2}
    PublishedStore(tmp_path).save([GPU_1])  # a new process that publishes something else writes it
    assert json.loads(path.read_text()) == [GPU_1]
    assert written != 1
    counters = {"sharedCounters": [{"name": "gpu-0-counter-set"}]}  # DynamicMIG's entry without a name
    store.save([counters, GPU_2])
    assert PublishedStore(tmp_path).saved == {"gpu-2": GPU_2}


def test_an_unreadable_store_is_empty_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "published.json").write_text("{not json")
    assert PublishedStore(tmp_path).saved == {}
    assert "published.json" in caplog.text
