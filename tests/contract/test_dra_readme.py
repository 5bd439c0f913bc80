"""The README's `kubegpu dra` examples, read from the README by their HTML comment markers and run against the
driver as a process (the fake NVML, the kubelet simulator, the fake API server): basic mode's whole-GPU and
MIG-device claims, and the extended-resource bridge's DeviceClass and pod."""

from __future__ import annotations

from typing import Any

from kubegpu.demo.dranode import DRIVER, NODE, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.test_dra_dynamic_mig import MIG_CLASS
from tests.readme_blocks import readme_yaml


def cdi_ids(allocation: Any) -> tuple[str, ...]:
    options = allocation.containers["main"].run_options
    assert options is not None
    return tuple(options.cdi_devices)


async def test_the_readme_whole_gpu_claim() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        pod = claim_pod("train", "one-gpu")
        allocated = node.allocate(readme_yaml("basic-gpu-claim"), pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert (result["request"], result["device"]) == ("gpu", "gpu-0")
        uid = allocated["metadata"]["uid"]
        assert cdi_ids(await node.sim.admit(pod)) == (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",)


async def test_the_readme_mig_device_claim() -> None:
    async with DraNode("a100-mig") as node:
        node.api.create("deviceclasses", MIG_CLASS, namespace="")
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(13)
        assert node.sim is not None
        pod = claim_pod("infer", "mig-3g")
        allocated = node.allocate(readme_yaml("basic-mig-claim"), pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-1-mig-3g20gb-9-0"  # the first 3g.20gb in name order (GPU 1's)
        uid = allocated["metadata"]["uid"]
        assert cdi_ids(await node.sim.admit(pod)) == (f"k8s.gpu.nvidia.com/claim={uid}-gpu-1-mig-3g20gb-9-0",)


def kubelet_pod(obj: dict[str, Any]) -> Pod:
    """The README's pod as the kubelet simulator takes it (its containers' limits)."""
    containers = [
        Container(
            c["name"], limits={k: int(v) for k, v in (c.get("resources") or {}).get("limits", {}).items()}
        )
        for c in obj["spec"]["containers"]
    ]
    return Pod(obj["metadata"]["name"], containers=containers)


async def test_the_readme_bridge_class_serves_the_readme_pod_through_dra() -> None:
    async with DraNode("t4-pcie") as node:
        cls = readme_yaml("bridge-device-class")
        current = node.api.get("deviceclasses", cls["metadata"]["name"], namespace="")
        node.api.update("deviceclasses", {**cls, "metadata": current["metadata"]})
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        obj = readme_yaml("bridge-pod")
        pod = kubelet_pod(obj)
        node.create_pod(pod)
        scheduled = node.schedule_extended(pod)
        assert scheduled is not None and scheduled.extended_claim is not None
        claim = node.api.get("resourceclaims", scheduled.extended_claim.claim_name)
        assert claim["metadata"]["name"].startswith("cuda-job-extended-resources-")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["request"], result["driver"], result["pool"], result["device"]) == (
            "container-0-request-0",
            DRIVER,
            NODE,
            "gpu-0",
        )
        uid = claim["metadata"]["uid"]
        assert cdi_ids(await node.sim.admit(scheduled)) == (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",)
