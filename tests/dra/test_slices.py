"""ResourceSlices as plain data: versions, device shapes, the split to the API's limits, taint times."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.dra import slices


def device(i: int, tainted: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}, "capacity": {}}
    if tainted:
        out["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    return out


@pytest.mark.parametrize(
    ("served", "picked"),
    [
        (("v1", "v1beta2", "v1beta1"), "v1"),  # 1.34+
        (("v1beta2", "v1beta1"), "v1beta2"),  # 1.33
        (("v1beta1",), "v1beta1"),  # 1.32
        (("v1alpha3",), None),  # 1.31: not spoken
        ((), None),
    ],
)
def test_the_newest_served_version_is_picked(served: tuple[str, ...], picked: str | None) -> None:
    assert slices.pick_version(served) == picked


def test_v1beta1_wraps_the_device_fields_in_basic() -> None:
    d = device(3, tainted=True)
    assert slices.to_served(d, "v1beta1") == {
        "name": "gpu-3",
        "basic": {
            "attributes": {"index": {"int": 3}},
            "capacity": {},
            "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}],
        },
    }
    assert slices.to_served(d, "v1") == d and slices.to_served(d, "v1beta2") == d


@given(st.integers(0, 999), st.booleans(), st.sampled_from(slices.VERSIONS))
def test_shapes_round_trip(i: int, tainted: bool, version: str) -> None:
    d = device(i, tainted)
    assert slices.from_served(slices.to_served(d, version), version) == d


@given(st.lists(st.booleans(), max_size=400), st.integers(1, 200))
def test_split_keeps_order_and_every_slice_within_the_api_limits(taints: list[bool], maximum: int) -> None:
    devices = [device(i, t) for i, t in enumerate(taints)]
    parts = slices.split(devices, maximum)
    assert [d for part in parts for d in part] == devices
    assert parts and (all(parts) or len(parts) == 1)  # one empty slice only when there are no devices
    for part in parts:
        limit = 64 if any("taints" in d for d in part) else 128
        assert len(part) <= min(limit, maximum)
    # greedy: the first device of each slice did not fit into the one before
    for a, b in itertools.pairwise(parts):
        limit = 64 if any("taints" in d for d in [*a, b[0]]) else 128
        assert len(a) + 1 > min(limit, maximum)


def test_split_examples() -> None:
    assert [len(p) for p in slices.split([device(i) for i in range(300)])] == [128, 128, 44]
    assert [len(p) for p in slices.split([device(i, i == 0) for i in range(300)])] == [64, 128, 108]
    assert [len(p) for p in slices.split([device(i, True) for i in range(130)])] == [64, 64, 2]
    assert slices.split([]) == [[]]
    with pytest.raises(ValueError, match="at least 1"):
        slices.split([], 0)


def test_a_server_without_taints_gets_only_the_untainted_devices() -> None:
    kept, left_out = slices.without_taints([device(0), device(1, True), device(2)])
    assert [d["name"] for d in kept] == ["gpu-0", "gpu-2"] and left_out == ["gpu-1"]


def test_dropped_taints_are_noticed() -> None:
    sent = [device(0), device(1, True)]
    assert slices.dropped_taints(sent, [device(0), device(1)])
    assert not slices.dropped_taints(sent, sent)
    stamped = [device(0), {**device(1), "taints": [{**device(1, True)["taints"][0], "timeAdded": "T"}]}]
    assert not slices.dropped_taints(sent, stamped)


def test_taint_times_carry_over_for_the_same_taint_only() -> None:
    known = [
        {**device(1), "taints": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
                                  "timeAdded": "2026-12-03T03:00:00Z"}]},
    ]  # fmt: skip
    same = slices.carry_taint_times([device(1, True)], known)
    assert same[0]["taints"][0]["timeAdded"] == "2026-12-03T03:00:00Z"
    other_xid = {
        **device(1),
        "taints": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}],
    }
    assert "timeAdded" not in slices.carry_taint_times([other_xid], known)[0]["taints"][0]
    other_device = {**device(2, True)}
    assert "timeAdded" not in slices.carry_taint_times([other_device], known)[0]["taints"][0]
    assert slices.carry_taint_times([device(1, True)], []) == [device(1, True)]


def test_a_new_slice_is_named_by_the_server_and_owned_by_the_node() -> None:
    spec = slices.spec(
        driver="gpu.nvidia.com", node_name="n1", generation=4, count=2, devices=[device(0)], version="v1beta1"
    )
    assert slices.new_slice(
        driver="gpu.nvidia.com", node_name="n1", node_uid="u-1", version="v1beta1", slice_spec=spec
    ) == {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": "n1-gpu.nvidia.com-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1", "controller": True}
            ],
        },
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n1", "generation": 4, "resourceSliceCount": 2},
            "nodeName": "n1",
            "devices": [{"name": "gpu-0", "basic": {"attributes": {"index": {"int": 0}}, "capacity": {}}}],
        },
    }
