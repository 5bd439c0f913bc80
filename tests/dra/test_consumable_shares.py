"""ConsumableShares' slice shapes (dra/consumable_shares.py): NVIDIA's request policy per mode, written out,
and for any memory size and share count a shape the API server's validation accepts."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.apisim.partitionable import device_fields, request_policy
from kubegpu.common.quantity import value
from kubegpu.dra.consumable_shares import conflict, shared_entries, shared_entry, shares_mode
from kubegpu.dra.slice_sharing import SharingSupport
from kubegpu.dra.slices import counters_entry, to_served
from kubegpu.settings.dra_driver import driver_flags
from kubegpu.settings.given import FlagValue

MIB = 1024 * 1024
modes = st.one_of(st.sampled_from(["memory", "unlimited"]), st.integers(min_value=1, max_value=10**6))


def gpu(memory: str) -> dict[str, Any]:
    attributes = {"type": {"string": "gpu"}}
    return {"name": "gpu-0", "attributes": attributes, "capacity": {"memory": {"value": memory}}}


def test_memory_mode_rounds_down_to_1mi_and_defaults_to_the_whole_device() -> None:
    # 40960 MiB and 1000 bytes: NVIDIA publishes 40Gi
    assert shared_entry(gpu("42949673960"), "memory") == {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}},
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "40Gi", "requestPolicy": {
            "default": "40Gi", "validRange": {"min": "1Mi", "max": "40Gi", "step": "1Mi"}}}},
    }  # fmt: skip


def test_integer_mode_adds_n_shares_of_one_by_default() -> None:
    assert shared_entry(gpu("80Gi"), 7)["capacity"] == {
        "memory": {"value": "80Gi", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "80Gi", "step": "1Mi"}}},
        "shares": {"value": "7", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "7", "step": "1"}}},
    }  # fmt: skip


def test_a_device_without_memory_gets_only_allow_multiple_allocations() -> None:
    device = {"name": "x", "capacity": {"multiprocessors": {"value": "14"}}}
    assert shared_entry(device, 4) == {**device, "allowMultipleAllocations": True}


def test_counter_sets_and_mode_none_are_left_alone() -> None:
    counters = counters_entry([{"name": "gpu-0-counter-set", "counters": {"memory": {"value": "80Gi"}}}])
    assert shared_entries([counters, gpu("80Gi")], "unlimited")[0] == counters
    assert shared_entries([gpu("80Gi")], None) == [gpu("80Gi")]


def test_v1beta1_carries_the_fields_under_basic() -> None:
    served = to_served(shared_entry(gpu("16Gi"), "unlimited"), "v1beta1")
    assert served["basic"]["allowMultipleAllocations"] is True
    assert served["basic"]["capacity"]["memory"]["requestPolicy"]["default"] == "0"


def test_shares_take_effect_only_with_the_gate_and_a_mode() -> None:
    def mode(environ: dict[str, str]) -> str | int | None:
        return shares_mode(driver_flags({k: FlagValue(v, True, k) for k, v in environ.items()}))

    assert mode({}) is None
    assert mode({"feature-gates": "ConsumableShares=true"}) is None
    assert mode({"feature-gates": "ConsumableShares=true", "consumable-shares": "8"}) == 8


def test_one_share_is_published_without_a_step_the_api_server_would_refuse() -> None:
    # NVIDIA's {min: 1, max: 1, step: 1}: "one step 2 is larger than capacity value: 1"
    assert shared_entry(gpu("16Gi"), 1)["capacity"]["shares"] == {
        "value": "1", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}}
    }  # fmt: skip


def test_the_conflict_is_nvidias_text() -> None:
    assert conflict("u2", "gpu-0", "u1") == (
        "unable to prepare claim u2: requested device gpu-0 has conflicting configuration with already "
        "prepared claim u1"
    )


@given(st.integers(min_value=MIB, max_value=1 << 50), modes)
def test_any_memory_and_mode_give_a_shape_the_api_server_accepts(memory: int, mode: str | int) -> None:
    entry = shared_entry(gpu(str(memory)), mode)
    for name, capacity in entry["capacity"].items():
        assert request_policy(capacity["value"], capacity["requestPolicy"], f"capacity[{name}]") == []
    assert device_fields(entry, "spec.devices[0]") == []
    published = value(entry["capacity"]["memory"]["value"])
    assert published % MIB == 0 and memory - MIB < published <= memory
    assert shared_entry(entry, mode) == entry  # shaping a published entry again changes nothing


def test_a_server_that_drops_the_sharing_fields_gets_them_left_out() -> None:
    support = SharingSupport()
    sent = [shared_entry(gpu("16Gi"), 4)]
    assert support.publishable(sent) == sent  # not known yet: sent as they are
    dropped = {**gpu("16Gi"), "capacity": {"memory": {"value": "16Gi"}, "shares": {"value": "4"}}}
    support.written(sent, [dropped])
    assert support.served is False
    assert support.publishable(sent) == [dropped]
    kept = SharingSupport()
    kept.written(sent, sent)
    assert kept.served is True and kept.publishable(sent) == sent
