"""The extended-resource bridge (KEP-5004, DRAExtendedResource: beta and on in 1.36) end to end: a pod that
asks `nvidia.com/gpu` on a node whose GPUs `kubegpu dra` publishes, with the DeviceClass carrying
`extendedResourceName`. The scheduler's part is `SimulatedDraNode.schedule_extended` (resourceapi's claim
builder and allocator), the driver runs as a process on the fake NVML, the kubelet simulator prepares the
special claim it reads from the pod's `extendedResourceClaimStatus`, the API server is apisim.

Expected values (the annotation, generateName, request names, owner reference, CDI IDs) are upstream's and
NVIDIA's, written out here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kubegpu.demo.dranode import DRIVER, NODE
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import Container, Pod
from kubegpu.toolkit.cli import explain
from tests.contract.conftest import profile_inventory


def bridge(node: DraNode, name: str = "nvidia.com/gpu") -> None:
    """NVIDIA's gpu.nvidia.com class, now serving `name` too."""
    cls = node.api.get("deviceclasses", "gpu.nvidia.com", namespace="")
    cls["spec"]["extendedResourceName"] = name
    node.api.update("deviceclasses", cls)


def gpu_pod(name: str, count: int = 1) -> Pod:
    return Pod(name, containers=[Container("main", limits={"nvidia.com/gpu": count})])


def extended_claims(node: DraNode) -> list[dict[str, Any]]:
    return [
        c
        for c in node.api.list("resourceclaims")
        if (c["metadata"].get("annotations") or {}).get("resource.kubernetes.io/extended-resource-claim")
    ]


def explain_pod(node: DraNode, tmp_path: Path, name: str) -> dict[str, Any]:
    """`kubegpu explain --json` on a snapshot of the simulated cluster, as `kubectl get -o json` gives it."""
    items = [
        {"apiVersion": "v1", "kind": kind, **obj}
        for kind, plural in (("Node", "nodes"), ("Pod", "pods"))
        for obj in node.api.list(plural)
    ] + [
        {"apiVersion": "resource.k8s.io/v1", "kind": kind, **obj}
        for kind, plural in (
            ("ResourceSlice", "resourceslices"),
            ("DeviceClass", "deviceclasses"),
            ("ResourceClaim", "resourceclaims"),
        )
        for obj in node.api.list(plural)
    ]
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    result = CliRunner().invoke(explain, [f"default/{name}", "--snapshot", str(path), "--json"])
    return dict(json.loads(result.output))


async def started(node: DraNode, devices: int) -> None:
    node.start_driver()
    await node.wait_registered()
    await node.wait_published(devices)


async def test_a_gpu_pod_on_a_dra_only_node_gets_a_claim_prepared_and_the_cdi_devices() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, 4)
        assert node.sim is not None
        bridge(node)
        pod = gpu_pod("train", 2)
        node.create_pod(pod)
        scheduled = node.schedule_extended(pod)
        assert scheduled is not None and scheduled.extended_claim is not None

        (special,) = extended_claims(node)
        name = special["metadata"]["name"]
        assert (
            name.startswith("train-extended-resources-") and len(name) == len("train-extended-resources-") + 5
        )
        assert special["metadata"]["annotations"] == {
            "resource.kubernetes.io/extended-resource-claim": "true"
        }
        pod_uid = node.api.get("pods", "train")["metadata"]["uid"]
        assert special["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": pod_uid, "controller": True}
        ]
        assert special["spec"]["devices"]["requests"] == [
            {
                "name": "container-0-request-0",
                "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
            }
        ]
        results = special["status"]["allocation"]["devices"]["results"]
        assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in results] == [
            ("container-0-request-0", DRIVER, NODE, "gpu-0"),
            ("container-0-request-0", DRIVER, NODE, "gpu-1"),
        ]
        assert special["status"]["reservedFor"] == [{"resource": "pods", "name": "train", "uid": pod_uid}]
        assert node.api.get("pods", "train")["status"]["extendedResourceClaimStatus"] == {
            "requestMappings": [
                {
                    "containerName": "main",
                    "resourceName": "nvidia.com/gpu",
                    "requestName": "container-0-request-0",
                }
            ],
            "resourceClaimName": name,
        }

        allocation = await node.sim.admit(scheduled)
        claim_uid = special["metadata"]["uid"]
        options = allocation.containers["main"].run_options
        assert options is not None
        assert options.cdi_devices == (
            f"k8s.gpu.nvidia.com/claim={claim_uid}-gpu-0",
            f"k8s.gpu.nvidia.com/claim={claim_uid}-gpu-1",
        )
        spec = json.loads((node.cdi / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json").read_text())
        assert sorted(d["name"] for d in spec["devices"]) == [f"{claim_uid}-gpu-0", f"{claim_uid}-gpu-1"]
        prepared = "gpu-0 for container-0-request-0, gpu-1 for container-0-request-0"
        assert f"prepared claim default/{name} ({claim_uid}): {prepared}" in node.log()

        # A second pod gets the GPUs left; a third finds none and stays Pending, creating no claim.
        second = gpu_pod("serve", 2)
        node.create_pod(second)
        assert node.schedule_extended(second) is not None
        third = gpu_pod("extra")
        node.create_pod(third)
        assert node.schedule_extended(third) is None
        assert len(extended_claims(node)) == 2

        await node.sim.terminate_pod("train")
        assert not (node.cdi / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json").exists()


async def test_without_a_class_mapping_the_pod_stays_pending_and_explain_says_why(tmp_path: Path) -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, 4)
        pod = gpu_pod("train")
        node.create_pod(pod)
        assert node.schedule_extended(pod) is None  # nvidia.com/gpu: not advertised, not bridged
        assert extended_claims(node) == []
        assert "extendedResourceClaimStatus" not in (node.api.get("pods", "train").get("status") or {})
        unscheduled = node.api.get("pods", "train")
        del unscheduled["spec"]["nodeName"]  # as the scheduler left it: Pending, unbound
        node.api.update("pods", unscheduled)
        ready = node.api.get("nodes", NODE, namespace="")  # what the kubelet reports of a node with room
        room = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        ready["status"] = {
            "capacity": room,
            "allocatable": room,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        node.api.update("nodes", ready, status=True)
        report = explain_pod(node, tmp_path, "train")
        assert report["status"] == "pending-unschedulable"
        assert any(
            n.startswith("extended-resource bridge: no DeviceClass has extendedResourceName: nvidia.com/gpu")
            for n in report["notes"]
        )

        bridge(node)  # the class now maps it: explain finds the node where the special claim fits
        report = explain_pod(node, tmp_path, "train")
        assert (report["status"], report["feasible_nodes"]) == ("would-fit", [NODE])
        (row,) = report["dra"]["nodes"]
        assert row["allocation"] == [
            f"default/train-extended-resources container-0-request-0: {DRIVER}/{NODE}/gpu-0"
        ]


async def test_a_node_advertising_the_resource_keeps_it_with_the_device_plugin() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, 4)
        bridge(node)
        plugin_node = node.api.get("nodes", NODE, namespace="")
        plugin_node["status"] = {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}
        node.api.update("nodes", plugin_node, status=True)
        pod = gpu_pod("train")
        node.create_pod(pod)
        assert node.schedule_extended(pod) == pod  # the device plugin's: no claim, no claim status
        assert extended_claims(node) == []
        assert "extendedResourceClaimStatus" not in (node.api.get("pods", "train").get("status") or {})

        # Advertised as 0 (every plugin device gone): the class serves it through DRA again.
        plugin_node = node.api.get("nodes", NODE, namespace="")
        plugin_node["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
        node.api.update("nodes", plugin_node, status=True)
        bridged = node.schedule_extended(pod)
        assert bridged is not None and bridged.extended_claim is not None
        assert len(extended_claims(node)) == 1


def start_plugin(node: DraNode, kubelet_socket: Path) -> subprocess.Popen[bytes]:
    """`kubegpu plugin` on the node's fake NVML, registering with its kubelet simulator."""
    with (node.root / "plugin.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "kubegpu", "plugin", "--kubelet-socket", str(kubelet_socket)],
            env=node.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def test_gpus_split_between_the_device_plugin_and_dra_the_plugin_serves_the_gpu_pod() -> None:
    """`kubegpu plugin` (GPUs 2 and 3) and `kubegpu dra` (GPUs 0 and 1) on one node, both processes: the node
    advertises nvidia.com/gpu, so the bridge leaves the pod to the device plugin even with the class."""
    uuids = [g.uuid for g in profile_inventory("t4-pcie").gpus]
    async with DraNode("t4-pcie", env={"KUBEGPU_DRA_GPUS": "0,1"}) as node:
        await started(node, 2)
        assert node.sim is not None
        sim = node.sim
        plugin = start_plugin(node, sim.socket_path)
        try:
            await sim.wait_for(lambda: sim.allocatable().get("nvidia.com/gpu") == 2, 30)
            status = node.api.get("nodes", NODE, namespace="")  # the node status the kubelet reports
            advertised = {k: str(v) for k, v in sim.allocatable().items()}
            status["status"] = {"capacity": advertised, "allocatable": advertised}
            node.api.update("nodes", status, status=True)
            bridge(node)
            pod = gpu_pod("train")
            node.create_pod(pod)
            assert node.schedule_extended(pod) == pod
            assert extended_claims(node) == []
            allocation = await sim.admit(pod)
            (device,) = allocation.containers["main"].devices["nvidia.com/gpu"]
            assert device in uuids[2:]  # one of the plugin's GPUs, never one DRA publishes
        finally:
            plugin.terminate()
            plugin.wait(15)
