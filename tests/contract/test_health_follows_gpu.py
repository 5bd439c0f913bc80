"""What the kubelet is told about the devices carved out of a GPU: MIG devices and time-sliced replicas
carry their GPU's health in every ListAndWatch update, through its fault and its recovery.

The kubelet simulator records every update it processed; each test checks all of them, not only the last.
"""

from __future__ import annotations

from pathlib import Path

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind
from tests.contract.conftest import profile_inventory

FAST_RECOVERY = {"KUBEGPU_RECOVERY_QUIET_SECONDS": "1", "KUBEGPU_HEALTH_PROBE_SECONDS": "0.1"}
A100_MIG = profile_inventory("a100-mig")
T4 = profile_inventory("t4-pcie")


def unhealthy_per_update(node: SimulatedNode, after: int) -> dict[str, list[list[str]]]:
    """Per resource, the devices each ListAndWatch update since `after` listed as Unhealthy, in order."""
    out: dict[str, list[list[str]]] = {}
    for event in node.sim.events(EventKind.DEVICES_UPDATED, after=after):
        assert event.resource is not None
        out.setdefault(event.resource, []).append(list(event.data["unhealthy"]))
    return out


async def test_every_mig_device_on_a_faulted_gpu_is_unhealthy_in_every_update_until_it_recovers() -> None:
    # a100-mig, mixed: GPU 2 holds one 3g.20gb, one 2g.10gb and one 1g.5gb device; GPU 3 has MIG off.
    gpu2 = A100_MIG.gpus[2]
    on_gpu2 = {m.uuid for m in gpu2.mig_devices}
    assert len(on_gpu2) == 3
    env = {"MIG_STRATEGY": "mixed", **FAST_RECOVERY}
    async with SimulatedNode("a100-mig", env=env) as node:
        node.start_plugin()
        served = {"nvidia.com/mig-1g.5gb": 8, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 3}
        for resource, count in [*served.items(), (GPU_RESOURCE, 1)]:
            await node.wait_allocatable(count, resource)
        mark = node.sim.last_seq
        node.inject("--gpu", "2", "--xid", "48")
        await node.wait_log(f"GPU 2 ({gpu2.uuid}) Unhealthy -> Healthy: recovery probes passed")
        for resource, count in served.items():
            await node.wait_allocatable(count, resource)
        # One update down, one back up, for each MIG resource GPU 2 holds a device of; each lists exactly
        # GPU 2's devices of that resource: never some of them, never another GPU's.
        expected = {resource: [sorted(set(node.sim.devices(resource)) & on_gpu2), []] for resource in served}
        assert all(len(down) == 1 for down, _ in expected.values())
        assert unhealthy_per_update(node, mark) == expected  # the GPU 3 resource saw no update at all


async def test_every_replica_of_a_faulted_gpu_is_unhealthy_in_every_update_until_it_recovers(
    tmp_path: Path,
) -> None:
    config = tmp_path / "ts.yaml"
    config.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 3\n"
    )
    gpu1 = T4.gpus[1]
    async with SimulatedNode("t4-pcie", env=FAST_RECOVERY) as node:
        node.start_plugin("--config-file", str(config))
        await node.wait_allocatable(12)
        mark = node.sim.last_seq
        node.inject("--gpu", "1", "--xid", "48")
        await node.wait_log(f"GPU 1 ({gpu1.uuid}) Unhealthy -> Healthy: recovery probes passed")
        await node.wait_allocatable(12)
        replicas = [f"{gpu1.uuid}::{r}" for r in range(3)]
        assert unhealthy_per_update(node, mark) == {GPU_RESOURCE: [replicas, []]}
