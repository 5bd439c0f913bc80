"""Consumable capacity (KEP-5075) in the structured allocator.

The request-policy tables mirror the scheduler's own (`testCalculateConsumedCapacity`,
`testViolateCapacityRequestPolicy` in structured/internal/*/consumable_capacity_test.go); then allocation
on NVIDIA's consumable-shares shapes (`--consumable-shares=memory|N`), with shareIDs and consumedCapacity
written out, and a property: whatever the claims and their order, what the shares of a device consume
never exceeds its capacity.
"""

from __future__ import annotations

import re
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
from kubegpu.resourceapi.capacity import consumed_amount, violates_policy
from kubegpu.resourceapi.model import DeviceID
from tests.resourceapi.partitionable import (
    DRIVER_A,
    NODE_1,
    allocated,
    claim,
    counted,
    counter_slice,
    device_class,
    device_slice,
    exact,
    result,
    shared,
)

CLASSES = [parse_class(device_class())]
G = 10**9  # nano-units per unit
GI = 2**30 * G
MI = 2**20 * G


def policy_range(
    default: str, minimum: str, maximum: str | None = None, step: str | None = None
) -> dict[str, Any]:
    valid: dict[str, str] = {"min": minimum}
    if maximum is not None:
        valid["max"] = maximum
    if step is not None:
        valid["step"] = step
    return {"default": default, "validRange": valid}


@pytest.mark.parametrize(
    ("requested", "value", "policy", "expected"),
    [
        pytest.param(None, "1", {}, 1 * G, id="empty"),
        pytest.param(None, "2", policy_range("1", "1"), 1 * G, id="min in range"),
        pytest.param(None, "2", {"default": "1", "validValues": ["1"]}, 1 * G, id="default in set"),
        pytest.param(2 * G, "2", policy_range("1", "1"), 2 * G, id="more than min in range"),
        pytest.param(1 * G, "2", policy_range("1", "2"), 2 * G, id="less than min in range"),
        pytest.param(2 * G, "3", policy_range("1", "1", step="2"), 3 * G, id="with step (round up)"),
        pytest.param(2 * G, "2", policy_range("1", "1", step="1"), 2 * G, id="with step (no remaining)"),
        pytest.param(
            3 * G, "10", {"default": "1", "validValues": ["1", "4", "8"]}, 4 * G, id="valid values round up"
        ),
        pytest.param(
            9 * G, "10", {"default": "1", "validValues": ["1", "4", "8"]}, 9 * G, id="above every value"
        ),
        pytest.param(None, "80Gi", None, 80 * GI, id="no policy, nothing asked: the whole capacity"),
        pytest.param(
            GI + 1, "80Gi", policy_range("0", "0", "80Gi", "1Mi"), GI + MI, id="NVIDIA memory step 1Mi"
        ),
    ],
)
def test_consumed_amount_follows_the_scheduler(
    requested: int | None, value: str, policy: dict[str, Any] | None, expected: int
) -> None:
    cap: dict[str, Any] = {"value": value}
    if policy is not None:
        cap["requestPolicy"] = policy
    assert consumed_amount(requested, cap, "capacity") == expected


@pytest.mark.parametrize(
    ("amount", "policy", "violates"),
    [
        pytest.param(1 * G, None, False, id="no constraint"),
        pytest.param(1 * G, policy_range("1", "1", "2"), False, id="less than maximum"),
        pytest.param(2 * G, policy_range("1", "1", "1"), True, id="more than maximum"),
        pytest.param(1 * G, {"default": "1", "validValues": ["1"]}, False, id="in set"),
        pytest.param(2 * G, {"default": "1", "validValues": ["1"]}, True, id="not in set"),
        pytest.param(3 * G, policy_range("1", "1", "9", "2"), False, id="a step from min"),
        pytest.param(4 * G, policy_range("1", "1", "9", "2"), True, id="between steps"),
        pytest.param(0, policy_range("0", "1Mi", "80Gi", "1Mi"), False, id="the default is always allowed"),
    ],
)
def test_policy_violations_follow_the_scheduler(
    amount: int, policy: dict[str, Any] | None, violates: bool
) -> None:
    cap: dict[str, Any] = {"value": "100"}
    if policy is not None:
        cap["requestPolicy"] = policy
    assert violates_policy(amount, cap, "capacity") is violates


# ---- allocation ----------------------------------------------------------------------------------------

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def memory_mode_gpu(name: str = "gpu-0", memory: str = "80Gi") -> dict[str, Any]:
    """`--consumable-shares=memory`: the whole memory by default, 1Mi steps."""
    return shared(
        name,
        {"memory": {"value": memory, "requestPolicy": policy_range(memory, "1Mi", memory, "1Mi")}},
    )


def shares_mode_gpu(name: str = "gpu-0", shares: int = 4, memory: str = "80Gi") -> dict[str, Any]:
    """`--consumable-shares=N`: memory 0 by default, plus N shares of 1 each by default."""
    return shared(
        name,
        {
            "memory": {"value": memory, "requestPolicy": policy_range("0", "0", memory, "1Mi")},
            "shares": {"value": str(shares), "requestPolicy": policy_range("1", "1", str(shares), "1")},
        },
    )


class Cluster:
    """Claims allocated one after the other, each seeing what the earlier ones hold."""

    def __init__(self, slices: list[dict[str, Any]], features: Features | None = None) -> None:
        self.slices = [parse_slice(s) for s in slices]
        self.features = features or Features()
        self.claims: list[Any] = []
        self.ids = iter(f"00000000-0000-4000-8000-{i:012d}" for i in range(1, 1000))

    def allocate(self, body: dict[str, Any]) -> dict[str, Any] | None:
        allocations = Allocator(
            [parse_claim(body)],
            CLASSES,
            self.slices,
            Holdings.of_claims(self.claims),
            self.features,
            share_ids=lambda: next(self.ids),
        ).allocate(NODE_1)
        if allocations is None:
            return None
        self.claims.append(parse_claim({**body, "status": {"allocation": allocations[0]}}))
        return allocations[0]


def results(allocation: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert allocation is not None
    return list(allocation["devices"]["results"])


def test_two_claims_share_one_gpu_by_memory_and_a_third_does_not_fit() -> None:
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])])
    first = results(cluster.allocate(claim("a", exact(capacity={"memory": "40Gi"}))))
    second = results(cluster.allocate(claim("b", exact(capacity={"memory": "30Gi"}))))
    assert first == [
        {
            "request": "req-0",
            "driver": DRIVER_A,
            "pool": "pool-1",
            "device": "gpu-0",
            "shareID": "00000000-0000-4000-8000-000000000001",
            "consumedCapacity": {"memory": "40Gi"},
        }
    ]
    assert second[0]["shareID"] == "00000000-0000-4000-8000-000000000002"
    assert second[0]["consumedCapacity"] == {"memory": "30Gi"}
    assert cluster.allocate(claim("c", exact(capacity={"memory": "11Gi"}))) is None
    assert results(cluster.allocate(claim("d", exact(capacity={"memory": "10Gi"}))))[0][
        "consumedCapacity"
    ] == {"memory": "10Gi"}


def test_a_claim_asking_nothing_takes_the_default_the_whole_gpu_in_memory_mode() -> None:
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])])
    assert results(cluster.allocate(claim("a")))[0]["consumedCapacity"] == {"memory": "80Gi"}
    assert cluster.allocate(claim("b", exact(capacity={"memory": "1Mi"}))) is None


def test_shares_mode_fits_n_default_claims_and_the_next_one_waits() -> None:
    cluster = Cluster([device_slice("slice-1", [shares_mode_gpu(shares=4)])])
    for name in "abcd":
        (one,) = results(cluster.allocate(claim(name)))
        assert one["consumedCapacity"] == {"memory": "0", "shares": "1"}
    assert cluster.allocate(claim("e")) is None


def test_a_request_is_rounded_up_to_the_step_and_the_rounded_amount_is_consumed() -> None:
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])])
    (one,) = results(cluster.allocate(claim("a", exact(capacity={"memory": "1500Mi"}))))
    assert one["consumedCapacity"] == {"memory": "1500Mi"}
    (two,) = results(cluster.allocate(claim("b", exact(capacity={"memory": "1.5Gi"}))))
    assert two["consumedCapacity"] == {"memory": "1536Mi"}
    (three,) = results(cluster.allocate(claim("c", exact(capacity={"memory": "1000000000"}))))
    assert three["consumedCapacity"] == {"memory": "954Mi"}  # 1e9 bytes, rounded up to a whole MiB


def test_a_device_without_the_capacity_asked_for_or_beyond_its_policy_is_passed_over() -> None:
    other = shared("gpu-1", {"memory": {"value": "80Gi"}, "bandwidth": {"value": "10"}})
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu(), other])])
    (one,) = results(cluster.allocate(claim("a", exact(capacity={"bandwidth": "2"}))))
    assert (one["device"], one["consumedCapacity"]) == ("gpu-1", {"bandwidth": "2", "memory": "80Gi"})
    # 81Gi is past gpu-0's validRange.max and past gpu-1's remaining memory.
    assert cluster.allocate(claim("b", exact(capacity={"memory": "81Gi"}))) is None
    # The capacity name qualified with the driver's domain is the same capacity.
    (three,) = results(cluster.allocate(claim("c", exact(capacity={f"{DRIVER_A}/memory": "2Gi"}))))
    assert (three["device"], three["consumedCapacity"]) == ("gpu-0", {"memory": "2Gi"})


def test_a_device_held_whole_takes_capacity_requests_as_a_filter_and_gets_no_share() -> None:
    cluster = Cluster(
        [
            device_slice(
                "slice-1",
                [
                    {"name": "gpu-0", "capacity": {"memory": {"value": "40Gi"}}},
                    {"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}},
                ],
            )
        ]
    )
    (one,) = results(cluster.allocate(claim("a", exact(capacity={"memory": "60Gi"}))))
    assert one == {"request": "req-0", "driver": DRIVER_A, "pool": "pool-1", "device": "gpu-1"}
    assert cluster.allocate(claim("b", exact(capacity={"memory": "60Gi"}))) is None


def test_two_requests_of_one_claim_may_share_a_device() -> None:
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])])
    both = results(
        cluster.allocate(
            claim(
                "a", exact("req-0", capacity={"memory": "30Gi"}), exact("req-1", capacity={"memory": "30Gi"})
            )
        )
    )
    assert [(r["request"], r["device"], r["consumedCapacity"]) for r in both] == [
        ("req-0", "gpu-0", {"memory": "30Gi"}),
        ("req-1", "gpu-0", {"memory": "30Gi"}),
    ]
    assert both[0]["shareID"] != both[1]["shareID"]


def test_share_ids_are_lowercase_uuids_by_default() -> None:
    (allocation,) = Allocator(
        [parse_claim(claim("a"))], CLASSES, [parse_slice(device_slice("slice-1", [shares_mode_gpu()]))]
    ).allocate(NODE_1) or [{}]
    assert UUID.match(allocation["devices"]["results"][0]["shareID"])


def test_capacity_requests_with_the_feature_off_are_the_scheduler_error() -> None:
    body = claim("a", exact(capacity={"memory": "1Gi"}))
    with pytest.raises(AllocationError) as err:
        Cluster([device_slice("slice-1", [memory_mode_gpu()])], Features(consumable_capacity=False)).allocate(
            body
        )
    assert str(err.value) == (
        "claim default/a, request req-0: has capacity requests, "
        "but the DRAConsumableCapacity feature is disabled"
    )


def test_with_the_feature_off_a_shared_device_is_held_whole() -> None:
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])], Features(consumable_capacity=False))
    assert results(cluster.allocate(claim("a"))) == [
        {"request": "req-0", "driver": DRIVER_A, "pool": "pool-1", "device": "gpu-0"}
    ]
    assert cluster.allocate(claim("b")) is None


def test_a_shared_partition_pays_its_counters_once() -> None:
    # A MIG partition shared by memory: the first share takes the placement's counters, the second none.
    partition = {
        **counted(
            "gpu-0-mig-3g40gb-9-0", **{"gpu-0-counter-set": {"memory-slice-0": "1", "memory-slice-1": "1"}}
        ),
        **memory_mode_gpu("gpu-0-mig-3g40gb-9-0", "40Gi"),
    }
    overlapping = counted("gpu-0-mig-1g10gb-19-1", **{"gpu-0-counter-set": {"memory-slice-1": "1"}})
    slices = [
        counter_slice("a-counters", {"gpu-0-counter-set": {"memory-slice-0": "1", "memory-slice-1": "1"}}),
        device_slice("b-devices", [partition, overlapping], slice_count=2),
    ]
    cluster = Cluster(slices)
    assert (
        results(cluster.allocate(claim("a", exact(capacity={"memory": "20Gi"}))))[0]["device"]
        == partition["name"]
    )
    assert (
        results(cluster.allocate(claim("b", exact(capacity={"memory": "20Gi"}))))[0]["device"]
        == partition["name"]
    )
    assert cluster.allocate(claim("c", exact(capacity={"memory": "1Gi"}))) is None


def test_shares_recorded_in_claims_are_read_back() -> None:
    body = allocated(
        claim("a"),
        result("gpu-0", shareID="00000000-0000-4000-8000-000000000001", consumedCapacity={"memory": "40Gi"}),
    )
    holdings = Holdings.of_claims([parse_claim(body)])
    device = DeviceID(DRIVER_A, "pool-1", "gpu-0")
    assert holdings.exclusive == {}
    assert holdings.consumed(device) == {"memory": 40 * GI}
    assert holdings.holders(device) == ["default/a"]


# ---- the property --------------------------------------------------------------------------------------


@st.composite
def sharing_worlds(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    devices = [
        memory_mode_gpu(f"gpu-{i}", f"{draw(st.integers(1, 16))}Gi") for i in range(draw(st.integers(1, 3)))
    ]
    claims = []
    for i in range(draw(st.integers(1, 8))):
        asked = draw(st.one_of(st.none(), st.integers(1, 12 * 1024)))
        claims.append(claim(f"c{i}", exact(capacity=None if asked is None else {"memory": f"{asked}Mi"})))
    return devices, draw(st.permutations(claims))


@settings(max_examples=60, deadline=None)
@given(sharing_worlds())
def test_shares_never_consume_more_than_a_device_has(
    world: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    devices, claims = world
    cluster = Cluster([device_slice("slice-1", devices)])
    for body in claims:
        cluster.allocate(body)
    used: dict[str, int] = {}
    for c in cluster.claims:
        for r in c.allocated_results():
            assert r.share_id, "a shared device is never held whole"
            used[r.device.device] = used.get(r.device.device, 0) + _bytes(r.consumed_capacity["memory"])
    capacity = {d["name"]: _bytes(d["capacity"]["memory"]["value"]) for d in devices}
    assert all(used[d] <= capacity[d] for d in used), (used, capacity)


def _bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)


def test_one_request_never_takes_the_same_shared_device_twice() -> None:
    # The scheduler looks for a request's next device after the one it took (allocateOne's startLocation):
    # two devices for one request are two devices, shared or not; another request may share it.
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu()])])
    assert cluster.allocate(claim("a", exact("req-0", 2, capacity={"memory": "1Gi"}))) is None
    cluster = Cluster([device_slice("slice-1", [memory_mode_gpu("gpu-0"), memory_mode_gpu("gpu-1")])])
    two = results(cluster.allocate(claim("b", exact("req-0", 2, capacity={"memory": "1Gi"}))))
    assert [r["device"] for r in two] == ["gpu-0", "gpu-1"]
