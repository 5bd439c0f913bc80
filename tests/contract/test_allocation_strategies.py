"""Device-list strategies and CDI end to end: `kubegpu plugin` as a process, the kubelet simulator, pods."""

from __future__ import annotations

import json
import signal

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.allocation.test_cdi import VERSION, fake_driver_root
from tests.cdi_schema import assert_valid_cdi_spec
from tests.contract.conftest import profile_inventory

VENDOR = "k8s.device-plugin.nvidia.com"


async def test_cdi_strategies_write_the_spec_and_allocate_by_cdi_name() -> None:
    inventory = profile_inventory("dgx-a100")
    assert inventory.driver_version == VERSION  # the fake driver tree carries the profile's version
    async with SimulatedNode("dgx-a100") as node:
        tree = fake_driver_root(node.root / "driver-root")
        cdi = node.root / "cdi"
        node.extra_env.update(
            {
                "KUBEGPU_CDI_ROOT": str(cdi),
                "CONTAINER_DRIVER_ROOT": str(tree),  # NVIDIA's alias of DRIVER_ROOT_CTR_PATH
                "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri",
                "GDRCOPY_ENABLED": "true",
            }
        )
        node.start_plugin("--driver-root", "/run/nvidia/driver", "--imex-channel-ids", "0")
        await node.wait_allocatable(8)
        specs = {p.name: json.loads(p.read_text()) for p in sorted(cdi.iterdir())}
        assert sorted(specs) == [
            f"{VENDOR}-gdrcopy.json",
            f"{VENDOR}-gpu.json",
            f"{VENDOR}-imex-channel.json",
        ]
        for spec in specs.values():
            assert_valid_cdi_spec(spec)
        gpu = specs[f"{VENDOR}-gpu.json"]
        assert [d["name"] for d in gpu["devices"]] == [g.uuid for g in inventory.gpus] + ["all"]
        known = {f"{s['kind']}={d['name']}" for s in specs.values() for d in s["devices"]}

        allocation = await node.sim.admit(Pod("train", containers=[Container("main", {GPU_RESOURCE: 2})]))
        main = allocation.containers["main"]
        run = main.run_options
        assert run is not None
        chosen = sorted(main.devices[GPU_RESOURCE])
        names = list(run.cdi_devices)
        assert sorted(names[:2]) == [f"{VENDOR}/gpu={u}" for u in chosen]
        assert names[2:] == [f"{VENDOR}/imex-channel=0", f"{VENDOR}/gdrcopy=all"]
        assert set(names) <= known  # the runtime finds every name in a spec
        ((key, value),) = run.annotations.items()
        assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value.split(",") == names
        assert "NVIDIA_VISIBLE_DEVICES" not in run.envs and run.envs["NVIDIA_GDRCOPY"] == "enabled"

        assert await node.stop_plugin(signal.SIGTERM) == 0
        assert list(cdi.iterdir()) == []  # removed on shutdown


async def test_invalid_strategy_stops_the_start_with_nvidias_text() -> None:
    async with SimulatedNode("t4-pcie") as node:
        node.start_plugin("--device-list-strategy", "envvar,cdi")
        assert await node.wait_plugin_exit() == 1
        log = node.plugin_log()
        assert "unable to validate flags: invalid --device-list-strategy option: invalid strategy: cdi" in log


async def test_one_gpu_pod_on_t4_keeps_the_switch_pair_free_and_gets_mounts_by_index() -> None:
    t4 = profile_inventory("t4-pcie")
    async with SimulatedNode("t4-pcie") as node:
        node.start_plugin(
            "--device-list-strategy",
            "envvar,volume-mounts",
            "--device-id-strategy",
            "index",
            "--pass-device-specs",
        )
        await node.wait_allocatable(4)
        allocation = await node.sim.admit(Pod("infer", containers=[Container("c", {GPU_RESOURCE: 1})]))
        container = allocation.containers["c"]
        (uuid,) = container.devices[GPU_RESOURCE]
        gpu = t4.gpu_by_uuid(uuid)
        assert gpu is not None and gpu.index == 2  # not GPU 0: GPUs 0 and 1 share a PCIe switch
        run = container.run_options
        assert run is not None
        assert run.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert [(m.container_path, m.host_path) for m in run.mounts] == [
            ("/var/run/nvidia-container-devices/2", "/dev/null")
        ]
        assert gpu.device_path in [d.container_path for d in run.devices]
