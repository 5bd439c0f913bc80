"""`kubegpu dra` as a process on the fake NVML, against the kubelet simulator's DRA side and the simulated API
server: registration, publication, Prepare/Unprepare of claims the structured allocator allocated, CDI specs
on disk, health taints and recovery, kubelet and driver restarts.

Expected values are NVIDIA's and the kubelet's (names, CDI IDs, taint keys), written out here."""

from __future__ import annotations

import json

from tests.contract.dra_node import DRIVER, DraNode, claim_pod
from tests.dra_objects import claim, request

A100_GPU3 = "GPU-95b57a48-af3a-4c20-aa33-09248d7e4165"


async def test_register_publish_prepare_unprepare() -> None:
    async with DraNode("a100-mig") as node:
        node.start_driver()
        await node.wait_registered()
        assert node.sim is not None
        (plugin,) = node.sim.dra_plugins(DRIVER)
        assert (plugin.service, plugin.endpoint) == ("v1.DRAPlugin", str(node.plugins / DRIVER / "dra.sock"))
        await node.wait_published(13)
        assert sorted(node.published()) == [
            "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1", "gpu-0-mig-1g5gb-19-2", "gpu-0-mig-1g5gb-19-3",
            "gpu-0-mig-1g5gb-19-4", "gpu-0-mig-1g5gb-19-5", "gpu-0-mig-1g5gb-19-6",
            "gpu-1-mig-3g20gb-9-0", "gpu-1-mig-3g20gb-9-3",
            "gpu-2-mig-1g5gb-19-5", "gpu-2-mig-2g10gb-14-3", "gpu-2-mig-3g20gb-9-0",
            "gpu-3",
        ]  # fmt: skip
        pod = claim_pod("train", "c1")
        c1 = node.allocate(
            claim("c1", [request("gpu", selectors=['device.attributes["gpu.nvidia.com"].type == "gpu"'])]),
            pod,
        )
        uid = c1["metadata"]["uid"]
        allocation = await node.sim.admit(pod)
        cdi_id = f"k8s.gpu.nvidia.com/claim={uid}-gpu-3"
        assert allocation.containers["main"].run_options is not None
        assert allocation.containers["main"].run_options.cdi_devices == (cdi_id,)
        spec = json.loads((node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
        assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
        assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-3"]
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/nvidia3", "hostPath": "/dev/nvidia3"}
        ]
        await node.sim.terminate_pod("train")
        assert not (node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
        assert await node.stop_driver() == 0
        assert not (node.plugins / DRIVER / "dra.sock").exists()
        assert not (node.registry / f"{DRIVER}-reg.sock").exists()
