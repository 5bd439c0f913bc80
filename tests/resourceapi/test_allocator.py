"""The structured allocator: what kube-scheduler's DynamicResources plugin would allocate on a node.

Scenarios after the upstream allocator's own cases (first fit, counts, All, constraints, taints,
generations, incomplete pools, subrequests), with the scheduler's error texts written out.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.resourceapi import (
    AllocationError,
    Allocator,
    Features,
    allocated_devices,
    parse_claim,
    parse_class,
    parse_slice,
)
from kubegpu.resourceapi.model import DeviceID, ModelError
from tests.dra_objects import claim, device_class, gpu, request, resource_slice

CLASSES = [parse_class(device_class())]


def allocate(
    claims: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    node: str = "node-a",
    held: tuple[DeviceID, ...] = (),
    classes: list[Any] = CLASSES,
    features: Features | None = None,
) -> list[dict[str, Any]] | None:
    return Allocator(
        [parse_claim(c) for c in claims],
        classes,
        [parse_slice(s) for s in slices],
        held,
        features or Features(),
    ).allocate(node)


def devices_of(allocation: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["request"], r["device"]) for r in allocation["devices"]["results"]]


EIGHT = resource_slice("node-a", [gpu(i) for i in range(8)])


def test_first_fit_in_slice_order_with_the_full_result_shape() -> None:
    (allocation,) = allocate([claim("c", [request(count=2)])], [EIGHT])
    assert allocation == {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"},
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
            ]
        },
    }


def test_devices_held_by_other_claims_are_skipped() -> None:
    held = (DeviceID("gpu.nvidia.com", "node-a", "gpu-0"), DeviceID("gpu.nvidia.com", "node-a", "gpu-2"))
    (allocation,) = allocate([claim("c", [request(count=2)])], [EIGHT], held=held)
    assert devices_of(allocation) == [("gpu", "gpu-1"), ("gpu", "gpu-3")]


def test_allocated_devices_come_from_claim_statuses_but_not_admin_access() -> None:
    body = claim("other")
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "node-a",
                        "device": "gpu-1",
                        "adminAccess": True,
                    },
                ]
            }
        }
    }
    assert allocated_devices([parse_claim(body)]) == {DeviceID("gpu.nvidia.com", "node-a", "gpu-0")}


def test_too_few_devices_on_the_node_is_no_allocation_not_an_error() -> None:
    assert allocate([claim("c", [request(count=9)])], [EIGHT]) is None
    assert allocate([claim("c", [request(count=1)])], [EIGHT], node="node-b") is None  # not reachable


def test_claims_of_one_pod_do_not_share_devices() -> None:
    two = resource_slice("node-a", [gpu(0), gpu(1)])
    first, second = allocate([claim("a"), claim("b")], [two])
    assert devices_of(first) == [("gpu", "gpu-0")]
    assert devices_of(second) == [("gpu", "gpu-1")]
    assert allocate([claim("a"), claim("b"), claim("c")], [two]) is None


def test_class_and_request_selectors_both_apply() -> None:
    mixed = resource_slice("node-a", [gpu(0, memory="40Gi"), gpu(1, product="NVIDIA H100 80GB HBM3"), gpu(2)])
    big = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0'
    a100 = 'device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")'
    classes = [parse_class(device_class(expression=f'device.driver == "gpu.nvidia.com" && {big}'))]
    (allocation,) = allocate([claim("c", [request(selectors=[a100])])], [mixed], classes=classes)
    assert devices_of(allocation) == [("gpu", "gpu-2")]


def test_all_takes_every_matching_device_and_needs_at_least_one() -> None:
    (allocation,) = allocate([claim("c", [request(mode="All")])], [EIGHT])
    assert [d for _, d in devices_of(allocation)] == [f"gpu-{i}" for i in range(8)]
    held = (DeviceID("gpu.nvidia.com", "node-a", "gpu-5"),)
    assert allocate([claim("c", [request(mode="All")])], [EIGHT], held=held) is None
    assert allocate([claim("c", [request(mode="All")])], [resource_slice("node-a", [])]) is None


def test_only_the_highest_generation_counts_and_all_refuses_an_incomplete_pool() -> None:
    old = resource_slice("node-a", [gpu(0), gpu(1)], name="old", generation=1)
    new = resource_slice("node-a", [gpu(5)], name="new", generation=2, slice_count=2)
    (allocation,) = allocate([claim("c")], [old, new])
    assert devices_of(allocation) == [("gpu", "gpu-5")]  # single devices may come from an incomplete pool
    assert allocate([claim("c", [request(count=2)])], [old, new]) is None  # gpu-0/1 are out of date
    with pytest.raises(AllocationError) as err:
        allocate([claim("c", [request(mode="All")])], [old, new])
    assert str(err.value) == (
        "claim default/c, request gpu: asks for all devices, but resource pool gpu.nvidia.com/node-a "
        "is currently being updated"
    )


def test_an_invalid_pool_stops_allocation() -> None:
    one = resource_slice("node-a", [gpu(0)], name="s1", slice_count=2)
    two = resource_slice("node-a", [gpu(0)], name="s2", slice_count=2)
    with pytest.raises(AllocationError) as err:
        allocate([claim("c")], [one, two])
    assert str(err.value) == "pool node-a is invalid: duplicate device name gpu-0"


def test_match_attribute_keeps_devices_under_one_pcie_root() -> None:
    devices = [gpu(0, pcie_root="pci0000:00"), gpu(1, pcie_root="pci0000:80"), gpu(2, pcie_root="pci0000:80")]
    constraint = {"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    body = claim("c", [request(count=2)], constraints=[constraint])
    (allocation,) = allocate([body], [resource_slice("node-a", devices)])
    assert devices_of(allocation) == [("gpu", "gpu-1"), ("gpu", "gpu-2")]  # backtracked from gpu-0


def test_match_attribute_qualified_with_the_driver_finds_unqualified_attributes() -> None:
    devices = [gpu(0, product="A"), gpu(1, product="B"), gpu(2, product="A")]
    constraint = {"matchAttribute": "gpu.nvidia.com/productName"}
    (allocation,) = allocate(
        [claim("c", [request(count=2)], constraints=[constraint])], [resource_slice("node-a", devices)]
    )
    assert devices_of(allocation) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]


def test_distinct_attribute_spreads_over_pcie_roots() -> None:
    devices = [gpu(0, pcie_root="r0"), gpu(1, pcie_root="r0"), gpu(2, pcie_root="r1")]
    constraint = {"distinctAttribute": "resource.kubernetes.io/pcieRoot"}
    (allocation,) = allocate(
        [claim("c", [request(count=2)], constraints=[constraint])], [resource_slice("node-a", devices)]
    )
    assert devices_of(allocation) == [("gpu", "gpu-0"), ("gpu", "gpu-2")]
    assert (
        allocate(
            [claim("c", [request(count=3)], constraints=[constraint])], [resource_slice("node-a", devices)]
        )
        is None
    )


def test_taints_need_tolerations() -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    devices = resource_slice("node-a", [gpu(0, taints=[xid]), gpu(1)])
    (allocation,) = allocate([claim("c", [request(count=1)])], [devices])
    assert devices_of(allocation) == [("gpu", "gpu-1")]
    assert allocate([claim("c", [request(count=2)])], [devices]) is None
    tolerating = request(count=2, tolerations=[{"key": "gpu.nvidia.com/xid", "operator": "Exists"}])
    (allocation,) = allocate([claim("c", [tolerating])], [devices])
    assert devices_of(allocation) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]
    assert allocation["devices"]["results"][0]["tolerations"] == [
        {"operator": "Exists", "key": "gpu.nvidia.com/xid"}
    ]
    wrong_value = request(tolerations=[{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}])
    assert devices_of(allocate([claim("c", [wrong_value])], [devices])[0]) == [("gpu", "gpu-1")]
    ignored = allocate([claim("c", [request(count=2)])], [devices], features=Features(device_taints=False))
    assert ignored is not None


def test_first_available_tries_subrequests_in_order() -> None:
    body = claim("c")
    body["spec"]["devices"]["requests"] = [
        {
            "name": "gpu",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
                {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1},
            ],
        }
    ]
    (allocation,) = allocate([body], [resource_slice("node-a", [gpu(0), gpu(1)])])
    assert devices_of(allocation) == [("gpu/small", "gpu-0")]
    with pytest.raises(AllocationError) as err:
        allocate([body], [EIGHT], features=Features(prioritized_list=False))
    assert (
        str(err.value)
        == "claim default/c, request gpu: has subrequests, but the DRAPrioritizedList feature is disabled"
    )


def test_config_from_class_and_claim_is_carried_into_the_allocation() -> None:
    sharing = {
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
        }
    }
    classes = [parse_class(device_class(config=[sharing]))]
    body = claim("c", [request("a"), request("b")], config=[{"requests": ["b"], **sharing}])
    (allocation,) = allocate([body], [EIGHT], classes=classes)
    assert [(c["source"], c.get("requests")) for c in allocation["devices"]["config"]] == [
        ("FromClass", None),
        ("FromClass", None),
        ("FromClaim", ["b"]),
    ]


def test_admin_access_may_share_a_held_device() -> None:
    held = tuple(DeviceID("gpu.nvidia.com", "node-a", f"gpu-{i}") for i in range(8))
    (allocation,) = allocate([claim("c", [request(admin_access=True)])], [EIGHT], held=held)
    assert allocation["devices"]["results"][0]["adminAccess"] is True
    with pytest.raises(AllocationError) as err:
        allocate([claim("c", [request(admin_access=True)])], [EIGHT], features=Features(admin_access=False))
    assert (
        str(err.value)
        == "claim default/c, request gpu: admin access is requested, but the feature is disabled"
    )


@pytest.mark.parametrize(
    ("claims", "classes", "message"),
    [
        (
            [claim("c", [request(device_class_name="mig.nvidia.com")])],
            CLASSES,
            "claim default/c, request gpu: could not retrieve device class mig.nvidia.com: "
            'deviceclass.resource.k8s.io "mig.nvidia.com" not found',
        ),
        (
            [claim("c", [request(selectors=['device.attributes["gpu.nvidia.com"].index == 0'])])],
            CLASSES,
            "claim default/c: selector #0: CEL runtime error: no such key: index",
        ),
        (
            [claim("c")],
            [parse_class(device_class(expression="device.attributes['gpu.nvidia.com'].minor > 0"))],
            "class gpu.nvidia.com: selector #0: CEL runtime error: no such key: minor",
        ),
        (
            [claim("c", [request(count=33)])],
            CLASSES,
            "claim default/c: number of requested devices 33 exceeds the claim limit of 32",
        ),
    ],
)
def test_input_errors_use_the_schedulers_words(
    claims: list[dict[str, Any]], classes: list[Any], message: str
) -> None:
    with pytest.raises(AllocationError) as err:
        allocate(claims, [EIGHT], classes=classes)
    assert str(err.value) == message


def test_v1beta1_objects_allocate_the_same() -> None:
    beta_slice = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [
                {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                for d in (gpu(0), gpu(1))
            ],
        },
    }
    beta_claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}},
    }
    (allocation,) = allocate([beta_claim], [beta_slice])
    assert devices_of(allocation) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]


def test_unreadable_objects_name_the_field() -> None:
    with pytest.raises(ModelError) as err:
        parse_claim(
            {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}}}
        )
    assert str(err.value) == (
        "ResourceClaim /c spec.devices.requests[0].exactly.deviceClassName is missing: "
        "a request names its DeviceClass"
    )


@settings(max_examples=40, deadline=None)
@given(
    memories=st.lists(st.sampled_from([16, 40, 80]), min_size=1, max_size=6),
    held=st.sets(st.integers(0, 5), max_size=3),
    count=st.integers(1, 4),
    minimum=st.sampled_from([16, 40, 80]),
)
def test_every_allocation_is_free_matching_and_distinct(
    memories: list[int], held: set[int], count: int, minimum: int
) -> None:
    devices = [gpu(i, memory=f"{m}Gi") for i, m in enumerate(memories)]
    selector = f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{minimum}Gi")) >= 0'
    held_ids = tuple(DeviceID("gpu.nvidia.com", "node-a", f"gpu-{i}") for i in held)
    result = allocate(
        [claim("c", [request(count=count, selectors=[selector])])],
        [resource_slice("node-a", devices)],
        held=held_ids,
    )
    free_matching = [i for i, m in enumerate(memories) if m >= minimum and i not in held]
    if len(free_matching) < count:
        assert result is None
        return
    assert result is not None
    chosen = [int(d.removeprefix("gpu-")) for _, d in devices_of(result[0])]
    assert chosen == free_matching[:count]  # first fit, in order, never a held or unmatched device
