"""TimeSlicingSettings and the feature gates with `kubegpu dra` as a process: the time slice set with the
fake nvidia-smi at Prepare and reset at Unprepare, a failing nvidia-smi failing its claim only, a claim whose
strategy's gate is off refused, and NVIDIA's start-up refusals of gates. Expected texts are NVIDIA's (the
GPU kubelet plugin's), written out."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.demo.dranode import claim_pod
from kubegpu.kubeletsim import PrepareError
from kubegpu.node.nvml import fake_smi
from tests.dra_objects import claim, request

T4_GPU0 = "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509"
GATE_ON = ("--feature-gates", "TimeSlicingSettings=true")


def time_slicing(interval: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {} if interval is None else {"interval": interval}
    return {
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": config},
            },
        },
    }


def with_fake_smi(node: DraNode) -> Path:
    root = node.root / "driver-root"
    log = node.root / "nvidia-smi.log"
    fake_smi.install(root, log)
    node.extra_env["DRIVER_ROOT_CTR_PATH"] = str(root)
    return log


async def started(node: DraNode, *args: str) -> None:
    node.start_driver(*args)
    await node.wait_registered()
    await node.wait_published(4)


async def test_a_time_sliced_claim_sets_the_interval_and_unprepare_resets_it() -> None:
    async with DraNode("t4-pcie") as node:
        log = with_fake_smi(node)
        await started(node, *GATE_ON)
        assert node.sim is not None
        pod = claim_pod("sliced", "c1")
        c1 = node.allocate(claim("c1", [request("gpu")], config=[time_slicing("Long")]), pod)
        await node.sim.admit(pod)
        assert fake_smi.calls(log) == [
            f"-i {T4_GPU0} -c DEFAULT",
            f"compute-policy -i {T4_GPU0} --set-timeslice 3",
        ]
        uid = c1["metadata"]["uid"]
        assert (node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
        await node.sim.terminate_pod("sliced")
        assert fake_smi.calls(log)[2:] == [
            f"-i {T4_GPU0} -c DEFAULT",
            f"compute-policy -i {T4_GPU0} --set-timeslice 0",
        ]
        assert "feature gates: TimeSlicingSettings=true,MPSSupport=false," in node.log()


async def test_a_missing_interval_means_default() -> None:
    async with DraNode("t4-pcie") as node:
        log = with_fake_smi(node)
        await started(node, *GATE_ON)
        assert node.sim is not None
        pod = claim_pod("sliced", "c1")
        node.allocate(claim("c1", [request("gpu")], config=[time_slicing(None)]), pod)
        await node.sim.admit(pod)
        assert fake_smi.calls(log)[-1] == f"compute-policy -i {T4_GPU0} --set-timeslice 0"


async def test_a_failing_nvidia_smi_fails_its_claim_only() -> None:
    async with DraNode("t4-pcie") as node:
        log = with_fake_smi(node)
        Path(f"{log}.fail").write_text("Unable to set timeslice: insufficient permissions\n")
        await started(node, *GATE_ON)
        assert node.sim is not None
        pod = claim_pod("mixed", "sliced", "plain")
        sliced = node.allocate(claim("sliced", [request("gpu")], config=[time_slicing("Short")]), pod)
        plain = node.allocate(claim("plain", [request("gpu")]), pod)
        with pytest.raises(PrepareError):
            await node.sim.admit(pod)
        uid = sliced["metadata"]["uid"]
        assert (
            f"error setting timeslice config for requests '[gpu]' in claim '{uid}': error running "
            "nvidia-smi: exit status 3: Unable to set timeslice: insufficient permissions"
        ) in node.log()
        assert not (node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()  # nothing left behind
        assert (node.cdi / f"k8s.gpu.nvidia.com-claim_{plain['metadata']['uid']}.json").exists()


async def test_the_gate_off_refuses_a_time_sliced_claim_with_nvidias_text() -> None:
    async with DraNode("t4-pcie") as node:
        log = with_fake_smi(node)
        await started(node)
        assert node.sim is not None
        pod = claim_pod("sliced", "c1")
        node.allocate(claim("c1", [request("gpu")], config=[time_slicing("Long")]), pod)
        with pytest.raises(PrepareError):
            await node.sim.admit(pod)
        assert (
            '"TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" feature '
            "gate is not enabled"
        ) in node.log()
        assert fake_smi.calls(log) == []


@pytest.mark.parametrize(
    ("gates", "text"),
    [
        ("DynamicMIG=true,MPSSupport=true",
         "feature gate validation failed: feature gate DynamicMIG is currently mutually exclusive with "
         "MPSSupport"),
        ("MPSSupport=true",
         "invalid CLI flags: --image-name (IMAGE_NAME) is required when the MPSSupport feature gate is "
         "enabled"),
        ("Bogus=true", "unrecognized feature gate: Bogus"),
    ],
)  # fmt: skip
async def test_the_driver_refuses_to_start_on_bad_gates(gates: str, text: str) -> None:
    async with DraNode("t4-pcie", env={"FEATURE_GATES": gates}) as node:
        driver = node.start_driver()
        code = await asyncio.to_thread(driver.wait, 30)
        assert code == 1
        assert text in node.log()
        assert not (node.plugins / "gpu.nvidia.com" / "dra.sock").exists()
        # `config check-dra` on the same env says what the driver said, word for word
        checked = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "kubegpu", "config", "check-dra", "--json"],
            env=node.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert checked.returncode == 1
        (error,) = json.loads(checked.stdout)["errors"]
        assert text in error and f"ERROR kubegpu: {error}\n" in node.log()
