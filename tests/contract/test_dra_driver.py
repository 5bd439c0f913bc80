"""`kubegpu dra` as a process on the fake NVML, against the kubelet simulator's DRA side and the simulated API
server: registration, publication, Prepare/Unprepare of claims the structured allocator allocated, CDI specs
on disk, health taints and recovery, kubelet and driver restarts.

Expected values are NVIDIA's and the kubelet's (names, CDI IDs, taint keys), written out here."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from typing import Any

import grpc
import pytest

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import PrepareError
from tests.dra_objects import claim, mps_config, request


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


def inject(node: DraNode, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "kubegpu", "fake-nvml", "inject", *args],
        env=node.env,
        check=True,
        capture_output=True,
    )


async def prepare_directly(node: DraNode, uid: str, name: str) -> Any:
    """NodePrepareResources on the driver socket, as a kubelet that lost its checkpoint would call it."""
    async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
        stub = dra_v1_grpc.DRAPluginStub(channel)
        request = dra_v1.NodePrepareResourcesRequest(
            claims=[dra_v1.Claim(namespace="default", uid=uid, name=name)]
        )
        return await stub.NodePrepareResources(request, timeout=10)


async def test_xid_taints_the_device_and_recovery_clears_it() -> None:
    async with DraNode("a100-mig") as node:
        node.start_driver()
        await node.wait_published(13)
        inject(node, "--gpu", "3", "--xid", "48")  # reset-class: recovers once the probes pass
        await node.wait(lambda: "taints" in node.published()["gpu-3"], "a taint on gpu-3")
        assert node.published()["gpu-3"]["taints"][0] | {"timeAdded": None} == {
            "key": "gpu.nvidia.com/xid",
            "value": "48",
            "effect": "NoSchedule",
            "timeAdded": None,
        }
        assert all("taints" not in d for n, d in node.published().items() if n != "gpu-3")
        await node.wait(
            lambda: "taints" not in node.published()["gpu-3"], "gpu-3 without its taint", timeout=40
        )


async def test_lost_gpu_taints_every_mig_device_on_it() -> None:
    async with DraNode("a100-mig") as node:
        node.start_driver()
        await node.wait_published(13)
        inject(node, "--gpu", "1", "--lost")
        lost = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]

        def tainted() -> bool:
            devices = node.published()
            return all(
                [{k: v for k, v in t.items() if k != "timeAdded"} for t in devices[n].get("taints", [])]
                == lost
                for n in ("gpu-1-mig-3g20gb-9-0", "gpu-1-mig-3g20gb-9-3")
            )

        await node.wait(tainted, "both MIG devices of GPU 1 tainted")
        assert "taints" not in node.published()["gpu-3"]


async def test_kubelet_restart_wipes_slices_and_the_driver_publishes_again() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        await node.sim.restart()
        await node.wait_registered()
        await node.wait_published(4)
        assert sorted(node.published()) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


async def test_driver_sigkill_restart_keeps_the_claim_and_unprepare_works_after_the_claim_is_gone() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        pod = claim_pod("job", "c1")
        c1 = node.allocate(claim("c1", [request("gpu", count=2)]), pod)
        uid = c1["metadata"]["uid"]
        allocation = await node.sim.admit(pod)
        assert allocation.containers["main"].run_options is not None
        ids = allocation.containers["main"].run_options.cdi_devices
        assert ids == (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0", f"k8s.gpu.nvidia.com/claim={uid}-gpu-1")
        spec_file = node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json"
        spec = spec_file.read_text()

        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        node.start_driver()  # stale sockets from the killed process are replaced
        # The kubelet's notification to the new process (the log holds both processes' lines): until then
        # the kubelet may still hold the killed one's registration.
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        again = await prepare_directly(node, uid, "c1")
        assert again.claims[uid].error == ""
        assert [
            (d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids))
            for d in again.claims[uid].devices
        ] == [
            ("node-a", "gpu-0", ["gpu"], [f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"]),
            ("node-a", "gpu-1", ["gpu"], [f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"]),
        ]
        assert spec_file.read_text() == spec  # prepared once, not again

        node.api.delete("resourceclaims", "c1")
        await node.sim.terminate_pod("job")
        assert not spec_file.exists()
        checkpoint = json.loads((node.plugins / DRIVER / "checkpoint.json").read_text())
        assert json.loads(checkpoint["data"])["preparedClaims"] == []


async def test_a_132_kubelet_prepares_through_v1beta1() -> None:
    async with DraNode("t4-pcie", kubelet="1.32") as node:
        node.start_driver()
        await node.wait_registered()
        assert node.sim is not None
        assert node.sim.dra_plugins(DRIVER)[0].service == "v1beta1.DRAPlugin"
        await node.wait_published(4)
        pod = claim_pod("old", "c1")
        c1 = node.allocate(claim("c1", [request("gpu")]), pod)
        allocation = await node.sim.admit(pod)
        assert allocation.containers["main"].run_options is not None
        uid = c1["metadata"]["uid"]
        assert allocation.containers["main"].run_options.cdi_devices == (
            f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",
        )


async def test_an_mps_claim_without_its_gate_and_a_bad_config_fail_only_their_claims() -> None:
    """MPSSupport is off (NVIDIA's default), so an MPS config fails its claim with NVIDIA's text, as a bad
    config does; the pod's other claim is prepared."""
    mps = mps_config()
    bad = {
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "Magic"},
            },
        }
    }
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4)
        assert node.sim is not None
        pod = claim_pod("mps", "good", "mps")
        good = node.allocate(claim("good", [request("gpu")]), pod)
        refused = node.allocate(claim("mps", [request("gpu")], config=[mps]), pod)
        with pytest.raises(PrepareError):
            await node.sim.admit(pod)
        other_pod = claim_pod("magic", "bad")
        worse = node.allocate(claim("bad", [request("gpu")], config=[bad]), other_pod)
        with pytest.raises(PrepareError):
            await node.sim.admit(other_pod)
        spec = json.loads((node.cdi / f"k8s.gpu.nvidia.com-claim_{good['metadata']['uid']}.json").read_text())
        assert spec["devices"][0]["name"] == f"{good['metadata']['uid']}-gpu-0"
        for other in (refused, worse):
            assert not (node.cdi / f"k8s.gpu.nvidia.com-claim_{other['metadata']['uid']}.json").exists()
        assert (
            '"MPS" is selected as the GPU sharing strategy, but the "MPSSupport" feature gate is not enabled'
        ) in node.log()
        assert "unknown GPU sharing strategy: Magic; use TimeSlicing or MPS" in node.log()


async def test_health_checks_disabled_keeps_the_driver_up_without_taints() -> None:
    async with DraNode("t4-pcie", env={"DP_DISABLE_HEALTHCHECKS": "all"}) as node:
        node.start_driver()
        await node.wait_published(4)
        inject(node, "--gpu", "1", "--xid", "48")
        # The DRA driver's own line (the health monitor's says "health checks disabled" too).
        await node.wait(lambda: "devices are published without taints" in node.log(), "the log line")
        await asyncio.sleep(1)  # a failing health task logs its first failure at once; none may come
        assert "failed (1 in a row)" not in node.log() and "Traceback" not in node.log()
        assert node.driver is not None and node.driver.poll() is None
        assert all("taints" not in d for d in node.published().values())
        assert await node.stop_driver() == 0
