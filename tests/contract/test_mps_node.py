"""An MPS-shared node: served only once the control daemon answers, then MPS env, mounts and limits."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kubegpu.demo.simnode import SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.conftest import profile_inventory

T4 = profile_inventory("t4-pcie")
CONFIG = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
STAND_IN = """#!/bin/sh
# nvidia-cuda-mps-control stand-in: answers the health query when the pipe directory exists.
cat > /dev/null
[ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && echo 25
"""


async def test_mps_resource_waits_for_its_daemon_then_serves_with_limits(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(STAND_IN)
    tool.chmod(0o755)
    config = tmp_path / "mps.yaml"
    config.write_text(CONFIG)
    container_root = tmp_path / "mps"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KUBEGPU_MPS_CONTAINER_ROOT": str(container_root),
        "KUBEGPU_MPS_RETRY_SECONDS": "0.3",
    }
    args = ["--config-file", str(config), "--mps-root", "/run/nvidia/mps"]
    async with SimulatedNode("t4-pcie", env=env, plugin_args=args) as node:
        node.start_plugin()
        for _ in range(100):
            if "MPS control daemon is not ready" in node.plugin_log():
                break
            await asyncio.sleep(0.05)
        assert not node.sim.registered("nvidia.com/gpu")  # no daemon yet: not served
        (container_root / "nvidia.com/gpu" / "pipe").mkdir(parents=True)  # the daemon comes up
        await node.wait_allocatable(16)
        allocation = await node.sim.admit(Pod("p", containers=[Container("c", {"nvidia.com/gpu": 1})]))
        c = allocation.containers["c"]
        envs = c.run_options.envs
        assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        memory_mib = T4.gpus[0].memory_bytes // 4 // (1 << 20)
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory_mib}M"
        mounts = {(m.container_path, m.host_path) for m in c.run_options.mounts}
        assert ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe") in mounts
        assert ("/dev/shm", "/run/nvidia/mps/shm") in mounts
        # failRequestsGreaterThanOne defaults to true for MPS: two replicas in one container are refused.
        try:
            await node.sim.admit(Pod("q", containers=[Container("c", {"nvidia.com/gpu": 2})]))
        except Exception as err:
            assert "maximum request size for shared resources is 1; found 2" in str(err)
        else:
            raise AssertionError("a request for 2 MPS replicas was admitted")
