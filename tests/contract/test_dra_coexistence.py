"""Coexistence with DRA: `kubegpu plugin` as a process on the fake NVML leaves the `KUBEGPU_DRA_GPUS` GPUs out
of everything it serves (devices, replicas, MIG devices, CDI specs) and says so in its log."""

from __future__ import annotations

import asyncio
import json
import signal

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from tests.contract.conftest import profile_inventory

VENDOR = "k8s.device-plugin.nvidia.com"


def _dgx_uuids() -> list[str]:
    return [g.uuid for g in profile_inventory("dgx-a100").gpus]


async def test_selected_gpus_are_neither_devices_nor_in_the_cdi_spec() -> None:
    uuids = _dgx_uuids()
    async with SimulatedNode("dgx-a100") as node:
        cdi = node.root / "cdi"
        node.extra_env.update(
            {
                "KUBEGPU_CDI_ROOT": str(cdi),
                "DEVICE_LIST_STRATEGY": "cdi-annotations",
                "KUBEGPU_DRA_GPUS": f"0,{uuids[5].upper().replace('GPU-', 'gpu-')}",
            }
        )
        node.start_plugin()
        await node.wait_allocatable(6)
        served = sorted(node.sim.devices(GPU_RESOURCE))
        assert served == sorted(u for i, u in enumerate(uuids) if i not in (0, 5))
        spec = json.loads((cdi / f"{VENDOR}-gpu.json").read_text())
        names = [d["name"] for d in spec["devices"]]
        assert names == [u for i, u in enumerate(uuids) if i not in (0, 5)] + ["all"]
        everything = json.dumps(spec)
        assert uuids[0] not in everything and uuids[5] not in everything
        log = node.plugin_log()
        assert (
            f"leaving 2 GPU(s) to DRA (KUBEGPU_DRA_GPUS=0,{uuids[5]}): GPU 0 ({uuids[0]}), "
            f"GPU 5 ({uuids[5]}); the device plugin does not serve them, their MIG devices or replicas"
        ) in log
        assert await node.stop_plugin(signal.SIGTERM) == 0


async def test_replicas_of_a_dra_gpu_are_not_served() -> None:
    uuids = _dgx_uuids()
    async with SimulatedNode("dgx-a100", env={"KUBEGPU_DRA_GPUS": "1"}) as node:
        config = node.root / "config.yaml"
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 3\n"
        )
        node.start_plugin("--config-file", str(config))
        await node.wait_allocatable(21)
        ids = sorted(node.sim.devices(GPU_RESOURCE))
        assert ids == sorted(f"{u}::{r}" for i, u in enumerate(uuids) if i != 1 for r in range(3))


async def test_mig_devices_follow_their_parent_gpu() -> None:
    # a100-mig: GPU 0 holds seven 1g.5gb devices; GPU 1 two 3g.20gb; GPU 2 one each of 3g.20gb, 2g.10gb,
    # 1g.5gb; GPU 3 has MIG off.
    gpu0 = "GPU-a533beae-eed7-4075-9b77-c464441d6fff"
    async with SimulatedNode("a100-mig", env={"MIG_STRATEGY": "mixed", "KUBEGPU_DRA_GPUS": gpu0}) as node:
        node.start_plugin()
        # Each resource registers on its own: wait for every one that must be served before comparing.
        for resource, count in [("gpu", 1), ("mig-1g.5gb", 1), ("mig-2g.10gb", 1), ("mig-3g.20gb", 3)]:
            await node.wait_allocatable(count, f"nvidia.com/{resource}")
        served = {r: sorted(node.sim.devices(r)) for r in sorted(node.sim.allocatable())}
        assert served == {
            "nvidia.com/gpu": ["GPU-95b57a48-af3a-4c20-aa33-09248d7e4165"],
            "nvidia.com/mig-1g.5gb": ["MIG-38620200-dc74-4a6f-a8c1-5e2b9ff5d83d"],
            "nvidia.com/mig-2g.10gb": ["MIG-c071dfee-c905-445a-b14c-3df0e65d880d"],
            "nvidia.com/mig-3g.20gb": [
                "MIG-5765bd0f-7a58-47eb-aa8d-2535aba25fc5",
                "MIG-b6745159-4712-48e5-bf9b-e96bc25e9084",
                "MIG-c9192047-d716-4c07-9f3b-fcfeea3ab71c",
            ],
        }


async def test_all_gpus_to_dra_serves_nothing_and_does_not_retry_discovery() -> None:
    async with SimulatedNode("t4-pcie", env={"KUBEGPU_DRA_GPUS": "all"}) as node:
        node.start_plugin()
        await node.wait_log("leaving 4 GPU(s) to DRA (KUBEGPU_DRA_GPUS=all)")
        await asyncio.sleep(0.5)
        assert node.plugin is not None and node.plugin.poll() is None
        assert "No devices found" not in node.plugin_log()
        assert node.plugin_sockets() == [] and not node.sim.registered(GPU_RESOURCE)
        assert await node.stop_plugin() == 0


async def test_an_item_naming_no_gpu_is_a_warning_and_a_bad_one_stops_the_start() -> None:
    async with SimulatedNode("t4-pcie", env={"KUBEGPU_DRA_GPUS": "3,7"}) as node:
        node.start_plugin()
        await node.wait_allocatable(3)
        await node.wait_log("KUBEGPU_DRA_GPUS names no GPU of this node: 7")
        assert await node.stop_plugin() == 0
    async with SimulatedNode("t4-pcie", env={"KUBEGPU_DRA_GPUS": "MIG-0"}) as node:
        node.start_plugin()
        assert await node.wait_plugin_exit() == 1
        assert (
            "KUBEGPU_DRA_GPUS='MIG-0' is not a valid GPU selection: 'MIG-0' is a MIG device; MIG devices "
            "follow their parent GPU, name the GPU; use all, none, GPU indices (0,2) or GPU UUIDs "
            "(GPU-<uuid>), comma-separated, e.g. none (the default)"
        ) in node.plugin_log()
