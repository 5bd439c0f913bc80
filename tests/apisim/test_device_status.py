"""A claim's `status.devices[]` (AllocatedDeviceStatus) through the simulated API server: an entry for an
allocated device (and share) is stored, anything else is refused with the API server's words, written out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.apisim import ApiServerSim
from tests.resourceapi.partitionable import claim

SHARE = "00000000-0000-4000-8000-000000000001"


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim(kubernetes_version="1.36.0") as server:
        yield server


def allocated(api: ApiServerSim) -> dict[str, Any]:
    created = api.create("resourceclaims", claim("c"))
    result = {"request": "req-0", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
              "shareID": SHARE, "consumedCapacity": {"memory": "4Gi"}}  # fmt: skip
    created["status"] = {"allocation": {"devices": {"results": [result]}}}
    return api.update("resourceclaims", created, status=True)


def entry(**changes: Any) -> dict[str, Any]:
    out = {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "shareID": SHARE,
           "data": {"consumedCapacity": {"memory": "4Gi"}}}  # fmt: skip
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def refused(api: ApiServerSim, claim_obj: dict[str, Any], *entries: dict[str, Any]) -> str:
    body = {**claim_obj, "status": {**claim_obj["status"], "devices": list(entries)}}
    with pytest.raises(Exception) as err:
        api.update("resourceclaims", body, status=True)
    return str(err.value)


def test_an_entry_for_an_allocated_share_is_stored(api: ApiServerSim) -> None:
    claim_obj = allocated(api)
    body = {**claim_obj, "status": {**claim_obj["status"], "devices": [entry()]}}
    assert api.update("resourceclaims", body, status=True)["status"]["devices"] == [entry()]


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"shareID": None},
         'status.devices[0]: Invalid value: "gpu.nvidia.com/node-a/gpu-0": must be an allocated device '
         "in the claim"),
        ({"device": "gpu-1"},
         f'status.devices[0]: Invalid value: "gpu.nvidia.com/node-a/gpu-1/{SHARE}": must be an allocated '
         "device in the claim"),
        ({"device": "GPU_0"}, 'status.devices[0].device: Invalid value: "GPU_0": a lowercase RFC 1123 label'),
        ({"data": ["not", "an", "object"]},
         'status.devices[0].data: Invalid value: "<value omitted>": must be a valid JSON object'),
        ({"data": {"x": "y" * 11000}}, "status.devices[0].data: Too long: may not be more than 10240 bytes"),
        ({"conditions": [{"type": f"T{i}"} for i in range(9)]},
         "status.devices[0].conditions: Too many: 9: must have at most 8 items"),
    ],
)  # fmt: skip
def test_a_bad_entry_is_refused_with_the_api_servers_words(
    api: ApiServerSim, changes: dict[str, Any], text: str
) -> None:
    assert text in refused(api, allocated(api), entry(**changes))


def test_an_entry_twice_is_a_duplicate(api: ApiServerSim) -> None:
    assert f'status.devices[1]: Duplicate value: "gpu.nvidia.com/node-a/gpu-0/{SHARE}"' in refused(
        api, allocated(api), entry(), entry()
    )
