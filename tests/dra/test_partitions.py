"""DynamicMIG's published shape: partition names, NVIDIA's counters, and that the counters are exactly what
makes overlapping partitions (and a full GPU and its partitions) exclude each other on every MIG model.

The profile tables come from the real `read_tables` on the fake NVML's mig-dynamic profile (A100 40GB,
A100 80GB, H100 80GB, H200 141GB), and what the counters admit is checked against what NVML accepts.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.dra.dynamic_mig import read_tables
from kubegpu.dra.partitions import (
    MigProfile,
    Partition,
    consumption,
    counter_values,
    full_gpu_consumption,
    partitioned_node,
    partitions,
    published_entries,
)
from kubegpu.dra.slices import devices_of, spec, split
from kubegpu.node.discovery import discover
from kubegpu.node.inventory import Gpu, Inventory
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml

DRIVER = "gpu.nvidia.com"
MODELS = {0: "A100-SXM4-40GB", 1: "A100-SXM4-80GB", 2: "H100 80GB HBM3", 3: "H200"}


@cache
def node() -> tuple[Inventory, dict[str, tuple[MigProfile, ...]]]:
    fake = FakeNvml.from_profile("mig-dynamic")
    fake.nvmlInit()
    inventory = discover(NvmlBackend(fake, fake.sysfs_root, True, "fake"))
    return inventory, read_tables(fake, inventory)


def gpu(index: int) -> tuple[Gpu, tuple[MigProfile, ...]]:
    inventory, tables = node()
    found = inventory.gpus[index]
    return found, tables[found.uuid]


def total(parts: list[Partition]) -> Counter[str]:
    out: Counter[str] = Counter()
    for p in parts:
        out.update(consumption(p))
    return out


def fits(used: Counter[str], counters: dict[str, int]) -> bool:
    return all(value <= counters.get(name, 0) for name, value in used.items())


def overlap(a: Partition, b: Partition) -> bool:
    return bool(set(a.memory_slices) & set(b.memory_slices))


def test_names_and_counts_as_nvidia_publishes_them() -> None:
    h100, profiles = gpu(2)
    names = [p.name for p in partitions(h100, profiles)]
    assert len(names) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    # NVIDIA's own examples have this shape: gpu-0-mig-1g20gb-15-6 (an H100's 1g.20gb at slice 6)
    assert "gpu-2-mig-1g20gb-15-6" in names
    assert "gpu-2-mig-1g10gb-me-20-0" in names
    assert "gpu-2-mig-7g80gb-0-0" in names
    assert names == sorted(names)
    h200, profiles = gpu(3)
    assert {p.profile.name for p in partitions(h200, profiles)} == {
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    }


def test_the_counter_set_of_an_h100() -> None:
    inventory, tables = node()
    published = partitioned_node(inventory, tables, inventory.gpus)
    h100 = next(s for s in published.counter_sets if s["name"] == "gpu-2-counter-set")
    assert h100["counters"] == {
        "memory": {"value": "79Gi"},
        "multiprocessors": {"value": "132"},
        "copy-engines": {"value": "8"},
        "decoders": {"value": "7"},
        "encoders": {"value": "0"},
        "jpeg-engines": {"value": "7"},
        "ofa-engines": {"value": "1"},
        **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
    }
    device = next(d for d in published.devices if d["name"] == "gpu-2-mig-3g40gb-9-4")
    assert "uuid" not in device["attributes"]
    assert device["attributes"]["type"] == {"string": "mig"}
    assert device["attributes"]["profile"] == {"string": "3g.40gb"}
    assert device["attributes"]["parentUUID"] == {"string": inventory.gpus[2].uuid}
    assert device["capacity"]["memory"] == {"value": "40320Mi"}
    (consumed,) = device["consumesCounters"]
    assert consumed["counterSet"] == "gpu-2-counter-set"
    assert sorted(k for k in consumed["counters"] if k.startswith("memory-slice")) == [
        "memory-slice-4",
        "memory-slice-5",
        "memory-slice-6",
        "memory-slice-7",
    ]


def test_counter_sets_get_a_slice_of_their_own_before_the_devices() -> None:
    inventory, tables = node()
    chunks = split(published_entries(partitioned_node(inventory, tables, inventory.gpus)))
    assert [len(c) for c in chunks] == [1, 64, 36]  # 4 sets; 4 x 25 devices, 64 a slice with counters
    body = spec(
        driver="gpu.nvidia.com", node_name="n", generation=1, count=3, devices=chunks[0], version="v1"
    )
    assert "devices" not in body
    assert [s["name"] for s in body["sharedCounters"]] == [f"gpu-{i}-counter-set" for i in range(4)]
    assert devices_of({"spec": body}, "v1") == chunks[0]  # read back as the same entry: in sync


@pytest.mark.parametrize("index", list(MODELS))
def test_any_two_overlapping_partitions_exceed_the_counters(index: int) -> None:
    found, profiles = gpu(index)
    counters = counter_values(profiles)
    parts = partitions(found, profiles)
    for a in parts:
        assert not fits(total([a]) + Counter(full_gpu_consumption(profiles)), counters)  # full GPU excludes
        for b in parts:
            if a is not b and overlap(a, b):
                assert not fits(total([a, b]), counters), (a.name, b.name)


@settings(max_examples=60, deadline=None)
@given(index=st.sampled_from(list(MODELS)), order=st.randoms(use_true_random=False))
def test_non_overlapping_partitions_fit_the_counters_and_nvml_creates_them(
    index: int, order: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Any set of non-overlapping placements with at most one media-extended (+me) instance fits the
    counters, and NVML (the fake, with NVIDIA's limits) creates exactly that set."""
    found, profiles = gpu(index)
    candidates = partitions(found, profiles)
    order.shuffle(candidates)
    chosen: list[Partition] = []
    for p in candidates:
        media = p.profile.engines.ofas and any(c.profile.engines.ofas for c in chosen)
        if not media and not any(overlap(p, c) for c in chosen):
            chosen.append(p)
    assert fits(total(chosen), counter_values(profiles)), [p.name for p in chosen]
    fake = FakeNvml.from_profile("mig-dynamic", state_dir=Path(tmp_path_factory.mktemp("nvml")))
    fake.nvmlInit()
    device = fake.nvmlDeviceGetHandleByIndex(index)
    for p in chosen:
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = p.start, p.profile.placement_size
        fake.nvmlDeviceCreateGpuInstanceWithPlacement(device, p.profile.gi_profile_id, placement)
