"""`kubegpu explain` on shared GPUs: which counter rules out which device (a MIG placement taken by a named
claim) and how much capacity is left on a GPU shared by memory, with the claims in the way; written out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kubegpu.toolkit.cli import explain
from tests import dra_objects as dra
from tests.toolkit.test_explain_dra import node

DRIVER = "gpu.nvidia.com"
TYPE = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{}'"
SLICES = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}


def counters_slice() -> dict[str, Any]:
    body = dra.resource_slice("gpu-a", [], name="gpu-a-counters", slice_count=2)
    del body["spec"]["devices"]
    body["spec"]["sharedCounters"] = [
        {"name": "gpu-0-counter-set", "counters": {"memory": {"value": "40Gi"}, **SLICES}}
    ]
    return body


def partitions_slice() -> dict[str, Any]:
    full = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "40Gi"}},
        "consumesCounters": [
            {"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "40Gi"}, **SLICES}}
        ],
    }
    part = {
        "name": "gpu-0-mig-1g5gb-19-0",
        "attributes": {"type": {"string": "mig"}},
        "consumesCounters": [
            {
                "counterSet": "gpu-0-counter-set",
                "counters": {"memory": {"value": "5Gi"}, "memory-slice-0": {"value": "1"}},
            }
        ],
    }
    return dra.resource_slice("gpu-a", [full, part], name="gpu-a-devices", slice_count=2)


def shared_gpu_slice() -> dict[str, Any]:
    gpu = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "80Gi",
                "requestPolicy": {
                    "default": "80Gi",
                    "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"},
                },
            }
        },
    }
    return dra.resource_slice("gpu-b", [gpu])


def held(name: str, node_name: str, device: str, **extra: Any) -> dict[str, Any]:
    body = dra.claim(name, namespace="ml")
    result = {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device, **extra}
    body["status"] = {"allocation": {"devices": {"results": [result]}}}
    return body


def share(name: str, memory: str, n: int) -> dict[str, Any]:
    return held(
        name,
        "gpu-b",
        "gpu-0",
        shareID=f"00000000-0000-4000-8000-00000000000{n}",
        consumedCapacity={"memory": memory},
    )


def pending(memory: str) -> list[dict[str, Any]]:
    exactly = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}],
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        },
        "status": {"phase": "Pending"},
    }
    return [claim, pod]


def run(tmp_path: Path, items: list[dict[str, Any]]) -> Any:
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    result = CliRunner().invoke(explain, ["ml/train", "--snapshot", str(path), "--json"])
    return json.loads(result.output)


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        node("gpu-a"),
        node("gpu-b"),
        counters_slice(),
        partitions_slice(),
        shared_gpu_slice(),
        dra.device_class("gpu.nvidia.com", TYPE.format("gpu")),
        *extra,
    ]


def devices(report: Any) -> dict[str, list[str]]:
    return {n["node"]: [d for r in n["requests"] for d in r["devices"]] for n in report["dra"]["nodes"]}


def test_a_placement_taken_by_a_named_claim_and_memory_left_on_a_shared_gpu(tmp_path: Path) -> None:
    items = cluster(
        held("mig-user", "gpu-a", "gpu-0-mig-1g5gb-19-0"),
        share("a", "40Gi", 1),
        share("b", "30Gi", 2),
        *pending("20Gi"),
    )
    report = run(tmp_path, items)
    assert report["message"] == "0/2 nodes are available: 2 cannot allocate all claims."
    assert devices(report) == {
        "gpu-a": [
            "gpu.nvidia.com/gpu-a/gpu-0: counters (counter set gpu-0-counter-set: "
            "memory 40Gi wanted, 35Gi left; taken by gpu-0-mig-1g5gb-19-0 (ml/mig-user))",
            "gpu.nvidia.com/gpu-a/gpu-0-mig-1g5gb-19-0: class selector (class gpu.nvidia.com selector #0 is "
            "false: " + TYPE.format("gpu") + ")",
        ],
        "gpu-b": [
            "gpu.nvidia.com/gpu-b/gpu-0: capacity (memory: 20Gi wanted, 10Gi left on the shared device "
            "(ml/a 40Gi, ml/b 30Gi))"
        ],
    }
    ruled_out = {n["node"]: n["requests"][0]["ruled_out"] for n in report["dra"]["nodes"]}
    assert ruled_out == {"gpu-a": {"counters": 1, "class selector": 1}, "gpu-b": {"capacity": 1}}
    assert report["dra"]["free_to_fit"] == [
        {"node": "gpu-a", "held_by": ["ml/mig-user"]},
        {"node": "gpu-b", "held_by": ["ml/a", "ml/b"]},
    ]


def test_what_fits_on_the_shared_gpu_is_allocated_with_its_share(tmp_path: Path) -> None:
    report = run(tmp_path, cluster(share("a", "40Gi", 1), share("b", "30Gi", 2), *pending("10Gi")))
    fits = [n for n in report["dra"]["nodes"] if n["fits"]]
    assert [n["node"] for n in fits] == ["gpu-a", "gpu-b"]
    assert fits[0]["allocation"] == ["ml/mine gpu: gpu.nvidia.com/gpu-a/gpu-0"]
    assert fits[1]["allocation"] == ["ml/mine gpu: gpu.nvidia.com/gpu-b/gpu-0 (shared, memory 10Gi)"]


def test_a_request_beyond_the_published_policy_names_the_policy(tmp_path: Path) -> None:
    report = run(tmp_path, cluster(*pending("81Gi")))
    assert devices(report)["gpu-b"] == [
        "gpu.nvidia.com/gpu-b/gpu-0: capacity (memory: 81Gi is not allowed by the device's request policy)"
    ]
