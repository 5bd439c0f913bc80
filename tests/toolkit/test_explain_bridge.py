"""`kubegpu explain` for a pod asking `nvidia.com/gpu` on nodes whose GPUs are published through DRA: whether
the extended-resource bridge (KEP-5004) applies, and where it does, why the special claim the scheduler
would make cannot be allocated. From a snapshot file; expected texts written out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import dra_objects as dra
from tests.toolkit.test_explain_dra import GPU_CLASS, XID, holder, node, run


def gpu_pod(count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}
            ]
        },
        "status": {"phase": "Pending"},
    }


def bridged_class() -> dict[str, Any]:
    cls = dra.device_class("gpu.nvidia.com", GPU_CLASS)
    cls["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    return cls


def plugin_node(name: str, gpus: int) -> dict[str, Any]:
    n = node(name)
    for key in ("allocatable", "capacity"):
        n["status"][key] = {**n["status"][key], "nvidia.com/gpu": str(gpus)}
    return n


def dra_nodes(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        node("gpu-a"),
        dra.resource_slice("gpu-a", [dra.gpu(0), dra.gpu(1, taints=[XID])]),
        *extra,
    ]


def test_without_a_class_mapping_the_bridge_does_not_apply_and_says_so(tmp_path: Path) -> None:
    items = dra_nodes(dra.device_class("gpu.nvidia.com", GPU_CLASS), gpu_pod())
    code, report = run(tmp_path, items, "--json")
    assert code == 1 and report["status"] == "pending-unschedulable"
    assert report["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert (
        "extended-resource bridge: no DeviceClass has extendedResourceName: nvidia.com/gpu, so "
        "nvidia.com/gpu is served only by nodes whose device plugin advertises it; nodes that publish their "
        "GPUs through DRA cannot serve it (set extendedResourceName: nvidia.com/gpu on one DeviceClass, "
        "e.g. gpu.nvidia.com, or ask for the device with a ResourceClaim)" in report["notes"]
    )


def test_with_the_class_the_special_claim_is_allocated_where_a_device_is_free(tmp_path: Path) -> None:
    code, report = run(tmp_path, dra_nodes(bridged_class(), gpu_pod()), "--json")
    assert code == 0 and report["status"] == "would-fit" and report["feasible_nodes"] == ["gpu-a"]
    (row,) = report["dra"]["nodes"]
    assert row["allocation"] == [
        "ml/train-extended-resources container-0-request-0: gpu.nvidia.com/gpu-a/gpu-0"
    ]
    assert (
        "extended-resource bridge: DeviceClass gpu.nvidia.com serves nvidia.com/gpu (DRAExtendedResource); "
        "nodes that do not advertise nvidia.com/gpu get it through a claim the scheduler makes "
        "(train-extended-resources-*)" in report["notes"]
    )


def test_the_special_claim_that_cannot_be_allocated_says_which_device_is_ruled_out_and_why(
    tmp_path: Path,
) -> None:
    items = dra_nodes(bridged_class(), holder(), gpu_pod())
    code, report = run(tmp_path, items, "--json")
    assert code == 1 and report["status"] == "pending-unschedulable"
    assert report["message"] == "0/1 nodes are available: 1 cannot allocate all claims."
    (row,) = report["dra"]["nodes"]
    assert row["requests"] == [
        {
            "claim": "ml/train-extended-resources",
            "request": "container-0-request-0",
            "device_class": "gpu.nvidia.com",
            "wanted": "1",
            "available": 0,
            "ruled_out": {"in use": 1, "tainted": 1},
            "devices": [
                "gpu.nvidia.com/gpu-a/gpu-0: in use (allocated to claim ml/other)",
                "gpu.nvidia.com/gpu-a/gpu-1: tainted (not tolerated: gpu.nvidia.com/xid=79:NoSchedule)",
            ],
        }
    ]


def test_a_node_whose_device_plugin_advertises_the_resource_keeps_it(tmp_path: Path) -> None:
    items = dra_nodes(plugin_node("gpu-p", 1), bridged_class(), holder(), gpu_pod(2))
    code, report = run(tmp_path, items, "--json")
    assert code == 1
    verdicts = {n["node"]: (n["plugin"], n["reasons"]) for n in report["nodes"]}
    assert verdicts == {
        "gpu-p": ("NodeResourcesFit", ["Insufficient nvidia.com/gpu"]),  # the device plugin's, not DRA's
        "gpu-a": ("DynamicResources", ["cannot allocate all claims"]),
    }
    assert any(
        "1 node(s) advertise it through a device plugin, which serves it there: gpu-p" in n
        for n in report["notes"]
    )


def test_the_human_output_names_the_bridge_and_the_special_claims_devices(tmp_path: Path) -> None:
    code, text = run(tmp_path, dra_nodes(bridged_class(), holder(), gpu_pod()))
    assert code == 1
    assert text.startswith("Pod ml/train (Pending) requests nvidia.com/gpu: 1\n")  # no pod claims to list
    assert "extended-resource bridge: DeviceClass gpu.nvidia.com serves nvidia.com/gpu" in text
    assert "ml/train-extended-resources" in text and "gpu.nvidia.com/gpu-a/gpu-0: in use" in text
