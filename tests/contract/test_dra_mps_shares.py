"""MPS under ConsumableShares with `kubegpu dra` as a process: claims sharing a GPU by memory share one MPS
control daemon for it, and each client is kept to what the scheduler says it consumed (beyond NVIDIA, whose
driver refuses MPS in that mode).

Claims are allocated by the real structured allocator from the slices the driver publishes; the node runs
the daemon's Deployment against the fake `nvidia-cuda-mps-control` and `nvidia-smi` (`test_dra_mps.Node`).
Names and values are written out: the daemon `mps-control-daemon-gpu-<first 12 hex digits of
sha256(GPU UUID)>`, the limits `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<uuid>=<consumed MiB>M` and
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<consumed part of the GPU's 15Gi, in whole percent>`.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.node.nvml import fake_mps_control, fake_smi
from tests.contract.test_dra_consumable_shares import gpu0
from tests.contract.test_dra_mps import BIND, Node
from tests.dra_objects import mps_config
from tests.readme_blocks import readme_yaml

T4_GPU0 = "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509"
DAEMON = "gpu-815e43a823c1"  # sha256("GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509")[:12]
NAME = f"mps-control-daemon-{DAEMON}"
GIB = 1024**3


def shared_node(dra: DraNode) -> Node:
    node = Node(dra)
    dra.extra_env.update(
        {"FEATURE_GATES": "MPSSupport=true,ConsumableShares=true", "CONSUMABLE_SHARES": "memory"}
    )
    return node


async def two_sharers(node: Node) -> list[str]:
    """Claims a (8Gi) and b (6Gi) of gpu-0 with NVIDIA's demo MPS config, prepared for pods; their UIDs."""
    await node.start()
    sim = node.node.sim
    assert sim is not None
    uids = []
    for name, memory in (("a", "8Gi"), ("b", "6Gi")):
        pod = claim_pod(f"pod-{name}", name)
        allocated = node.node.allocate(gpu0(name, memory, config=[mps_config()]), pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert (result["device"], result["consumedCapacity"]) == ("gpu-0", {"memory": memory})
        uids.append(str(allocated["metadata"]["uid"]))
        await sim.admit(pod)
    return uids


def container_edits(dra: DraNode, uid: str) -> dict[str, Any]:
    spec = json.loads((dra.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    (entry,) = spec["devices"]
    return dict(entry["containerEdits"])


def mps_env(dra: DraNode, uid: str) -> list[str]:
    return [e for e in container_edits(dra, uid)["env"] if e.startswith("CUDA_MPS_")]


async def test_two_claims_on_one_gpu_by_memory_share_one_daemon_each_with_its_own_limits() -> None:
    async with DraNode("t4-pcie") as dra:
        node = shared_node(dra)
        a, b = await two_sharers(node)
        assert list(node.deployments()) == [NAME]  # one daemon for the GPU, not one per claim
        (container,) = node.deployments()[NAME]["spec"]["template"]["spec"]["containers"]
        assert container["env"][0] == {"name": "CUDA_VISIBLE_DEVICES", "value": T4_GPU0}
        # started once, with the (same) config's defaults; the second sharer joined it
        assert [c.stdin for c in fake_mps_control.calls(node.mps_log)] == [
            "",
            "set_default_active_thread_percentage 50",
            f"set_default_device_pinned_mem_limit {T4_GPU0} 10240M",
        ]
        assert fake_smi.compute_modes(node.smi_log) == {T4_GPU0: "EXCLUSIVE_PROCESS"}
        host = node.mps_dir(DAEMON)
        assert mps_env(dra, a) == [
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={T4_GPU0}=8192M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=53",  # 8Gi of 15Gi
        ]
        assert mps_env(dra, b) == [
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={T4_GPU0}=6144M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",  # 6Gi of 15Gi
        ]
        for uid in (a, b):  # both clients on the one daemon's pipe and shm
            assert container_edits(dra, uid)["mounts"] == [
                {"hostPath": f"{host}/shm", "containerPath": "/dev/shm", "options": BIND},
                {"hostPath": f"{host}/pipe", "containerPath": "/tmp/nvidia-mps", "options": BIND},
            ]
        assert f"KUBEGPU_CONSUMED_MEMORY_BYTES={8 * GIB}" in container_edits(dra, a)["env"]
        # 1Gi is left on gpu-0: a third sharer for 2Gi is not allocated
        assert dra.try_allocate(gpu0("c", "2Gi", config=[mps_config()]), claim_pod("pod-c", "c")) is None

        assert dra.sim is not None
        await dra.sim.terminate_pod("pod-a")
        assert list(node.deployments()) == [NAME]  # b still uses it
        assert fake_smi.compute_modes(node.smi_log) == {T4_GPU0: "EXCLUSIVE_PROCESS"}
        assert f"MPS control daemon {NAME} is still used by another claim: kept" in dra.log()
        assert (host / "daemon.json").exists()
        await dra.sim.terminate_pod("pod-b")  # the last sharer: the daemon goes
        assert node.deployments() == {}
        assert fake_smi.compute_modes(node.smi_log) == {T4_GPU0: "DEFAULT"}
        assert not host.exists()


async def test_a_restart_with_two_sharers_keeps_their_daemon_and_both_claims() -> None:
    async with DraNode("t4-pcie") as dra:
        node = shared_node(dra)
        uids = await two_sharers(node)
        kept = node.deployments()[NAME]["metadata"]["uid"]
        specs = [container_edits(dra, uid) for uid in uids]
        assert await dra.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        dra.start_driver()
        await dra.wait(
            lambda: dra.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        await asyncio.sleep(6)  # a pass of the supervisor (every 5 s) after the restart
        assert node.deployments()[NAME]["metadata"]["uid"] == kept  # nothing a claim holds destroyed
        assert "no prepared claim holds it" not in dra.log()
        assert [container_edits(dra, uid) for uid in uids] == specs
        assert dra.sim is not None
        await dra.sim.terminate_pod("pod-a")
        assert node.deployments()[NAME]["metadata"]["uid"] == kept
        await dra.sim.terminate_pod("pod-b")
        assert node.deployments() == {}  # nothing left that none holds
        assert fake_smi.compute_modes(node.smi_log) == {T4_GPU0: "DEFAULT"}


async def test_a_lost_checkpoint_rebuilds_both_sharers_on_the_daemon_they_share() -> None:
    async with DraNode("t4-pcie") as dra:
        node = shared_node(dra)
        uids = await two_sharers(node)
        kept = node.deployments()[NAME]["metadata"]["uid"]
        envs = [mps_env(dra, uid) for uid in uids]
        assert await dra.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for lost in (dra.plugins / DRIVER).glob("checkpoint*"):
            lost.unlink()
        dra.start_driver()
        checkpoint = dra.plugins / DRIVER / "checkpoint.json"
        await dra.wait(
            lambda: checkpoint.exists() and all(u in checkpoint.read_text() for u in uids),
            "both sharers rebuilt into the checkpoint",
        )
        await asyncio.sleep(6)  # a pass of the supervisor after the rebuild
        assert node.deployments()[NAME]["metadata"]["uid"] == kept
        assert [mps_env(dra, uid) for uid in uids] == envs
        assert dra.sim is not None
        await dra.sim.terminate_pod("pod-a")
        assert list(node.deployments()) == [NAME]
        await dra.sim.terminate_pod("pod-b")
        assert node.deployments() == {}


async def test_the_readme_claim_gets_8gi_of_a_gpu_on_its_shared_daemon() -> None:
    async with DraNode("t4-pcie") as dra:
        node = shared_node(dra)
        await node.start()
        assert dra.sim is not None
        pod = claim_pod("mps-notebook", "mps-8gi")
        allocated = dra.allocate(readme_yaml("mps-shares-claim"), pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"] == {"memory": "8Gi"}
        await dra.sim.admit(pod)
        assert list(node.deployments()) == [NAME]
        assert mps_env(dra, allocated["metadata"]["uid"]) == [
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={T4_GPU0}=8192M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=53",
        ]
