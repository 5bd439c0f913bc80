"""`kubegpu explain` for pods with DRA claims: the DynamicResources filter on the nodes the other filters
leave, in the scheduler's words, with the per-request, per-device account; from a snapshot file and live."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from kubernetes import client

from kubegpu.apisim import ApiServerSim
from kubegpu.resourceapi import parse_slice
from kubegpu.toolkit.cli import explain
from kubegpu.toolkit.live import LiveSource
from kubegpu.toolkit.snapshot import Snapshot
from tests import dra_objects as dra

XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
BIG_GPU = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {"pool": "gpu"}},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def template(name: str = "gpu-40gi", count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [dra.request("gpu", count=count, selectors=[BIG_GPU])]}}},
    }


def pod(claims: list[dict[str, str]], status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "resourceClaims": claims,
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            **spec,
        },
        "status": status or {"phase": "Pending"},
    }


def holder() -> dict[str, Any]:
    """Another pod's claim, allocated gpu-0 on gpu-a."""
    held = dra.claim("other", namespace="ml")
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-a", "device": "gpu-0"}
    held["status"] = {"allocation": {"devices": {"results": [result]}}}
    return held


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        node("gpu-a"),
        node("gpu-b"),
        dra.resource_slice("gpu-a", [dra.gpu(0), dra.gpu(1, taints=[XID])]),
        dra.resource_slice("gpu-b", [dra.gpu(0, product="Tesla T4", memory="16Gi")]),
        dra.device_class("gpu.nvidia.com", GPU_CLASS),
        *extra,
    ]


def run(tmp_path: Path, items: list[dict[str, Any]], *args: str) -> tuple[int, Any]:
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    result = CliRunner().invoke(explain, ["ml/train", "--snapshot", str(path), *args])
    return result.exit_code, (json.loads(result.output) if "--json" in args else result.output)


def test_no_node_can_allocate_the_claim_in_the_schedulers_words(tmp_path: Path) -> None:
    items = cluster(template(), holder(), pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}]))
    code, report = run(tmp_path, items, "--json")
    assert code == 1 and report["status"] == "pending-unschedulable"
    assert report["message"] == "0/2 nodes are available: 2 cannot allocate all claims."
    assert [(n["node"], n["plugin"], n["reasons"]) for n in report["nodes"]] == [
        ("gpu-a", "DynamicResources", ["cannot allocate all claims"]),
        ("gpu-b", "DynamicResources", ["cannot allocate all claims"]),
    ]
    dra_report = report["dra"]
    assert dra_report["claims"] == [
        {"name": "gpu", "claim": "ml/train-gpu", "state": "pending (to be made from template)"}
    ]
    assert dra_report["nodes"] == [
        {
            "node": "gpu-a",
            "fits": False,
            "summary": "cannot allocate all claims",
            "pools": ["gpu.nvidia.com/gpu-a (generation 1, 2 device(s))"],
            "requests": [
                {
                    "claim": "ml/train-gpu",
                    "request": "gpu",
                    "device_class": "gpu.nvidia.com",
                    "wanted": "1",
                    "available": 0,
                    "ruled_out": {"in use": 1, "tainted": 1},
                    "devices": [
                        "gpu.nvidia.com/gpu-a/gpu-0: in use (allocated to claim ml/other)",
                        "gpu.nvidia.com/gpu-a/gpu-1: tainted "
                        "(not tolerated: gpu.nvidia.com/xid=79:NoSchedule)",
                    ],
                }
            ],
            "allocation": [],
        },
        {
            "node": "gpu-b",
            "fits": False,
            "summary": "cannot allocate all claims",
            "pools": ["gpu.nvidia.com/gpu-b (generation 1, 1 device(s))"],
            "requests": [
                {
                    "claim": "ml/train-gpu",
                    "request": "gpu",
                    "device_class": "gpu.nvidia.com",
                    "wanted": "1",
                    "available": 0,
                    "ruled_out": {"request selector": 1},
                    "devices": [
                        "gpu.nvidia.com/gpu-b/gpu-0: request selector "
                        "(claim ml/train-gpu selector #0 is false: " + BIG_GPU + ")"
                    ],
                }
            ],
            "allocation": [],
        },
    ]
    assert (
        "pod claim 'gpu': no ResourceClaim was made from template 'gpu-40gi' yet; explained as the claim the "
        "resourceclaim controller would make" in report["notes"]
    )


def test_the_fix_names_the_node_that_fits_once_a_claim_lets_go(tmp_path: Path) -> None:
    items = cluster(template(), holder(), pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}]))
    _, report = run(tmp_path, items, "--json")
    assert report["dra"]["free_to_fit"] == [{"node": "gpu-a", "held_by": ["ml/other"]}]
    assert {
        "kind": "free-devices",
        "summary": (
            "the pod's claims fit on 1 node(s) once the claims holding devices there are released "
            "(their pods finish or are deleted): gpu-a (held by ml/other)"
        ),
        "nodes": [{"node": "gpu-a", "held_by": ["ml/other"]}],
    } in report["fixes"]
    # Wanting two 40 GiB GPUs: gpu-a's second is tainted, so freeing gpu-0 is not enough; no such fix.
    items = cluster(
        template(count=2), holder(), pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}])
    )
    _, report = run(tmp_path, items, "--json")
    assert report["dra"]["free_to_fit"] == [] and not [
        f for f in report["fixes"] if f["kind"] == "free-devices"
    ]


def test_dynamic_resources_runs_only_where_the_other_filters_pass(tmp_path: Path) -> None:
    items = cluster(
        node("cpu-1", {"pool": "cpu"}),
        template(),
        holder(),
        pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}], nodeSelector={"pool": "gpu"}),
    )
    code, report = run(tmp_path, items, "--json")
    assert code == 1
    assert report["message"] == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 cannot allocate all "
        "claims."
    )
    assert [n["node"] for n in report["dra"]["nodes"]] == ["gpu-a", "gpu-b"]


def test_a_claim_made_from_the_template_is_read_from_the_pods_status(tmp_path: Path) -> None:
    made = dra.claim("train-gpu-x7k2p", [dra.request("gpu", selectors=[BIG_GPU])], namespace="ml")
    status = {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x7k2p"}],
    }
    items = cluster(made, pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}], status=status))
    code, report = run(tmp_path, items, "--json")
    assert code == 0 and report["feasible_nodes"] == ["gpu-a"]  # gpu-0 is free: nobody holds it here
    assert report["dra"]["claims"] == [
        {"name": "gpu", "claim": "ml/train-gpu-x7k2p", "state": "pending (from template)"}
    ]
    gpu_a = report["dra"]["nodes"][0]
    assert gpu_a["fits"] and gpu_a["requests"][0]["available"] == 1
    assert gpu_a["allocation"] == ["ml/train-gpu-x7k2p gpu: gpu.nvidia.com/gpu-a/gpu-0"]


def test_a_missing_claim_stops_the_scheduler_before_any_node(tmp_path: Path) -> None:
    items = cluster(pod([{"name": "gpu", "resourceClaimName": "shared-gpu"}]))
    code, report = run(tmp_path, items, "--json")
    assert code == 1
    assert (
        report["message"] == '0/2 nodes are available: resourceclaim.resource.k8s.io "shared-gpu" not found.'
    )
    assert report["dra"]["claims"] == [
        {"name": "gpu", "claim": "shared-gpu", "state": "missing", "kind": "ResourceClaim"}
    ]
    assert report["dra"]["nodes"] == []
    assert (
        "pod claim 'gpu': ResourceClaim ml/shared-gpu is not in the snapshot; the scheduler waits for it "
        "(add them to the snapshot: kubectl get nodes,pods,daemonsets,runtimeclasses,resourceslices,"
        "resourceclaims,resourceclaimtemplates,deviceclasses -A -o json if it exists)" in report["notes"]
    )


def test_a_missing_template_means_no_claim_is_ever_made(tmp_path: Path) -> None:
    items = cluster(pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-80gi"}]))
    code, report = run(tmp_path, items, "--json")
    assert code == 1
    assert report["message"] == '0/2 nodes are available: pod "ml/train": ResourceClaim not created yet.'
    assert report["dra"]["claims"] == [
        {"name": "gpu", "claim": "gpu-80gi", "state": "missing", "kind": "ResourceClaimTemplate"}
    ]
    assert any(
        n.startswith("pod claim 'gpu': ResourceClaimTemplate ml/gpu-80gi is not in") for n in report["notes"]
    )


def test_human_output_lists_each_device_and_why(tmp_path: Path) -> None:
    items = cluster(template(), holder(), pod([{"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"}]))
    code, out = run(tmp_path, items)
    assert code == 1
    assert "Pod ml/train (Pending) requests DRA claims gpu" in out
    assert "Scheduler: 0/2 nodes are available: 2 cannot allocate all claims." in out
    assert "DynamicResources, node by node" in out
    assert "gpu.nvidia.com/gpu-a/gpu-0: in use (allocated to claim" in out  # wrapped in its cell
    assert "1 in use, 1 tainted" in out


def test_live_reads_the_dra_objects_from_the_newest_version_served() -> None:
    """A 1.32 cluster serves resource.k8s.io v1beta1 only: v1 and v1beta2 answer 404, v1beta1 lists."""
    with (
        ApiServerSim(resource_versions=("v1beta1",)) as api,
        client.ApiClient(client.Configuration(host=api.url)) as k8s,
    ):
        beta = client.ResourceV1beta1Api(k8s)
        beta.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1beta1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": GPU_CLASS}}]},
            }
        )
        v1 = dra.resource_slice("gpu-a", [dra.gpu(0)])
        device = v1["spec"]["devices"][0]
        v1["apiVersion"] = "resource.k8s.io/v1beta1"
        v1["spec"]["devices"] = [
            {"name": device["name"], "basic": {k: v for k, v in device.items() if k != "name"}}
        ]
        beta.create_resource_slice(v1)
        source = LiveSource(
            None,
            None,
            None,
            resource=[
                ("resource.k8s.io/v1", client.ResourceV1Api(k8s)),
                ("resource.k8s.io/v1beta2", client.ResourceV1beta2Api(k8s)),
                ("resource.k8s.io/v1beta1", beta),
            ],
        )
        snap = Snapshot()
        source.dra_into(snap)
    assert sorted(snap.dra) == ["DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice"]
    (slice_obj,) = snap.dra["ResourceSlice"]
    assert slice_obj["apiVersion"] == "resource.k8s.io/v1beta1"
    parsed = parse_slice(slice_obj)
    assert parsed.devices[0].attributes["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert [c["metadata"]["name"] for c in snap.dra["DeviceClass"]] == ["gpu.nvidia.com"]


def owned_claim(name: str, node_name: str, device: str) -> dict[str, Any]:
    """A claim of the pod, allocated `device` on `node_name` (the allocator pins it there)."""
    owned = dra.claim(name, namespace="ml")
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node_name, "device": device}
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }
    owned["status"] = {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}}
    return owned


def test_an_allocated_claim_keeps_the_pod_to_the_node_of_its_allocation(tmp_path: Path) -> None:
    items = cluster(
        owned_claim("train-gpu", "gpu-a", "gpu-0"), pod([{"name": "gpu", "resourceClaimName": "train-gpu"}])
    )
    code, report = run(tmp_path, items, "--json")
    assert (code, report["status"]) == (0, "would-fit")
    assert [(n["node"], n["plugin"], n["reasons"]) for n in report["nodes"]] == [
        ("gpu-a", None, []),
        ("gpu-b", "DynamicResources", ["resourceclaim not available on the node"]),
    ]


def test_a_device_the_pods_own_allocated_claim_holds_is_not_given_to_its_other_claim(tmp_path: Path) -> None:
    # gpu-a: gpu-0 is held by the pod's first claim, gpu-1 is tainted; gpu-b is outside that claim's node.
    claims = [
        {"name": "first", "resourceClaimName": "train-first"},
        {"name": "gpu", "resourceClaimTemplateName": "gpu-40gi"},
    ]
    items = cluster(template(), owned_claim("train-first", "gpu-a", "gpu-0"), pod(claims))
    code, report = run(tmp_path, items, "--json")
    assert code == 1 and report["status"] == "pending-unschedulable"
    assert report["message"] == (
        "0/2 nodes are available: 1 cannot allocate all claims, 1 resourceclaim not available on the node."
    )
    assert report["dra"]["free_to_fit"] == []  # only other pods' claims could let go, and none holds one
