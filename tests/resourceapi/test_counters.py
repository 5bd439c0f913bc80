"""Shared counters (partitionable devices, KEP-4815) in the structured allocator.

The table mirrors the scheduler's own vectors (k8s.io/dynamic-resource-allocation/structured,
allocatortesting: "partitionable-devices-*"), with their expected results written out; then NVIDIA's
DynamicMIG shape (a full GPU and its partitions excluding each other through memory-slice counters), the
pool rules (counters-only slices, invalid pools), and a property: whatever the claims and their order,
what allocated devices consume never exceeds a counter.
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
    Holdings,
    parse_claim,
    parse_class,
    parse_slice,
)
from kubegpu.resourceapi.model import DeviceID
from tests.resourceapi.partitionable import (
    DRIVER_A,
    DRIVER_B,
    NODE_1,
    allocated,
    claim,
    counted,
    counter_slice,
    device_class,
    device_slice,
    exact,
    first_available,
    result,
)

CLASSES = [parse_class(device_class("class-a", DRIVER_A)), parse_class(device_class("class-b", DRIVER_B))]


def with_memory(device: dict[str, Any], memory: str) -> dict[str, Any]:
    """A device whose capacity says what it takes from the counters ("fromCounters" upstream)."""
    return {**device, "capacity": {"memory": {"value": memory}}}


def run(
    claims: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    held: tuple[DeviceID, ...] | Holdings = (),
    features: Features | None = None,
    node: dict[str, Any] | str = NODE_1,
) -> list[tuple[str, str, str]] | None:
    allocations = Allocator(
        [parse_claim(c) for c in claims],
        CLASSES,
        [parse_slice(s) for s in slices],
        held,
        features or Features(),
    ).allocate(node)
    if allocations is None:
        return None
    return [(r["request"], r["pool"], r["device"]) for a in allocations for r in a["devices"]["results"]]


def held(*devices: str, pool: str = "pool-1") -> tuple[DeviceID, ...]:
    return tuple(DeviceID(DRIVER_A, pool, d) for d in devices)


MEM_8 = counter_slice("slice-2", {"counter-set-1": {"memory": "8Gi"}})
THREE_4_6_4 = device_slice(
    "slice-1",
    [
        with_memory(counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}), "4Gi"),
        with_memory(counted("device-2", **{"counter-set-1": {"memory": "6Gi"}}), "6Gi"),
        with_memory(counted("device-3", **{"counter-set-1": {"memory": "4Gi"}}), "4Gi"),
    ],
    slice_count=2,
)
AT_LEAST = 'device.capacity["driver-a"].memory.compareTo(quantity("{}")) >= 0'
PRIORITIZED = first_available(
    "req-1",
    exact("sub-0", selectors=[AT_LEAST.format("6Gi")]),
    exact("sub-1", selectors=[AT_LEAST.format("4Gi")]),
)


def multi_pools() -> list[dict[str, Any]]:
    def three(pool: str, name: str, spec: list[tuple[str, str]]) -> dict[str, Any]:
        return device_slice(
            name,
            [
                counted(f"device-{i + 1}", **{"counter-set-1": {"cpus": cpus, "memory": mem}})
                for i, (cpus, mem) in enumerate(spec)
            ],
            pool=pool,
            slice_count=2,
        )

    sets = {"counter-set-1": {"cpus": "8", "memory": "18Gi"}}
    return [
        three("pool-1", "slice-1", [("6", "4Gi"), ("4", "6Gi"), ("4", "4Gi")]),
        counter_slice("slice-2", sets),
        three("pool-2", "slice-3", [("6", "4Gi"), ("1", "7Gi"), ("1", "7Gi")]),
        counter_slice("slice-4", sets, pool="pool-2"),
    ]


# name, claims, slices, held, features, expected results (request, pool, device) or None
VECTORS: list[tuple[str, list[Any], list[Any], tuple[DeviceID, ...], Features, Any]] = [
    (
        "partitionable-devices-single-device",
        [claim("claim-0")],
        [
            device_slice(
                "slice-1", [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}})], slice_count=2
            ),
            MEM_8,
        ],
        (),
        Features(),
        [("req-0", "pool-1", "device-1")],
    ),
    (
        "partitionable-devices-prioritized-list",
        [claim("claim-0", exact("req-0"), PRIORITIZED)],
        [THREE_4_6_4, MEM_8],
        (),
        Features(),
        [("req-0", "pool-1", "device-1"), ("req-1/sub-1", "pool-1", "device-3")],
    ),
    (
        "partitionable-devices-multiple-devices",
        [claim("claim-0", exact("req-0"), exact("req-1"))],
        [THREE_4_6_4, MEM_8],
        (),
        Features(),
        [("req-0", "pool-1", "device-1"), ("req-1", "pool-1", "device-3")],
    ),
    (
        "partitionable-devices-multiple-capacity-pools",
        [claim("claim-0", exact("req-0"), PRIORITIZED)],
        [
            device_slice(
                "slice-1",
                [
                    with_memory(
                        counted(
                            "device-1", **{"counter-set-1": {"memory": "4Gi"}, "counter-set-2": {"cpus": "4"}}
                        ),
                        "4Gi",
                    ),
                    with_memory(
                        counted(
                            "device-2", **{"counter-set-1": {"memory": "6Gi"}, "counter-set-2": {"cpus": "6"}}
                        ),
                        "6Gi",
                    ),
                    with_memory(
                        counted(
                            "device-3", **{"counter-set-1": {"memory": "4Gi"}, "counter-set-2": {"cpus": "4"}}
                        ),
                        "4Gi",
                    ),
                ],
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "18Gi"}, "counter-set-2": {"cpus": "8"}}),
        ],
        (),
        Features(),
        [("req-0", "pool-1", "device-1"), ("req-1/sub-1", "pool-1", "device-3")],
    ),
    (
        "partitionable-devices-multiple-counters",
        [claim("claim-0", exact("req-0"), exact("req-1"))],
        [
            device_slice(
                "slice-1",
                [
                    counted(
                        "device-1",
                        **{
                            "counter-set-1": {"memory": "4Gi", "cpus": "6"},
                            "counter-set-2": {"cpus": "4", "memory": "2Gi"},
                        },
                    ),
                    counted(
                        "device-2",
                        **{
                            "counter-set-1": {"memory": "6Gi", "cpus": "4"},
                            "counter-set-2": {"cpus": "6", "memory": "6Gi"},
                        },
                    ),
                    counted(
                        "device-3",
                        **{
                            "counter-set-1": {"memory": "4Gi", "cpus": "4"},
                            "counter-set-2": {"cpus": "4", "memory": "4Gi"},
                        },
                    ),
                ],
                slice_count=2,
            ),
            counter_slice(
                "slice-2",
                {
                    "counter-set-1": {"cpus": "8", "memory": "18Gi"},
                    "counter-set-2": {"cpus": "12", "memory": "18Gi"},
                },
            ),
        ],
        (),
        Features(),
        [("req-0", "pool-1", "device-2"), ("req-1", "pool-1", "device-3")],
    ),
    (
        "partitionable-devices-multiple-pools",
        [claim("claim-0", exact("req-0"), exact("req-1"))],
        multi_pools(),
        (*held("device-2", "device-3"), *held("device-1", pool="pool-2")),
        Features(),
        [("req-0", "pool-2", "device-2"), ("req-1", "pool-2", "device-3")],
    ),
    (
        "partitionable-devices-unused-counters-in-counter-set",
        [claim("claim-0", exact("req-0", 2))],
        [
            device_slice(
                "slice-1",
                [
                    counted("device-1", **{"counter-set-1": {"memory": "5Gi"}}),
                    counted("device-2", **{"counter-set-1": {"memory": "4Gi"}}),
                    counted("device-3", **{"counter-set-1": {"memory": "4Gi"}}),
                ],
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "8Gi", "unused": "1Gi"}}),
        ],
        (),
        Features(),
        [("req-0", "pool-1", "device-2"), ("req-0", "pool-1", "device-3")],
    ),
    (
        "partitionable-devices-no-capacity-available",
        [claim("claim-0")],
        [
            device_slice(
                "slice-1",
                [
                    counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}),
                    counted("device-2", **{"counter-set-1": {"memory": "16Gi"}}),
                ],
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "18Gi"}}),
        ],
        held("device-2"),
        Features(),
        None,
    ),
    (
        "partitionable-devices-overallocated-capacity-pool",
        [claim("claim-0")],
        [
            device_slice(
                "slice-1",
                [
                    counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}),
                    counted("device-2", **{"counter-set-1": {"memory": "20Gi"}}),
                ],
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "18Gi"}}),
        ],
        held("device-2"),
        Features(),
        None,
    ),
    (
        "partitionable-devices-disabled-device-consumes-counters",
        [claim("claim-0")],
        [
            device_slice(
                "slice-1", [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}})], slice_count=2
            ),
            MEM_8,
        ],
        (),
        Features(partitionable_devices=False),
        None,
    ),
    (
        "partitionable-devices-disabled-other-device-do-not-consume-counters",
        [claim("claim-0")],
        [
            device_slice(
                "slice-1",
                [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}), {"name": "device-2"}],
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "18Gi"}}),
        ],
        (),
        Features(partitionable_devices=False),
        [("req-0", "pool-1", "device-2")],
    ),
    (
        "partitionable-devices-disabled-per-device-node-selection",
        [claim("claim-0")],
        [device_slice("slice-1", [{"name": "device-2", "nodeName": NODE_1}], node=None, per_device=True)],
        (),
        Features(partitionable_devices=False),
        None,
    ),
    (
        "partitionable-devices-per-device-node-selection-nodename",
        [
            claim(
                "claim-0",
                first_available(
                    "req-0",
                    exact("sub-0", selectors=[AT_LEAST.format("6Gi")]),
                    exact("sub-1", selectors=[AT_LEAST.format("4Gi")]),
                ),
            )
        ],
        [
            device_slice(
                "slice-1",
                [
                    {
                        **with_memory(counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}), "4Gi"),
                        "nodeName": NODE_1,
                    },
                    {
                        **with_memory(counted("device-2", **{"counter-set-1": {"memory": "6Gi"}}), "6Gi"),
                        "nodeName": "node-2",
                    },
                ],
                node=None,
                per_device=True,
                slice_count=2,
            ),
            counter_slice("slice-2", {"counter-set-1": {"memory": "18Gi"}}, node=None, per_device=True),
        ],
        (),
        Features(),
        [("req-0/sub-1", "pool-1", "device-1")],
    ),
]


@pytest.mark.parametrize(
    ("claims", "slices", "holding", "features", "expected"),
    [pytest.param(*v[1:], id=v[0]) for v in VECTORS],
)
def test_scheduler_vectors(
    claims: list[Any], slices: list[Any], holding: tuple[DeviceID, ...], features: Features, expected: Any
) -> None:
    assert run(claims, slices, holding, features) == expected


# ---- NVIDIA's DynamicMIG shape: a full GPU and its partitions exclude each other ----------------------


def dynamic_mig_pool() -> list[dict[str, Any]]:
    """One A100-like GPU as NVIDIA's split model publishes it: a counters-only slice, then the devices."""
    slices = {f"memory-slice-{i}": "1" for i in range(8)}
    full = counted("gpu-0", **{"gpu-0-counter-set": {"memory": "40Gi", "multiprocessors": "98", **slices}})
    partitions = [
        counted(
            f"gpu-0-mig-1g5gb-19-{start}",
            **{"gpu-0-counter-set": {"memory": "5Gi", "multiprocessors": "14", f"memory-slice-{start}": "1"}},
        )
        for start in range(7)
    ]
    sets = {"gpu-0-counter-set": {"memory": "40Gi", "multiprocessors": "98", **slices}}
    return [
        counter_slice("node-1-a-counters", sets, pool=NODE_1),
        device_slice("node-1-b-gpu-0", [full, *partitions], pool=NODE_1, slice_count=2),
    ]


def test_a_partition_held_keeps_the_full_gpu_out_and_the_other_placements_in() -> None:
    gpu = exact(selectors=['device.attributes["driver-a"].type == "gpu"'])
    mig = exact(selectors=['device.attributes["driver-a"].type == "mig"'])
    slices = dynamic_mig_pool()
    for s in slices:
        for d in s["spec"].get("devices", []):
            d["attributes"] = {"type": {"string": "mig" if "-mig-" in d["name"] else "gpu"}}
    partition = DeviceID(DRIVER_A, NODE_1, "gpu-0-mig-1g5gb-19-0")
    assert run([claim("whole", gpu)], slices, (partition,)) is None
    assert run([claim("part", mig)], slices, (partition,)) == [("req-0", NODE_1, "gpu-0-mig-1g5gb-19-1")]
    assert run([claim("part", mig)], slices, (DeviceID(DRIVER_A, NODE_1, "gpu-0"),)) is None
    # Seven 1g partitions fill the GPU's compute (7 x 14 = 98 multiprocessors); an eighth claim waits.
    seven = tuple(DeviceID(DRIVER_A, NODE_1, f"gpu-0-mig-1g5gb-19-{i}") for i in range(6))
    assert run([claim("last", mig)], slices, seven) == [("req-0", NODE_1, "gpu-0-mig-1g5gb-19-6")]
    assert (
        run([claim("one-more", mig)], slices, (*seven, DeviceID(DRIVER_A, NODE_1, "gpu-0-mig-1g5gb-19-6")))
        is None
    )


def test_two_requests_of_one_pod_never_take_overlapping_placements() -> None:
    # The full GPU first in slice order: the search backtracks from it to two partitions.
    allocations = run([claim("a", exact("req-0", 2))], dynamic_mig_pool())
    assert allocations == [
        ("req-0", NODE_1, "gpu-0-mig-1g5gb-19-0"),
        ("req-0", NODE_1, "gpu-0-mig-1g5gb-19-1"),
    ]


# ---- pools ---------------------------------------------------------------------------------------------


def test_a_counters_only_slice_is_part_of_every_node_view_whatever_its_selector() -> None:
    slices = [
        device_slice("slice-1", [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}})], slice_count=2),
        {**MEM_8, "spec": {**{k: v for k, v in MEM_8["spec"].items() if k != "nodeName"}, "allNodes": True}},
    ]
    assert run([claim("claim-0")], slices) == [("req-0", "pool-1", "device-1")]


def test_devices_of_unreached_slices_consume_the_pool_counters_too() -> None:
    # device-2 is on another node's slice of the same pool; it holds 6Gi of the shared 8Gi.
    slices = [
        device_slice("slice-1", [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}})], slice_count=3),
        device_slice(
            "slice-3",
            [counted("device-2", **{"counter-set-1": {"memory": "6Gi"}})],
            slice_count=3,
            node="node-2",
        ),
        {
            **MEM_8,
            "spec": {**MEM_8["spec"], "pool": {"name": "pool-1", "generation": 1, "resourceSliceCount": 3}},
        },
    ]
    assert run([claim("claim-0")], slices) == [("req-0", "pool-1", "device-1")]
    assert run([claim("claim-0")], slices, held("device-2")) is None


@pytest.mark.parametrize(
    ("slices", "reason"),
    [
        (
            [
                device_slice(
                    "slice-1", [counted("device-1", **{"counter-set-9": {"memory": "1"}})], slice_count=2
                ),
                MEM_8,
            ],
            "counter set counter-set-9 not found",
        ),
        (
            [
                device_slice(
                    "slice-1", [counted("device-1", **{"counter-set-1": {"cpus": "1"}})], slice_count=2
                ),
                MEM_8,
            ],
            "counter cpus not found in counter set counter-set-1",
        ),
        (
            [
                device_slice(
                    "slice-1", [counted("device-1", **{"counter-set-1": {"memory": "1"}})], slice_count=3
                ),
                MEM_8,
                counter_slice("slice-3", {"counter-set-1": {"memory": "1Gi"}}, slice_count=3),
            ],
            "duplicate counter set name counter-set-1",
        ),
    ],
    ids=["unknown-counter-set", "unknown-counter", "duplicate-counter-set"],
)
def test_an_invalid_pool_is_reported_with_the_scheduler_words(slices: list[Any], reason: str) -> None:
    with pytest.raises(AllocationError) as err:
        run([claim("claim-0")], slices)
    assert str(err.value) == f"pool pool-1 is invalid: {reason}"


def test_a_pool_still_being_published_offers_no_counter_consuming_device() -> None:
    # The counters-only slice has not arrived: what device-1 may take is unknown, so it is not offered
    # (the scheduler since 1.36 offers nothing from an incomplete pool; a plain device stays usable here).
    slices = [
        device_slice(
            "slice-1",
            [counted("device-1", **{"counter-set-1": {"memory": "4Gi"}}), {"name": "device-2"}],
            slice_count=2,
        )
    ]
    assert run([claim("claim-0")], slices) == [("req-0", "pool-1", "device-2")]


# ---- the property --------------------------------------------------------------------------------------


World = tuple[list[dict[str, Any]], dict[str, int], list[list[dict[str, Any]]]]
SHARE = {"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}


@st.composite
def counter_worlds(draw: st.DrawFn) -> World:
    """Counters, devices consuming them (some shared by up to 4 claims), and pods of 1-3 claims each."""
    counters = {f"c{i}": draw(st.integers(1, 6)) for i in range(draw(st.integers(1, 3)))}
    devices = []
    for i in range(draw(st.integers(1, 6))):
        takes = {c: str(draw(st.integers(0, 4))) for c in counters if draw(st.booleans())}
        device: dict[str, Any] = (
            counted(f"device-{i}", **{"set": takes}) if takes else {"name": f"device-{i}"}
        )
        if draw(st.booleans()):
            device.update(allowMultipleAllocations=True, capacity={"share": SHARE})
        devices.append(device)
    slices = [
        device_slice("slice-1", devices, slice_count=2),
        counter_slice("slice-2", {"set": {c: str(v) for c, v in counters.items()}}),
    ]
    claims = [
        claim(f"claim-{i}", exact("req-0", draw(st.integers(1, 2)))) for i in range(draw(st.integers(1, 8)))
    ]
    claims = draw(st.permutations(claims))
    pods = []
    while claims:
        size = draw(st.integers(1, 3))
        pods.append(claims[:size])
        claims = claims[size:]
    return slices, counters, pods


@settings(max_examples=80, deadline=None)
@given(counter_worlds())
def test_allocated_devices_never_consume_more_than_a_counter_holds(world: World) -> None:
    """Whatever the claims, their order and how they group into pods: no counter over-consumed, no device
    held whole twice or both whole and shared, no shared device over its capacity."""
    slices, counters, pods = world
    parsed_slices = [parse_slice(s) for s in slices]
    done: list[Any] = []
    for pod in pods:
        allocations = Allocator(
            [parse_claim(c) for c in pod], CLASSES, parsed_slices, Holdings.of_claims(done)
        ).allocate(NODE_1)
        for body, allocation in zip(pod, allocations or [], strict=False):
            done.append(parse_claim({**body, "status": {"allocation": allocation}}))
    devices = {d["name"]: d for d in slices[0]["spec"]["devices"]}
    whole: set[str] = set()
    shares: dict[str, int] = {}
    for c in done:
        for r in c.allocated_results():
            name = r.device.device
            if r.share_id:
                assert devices[name].get("allowMultipleAllocations")
                shares[name] = shares.get(name, 0) + int(r.consumed_capacity["share"])
            else:
                assert name not in whole, "a device held whole twice"
                whole.add(name)
    assert not whole & set(shares), "a device both held whole and shared"
    assert all(v <= 4 for v in shares.values()), shares
    taken = {c: 0 for c in counters}
    for name in whole | set(shares):  # a shared device pays its counters once
        for consumption in devices[name].get("consumesCounters", []):
            for counter, amount in consumption["counters"].items():
                taken[counter] += int(amount["value"])
    assert all(taken[c] <= counters[c] for c in counters), (taken, counters)


def test_allocated_claims_are_read_with_their_results() -> None:
    c = allocated(claim("a"), result("device-1"))
    assert Holdings.of_claims([parse_claim(c)]).exclusive == {
        DeviceID(DRIVER_A, "pool-1", "device-1"): "default/a"
    }
