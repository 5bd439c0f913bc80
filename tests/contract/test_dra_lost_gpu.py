"""A GPU a prepared claim holds that is lost across a driver restart: still published, tainted lost, and
Unhealthy on the health stream and in the pod status, until its claim is unprepared (as the device plugin
keeps a lost GPU listed Unhealthy). The driver is a process on the fake NVML, against the kubelet simulator
and the fake API server; expected values are NVIDIA's taint and message, written out here."""

from __future__ import annotations

from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from tests.contract.test_dra_driver import inject
from tests.contract.test_dra_health import FAST, allocated_status
from tests.dra_objects import claim, request

GPU_LOST_TAINT = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}


def taints(node: DraNode, device: str) -> list[dict[str, str]] | None:
    published = node.published().get(device)
    if published is None:
        return None
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in published.get("taints", [])]


async def test_a_held_gpu_lost_across_a_restart_stays_published_lost_until_its_claim_is_unprepared() -> None:
    async with DraNode("t4-pcie", kubelet="1.36", **FAST) as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None and node.sim.dra is not None
        before = node.published()["gpu-1"]
        pod = claim_pod("train", "c1")
        c1 = node.allocate(claim("c1", [request("gpu", count=2)]), pod)
        uid = c1["metadata"]["uid"]
        await node.sim.admit(pod)
        node.create_pod(pod)

        await node.stop_driver()
        inject(node, "--gpu", "1", "--lost")
        node.start_driver()
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        await node.wait(lambda: taints(node, "gpu-1") == [GPU_LOST_TAINT], "gpu-1 published with gpu-lost")
        lost = node.published()["gpu-1"]
        assert {k: v for k, v in lost.items() if k != "taints"} == before  # the same entry, the same ID
        assert sorted(node.published()) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        assert taints(node, "gpu-0") == []
        health = node.sim.dra.health
        await node.wait(
            lambda: health.get(DRIVER, "node-a", "gpu-1") == ("Unhealthy", "GPU is lost"),
            "gpu-1 Unhealthy on the health stream",
        )
        assert health.get(DRIVER, "node-a", "gpu-0") == ("Healthy", "")
        await node.wait(
            lambda: (
                allocated_status(node, "train")
                == [
                    {
                        "name": "claim:pc-c1",
                        "resources": [
                            {"resourceID": f"k8s.gpu.nvidia.com/claim={uid}-gpu-0", "health": "Healthy"},
                            {
                                "resourceID": f"k8s.gpu.nvidia.com/claim={uid}-gpu-1",
                                "health": "Unhealthy",
                                "message": "GPU is lost",
                            },
                        ],
                    }
                ]
            ),
            "gpu-1 Unhealthy in the pod status",
        )

        node.api.delete("resourceclaims", "c1")
        await node.sim.terminate_pod("train")
        await node.wait(lambda: "gpu-1" not in node.published(), "gpu-1 gone once its claim is unprepared")
        assert sorted(node.published()) == ["gpu-0", "gpu-2", "gpu-3"]
