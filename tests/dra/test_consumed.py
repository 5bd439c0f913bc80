"""What an allocation result consumed of a shared device (dra/consumed.py): parsing the scheduler's
quantities, the workload's env, the claim's status entry and the MPS client limits, values written out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.apisim.device_status import device_statuses
from kubegpu.dra.claims import Result
from kubegpu.dra.consumed import Consumed, amounts, consumed_of, mps_client_limits, per_device, status_entry
from kubegpu.dra.devices import binary_si

GIB = 1024**3
SHARE = "7c6f2f55-5d3e-4a59-9a51-1b0f3c1e2d4a"
UUID = "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509"


def test_amounts_are_the_quantities_values() -> None:
    assert amounts({"memory": "10Gi", "shares": "2"}) == {"memory": 10 * GIB, "shares": 2}
    assert amounts({"memory": "1.5Gi"}) == {"memory": 1610612736}
    assert amounts({"memory": "500m"}) == {"memory": 1}  # Quantity.Value() rounds up
    assert amounts({"memory": "lots", "shares": "1"}) == {"shares": 1}  # not a quantity: left out
    assert amounts(None) == {}


@given(st.integers(min_value=0, max_value=1 << 62))
def test_any_byte_count_in_any_form_parses_back(count: int) -> None:
    for text in (binary_si(count), str(count), f"{count}e0"):
        assert amounts({"memory": text}) == {"memory": count}


def test_a_result_without_a_share_id_holds_the_device_whole() -> None:
    assert consumed_of(None, {"memory": "4Gi"}, 16 * GIB, "memory") is None


def test_memory_mode_env() -> None:
    consumed = consumed_of(SHARE, {"memory": "4Gi"}, 16 * GIB + 1000, "memory")
    assert consumed == Consumed(SHARE, memory=4 * GIB, device_memory=16 * GIB)
    assert consumed.env() == [
        f"KUBEGPU_SHARE_ID={SHARE}",
        "KUBEGPU_CONSUMED_MEMORY_BYTES=4294967296",
        "KUBEGPU_DEVICE_MEMORY_BYTES=17179869184",
    ]


def test_integer_mode_env() -> None:
    consumed = consumed_of(SHARE, {"memory": "0", "shares": "2"}, 16 * GIB, 8)
    assert consumed is not None
    assert consumed.env()[3:] == ["KUBEGPU_CONSUMED_SHARES=2", "KUBEGPU_DEVICE_SHARES=8"]


def test_mps_limits_follow_the_consumed_memory_and_share() -> None:
    by_memory = Consumed(SHARE, memory=4 * GIB, device_memory=16 * GIB)
    assert mps_client_limits(by_memory, UUID) == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    by_shares = Consumed(SHARE, memory=0, device_memory=16 * GIB, shares=1, device_shares=3)
    assert mps_client_limits(by_shares, UUID) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33"}
    tiny = Consumed(SHARE, memory=1000, device_memory=16 * GIB)
    assert mps_client_limits(tiny, UUID) == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=1M",  # at least 1M: 0 would mean no limit
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1",
    }
    whole = Consumed(SHARE, memory=16 * GIB, device_memory=16 * GIB, shares=4, device_shares=4)
    assert mps_client_limits(whole, UUID)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert mps_client_limits(Consumed(SHARE, memory=0, device_memory=16 * GIB), UUID) == {}


@given(
    st.integers(min_value=0, max_value=1 << 40),
    st.integers(min_value=1, max_value=1 << 40),
    st.integers(min_value=1, max_value=1000),
)
def test_the_thread_percentage_is_always_1_to_100(memory: int, total: int, shares: int) -> None:
    for consumed in (
        Consumed(SHARE, memory=min(memory, total), device_memory=total),
        Consumed(SHARE, shares=min(shares, 1000), device_shares=1000),
    ):
        limits = mps_client_limits(consumed, UUID)
        if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in limits:
            assert 1 <= int(limits["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) <= 100


def test_the_status_entry_is_one_the_api_server_accepts() -> None:
    consumed = Consumed(SHARE, memory=4 * GIB, device_memory=16 * GIB)
    entry = status_entry("gpu.nvidia.com", "node-a", "gpu-0", consumed)
    assert entry == {
        "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "shareID": SHARE,
        "data": {"consumedCapacity": {"memory": "4Gi"}, "deviceCapacity": {"memory": "16Gi"}},
    }  # fmt: skip
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
              "shareID": SHARE}  # fmt: skip
    status = {"allocation": {"devices": {"results": [result]}}, "devices": [entry]}
    assert device_statuses(status) == []


def test_two_shares_of_one_device_in_one_claim_add_up() -> None:
    a = (Result("a", "node-a", "gpu-0", share_id="s1"), Consumed("s1", memory=GIB, device_memory=16 * GIB))
    b = (Result("b", "node-a", "gpu-0", share_id="s2"), Consumed("s2", memory=GIB, device_memory=16 * GIB))
    assert per_device([a, b]) == {"gpu-0": Consumed("s1,s2", memory=2 * GIB, device_memory=16 * GIB)}
