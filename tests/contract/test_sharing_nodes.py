"""Time-sliced and MIG-mixed nodes as the kubelet sees them: several sockets registered at once."""

from __future__ import annotations

from pathlib import Path

from kubegpu.demo.simnode import SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.conftest import profile_inventory

A100_MIG = profile_inventory("a100-mig")
T4 = profile_inventory("t4-pcie")


async def test_mig_mixed_registers_one_socket_per_profile() -> None:
    async with SimulatedNode("a100-mig", env={"MIG_STRATEGY": "mixed"}) as node:
        node.start_plugin()
        await node.wait_allocatable(8, resource="nvidia.com/mig-1g.5gb")
        await node.wait_allocatable(3, resource="nvidia.com/mig-3g.20gb")
        await node.wait_allocatable(1, resource="nvidia.com/mig-2g.10gb")
        await node.wait_allocatable(1, resource="nvidia.com/gpu")
        assert node.plugin_sockets() == [
            "nvidia-gpu.sock",
            "nvidia-mig-1g.5gb.sock",
            "nvidia-mig-2g.10gb.sock",
            "nvidia-mig-3g.20gb.sock",
        ]
        allocation = await node.sim.admit(
            Pod("p", containers=[Container("c", {"nvidia.com/mig-3g.20gb": 1})])
        )
        c = allocation.containers["c"]
        (mig_uuid,) = c.devices["nvidia.com/mig-3g.20gb"]
        assert mig_uuid.startswith("MIG-") and c.run_options.envs["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
        parent = next(g for g in A100_MIG.gpus if any(m.uuid == mig_uuid for m in g.mig_devices))
        assert node.sim.devices("nvidia.com/mig-3g.20gb")[mig_uuid].numa_nodes == (parent.numa_node,)
        # An XID on a MIG GPU takes every MIG device on it down (NVIDIA marks at most one).
        node.inject("--gpu", "0", "--xid", "48")
        await node.wait_allocatable(1, resource="nvidia.com/mig-1g.5gb")  # 7 on GPU 0 gone, 1 on GPU 2 left


async def test_time_sliced_node_with_rename(tmp_path: Path) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
        "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    async with SimulatedNode("t4-pcie", plugin_args=["--config-file", str(config)]) as node:
        node.start_plugin()
        await node.wait_allocatable(16, resource="nvidia.com/gpu.shared")
        assert node.plugin_sockets() == ["nvidia-gpu.shared.sock"]
        pod = Pod(
            "p",
            containers=[
                Container("a", {"nvidia.com/gpu.shared": 1}),
                Container("b", {"nvidia.com/gpu.shared": 1}),
            ],
        )
        allocation = await node.sim.admit(pod)
        for name in ("a", "b"):
            c = allocation.containers[name]
            (replica,) = c.devices["nvidia.com/gpu.shared"]
            uuid, _, r = replica.partition("::")
            assert r.isdigit() and c.run_options.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
        node.inject("--gpu", "1", "--xid", "79")
        await node.wait_allocatable(12, resource="nvidia.com/gpu.shared")  # all 4 replicas of GPU 1
