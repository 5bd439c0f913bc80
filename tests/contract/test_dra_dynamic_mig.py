"""DynamicMIG with `kubegpu dra` as a process on the fake NVML (node profile mig-dynamic: A100 40GB, A100
80GB, H100 80GB, H200 in MIG mode, no instance yet), against the kubelet simulator and the fake API server.

Claims are allocated by writing `status.allocation` directly (the allocator's counter accounting is another
piece); what is checked is the driver: the MIG device the partition names exists exactly while a claim
holds it, an overlapping placement is refused with NVIDIA's text, and a restart destroys nothing a claim
holds and leaves nothing none holds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from kubegpu.demo.dranode import DRIVER, NODE, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import PrepareError
from kubegpu.node.discovery import discover
from kubegpu.node.inventory import MigDevice
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.resourceapi import reserved_status
from tests.dra_objects import claim, request
from tests.readme_blocks import readme_yaml

GATE = {"FEATURE_GATES": "DynamicMIG=true"}
H100 = 2  # index and minor of the H100 in the profile
H200 = 3


def live_migs(node: DraNode, gpu: int) -> list[MigDevice]:
    """The MIG devices on a GPU, as any other process on the node sees them (NVML's state is node-wide)."""
    fake = FakeNvml.from_profile("mig-dynamic", state_dir=node.root / "nvml")
    fake.nvmlInit()
    return list(discover(NvmlBackend(fake, fake.sysfs_root, True, "fake")).gpus[gpu].mig_devices)


def allocate(node: DraNode, name: str, device: str, pod: Any) -> str:
    """Create the claim with `device` allocated from this node's pool and reserved for `pod`; its UID."""
    created = node.api.create("resourceclaims", claim(name, [request("mig")]))
    allocation = {
        "devices": {"results": [{"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
            ]
        },
    }
    created["status"] = reserved_status(allocation, pod.name, pod.uid)
    return str(node.api.update("resourceclaims", created, status=True)["metadata"]["uid"])


def inject(node: DraNode, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "kubegpu", "fake-nvml", "inject", *args],
        env=node.env,
        check=True,
        capture_output=True,
    )


def spec_path(node: DraNode, uid: str) -> Path:
    return node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json"


async def started(node: DraNode) -> None:
    node.start_driver()
    await node.wait_registered()


async def test_a_partition_is_created_on_prepare_destroyed_on_unprepare_and_created_again() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        await started(node)
        assert node.sim is not None
        await node.wait_published(4 * 25)  # every possible partition of the 4 GPUs
        counters = [s["spec"]["sharedCounters"] for s in node.slices() if "sharedCounters" in s["spec"]]
        assert [[c["name"] for c in sets] for sets in counters] == [
            ["gpu-0-counter-set", "gpu-1-counter-set", "gpu-2-counter-set", "gpu-3-counter-set"]
        ]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in node.slices()} == {3}
        assert "uuid" not in node.published()["gpu-2-mig-1g10gb-19-3"]["attributes"]
        assert live_migs(node, H100) == []
        uuids = []
        for round_ in ("first", "second"):
            pod = claim_pod(f"infer-{round_}", f"c-{round_}")
            uid = allocate(node, f"c-{round_}", "gpu-2-mig-1g10gb-19-3", pod)
            allocation = await node.sim.admit(pod)
            cdi_id = f"k8s.gpu.nvidia.com/claim={uid}-gpu-2-mig-1g10gb-19-3"
            assert allocation.containers["main"].run_options is not None
            assert allocation.containers["main"].run_options.cdi_devices == (cdi_id,)
            (mig,) = live_migs(node, H100)
            assert (mig.profile, mig.gi_profile_id, mig.placement_start, mig.placement_size) == (
                "1g.10gb",
                19,
                3,
                1,
            )
            spec = json.loads(spec_path(node, uid).read_text())
            (entry,) = spec["devices"]
            assert entry["name"] == f"{uid}-gpu-2-mig-1g10gb-19-3"
            assert {"path": "/dev/nvidia2", "hostPath": "/dev/nvidia2"} in entry["containerEdits"][
                "deviceNodes"
            ]
            uuids.append(mig.uuid)
            await node.sim.terminate_pod(pod.name)
            assert live_migs(node, H100) == []
            assert not spec_path(node, uid).exists()
        assert uuids[0] != uuids[1]  # a new MIG device, as NVML makes one each time
        assert await node.stop_driver() == 0


async def test_a_claim_for_an_overlapping_placement_is_refused_and_creates_nothing() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        await started(node)
        assert node.sim is not None
        first = claim_pod("a", "c1")
        allocate(node, "c1", "gpu-2-mig-2g20gb-14-0", first)  # memory slices 0-1
        await node.sim.admit(first)
        second = claim_pod("b", "c2")
        uid = allocate(node, "c2", "gpu-2-mig-1g10gb-19-1", second)  # slice 1: taken
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(second)
        assert (
            "error creating MIG device: error creating GPU instance for 'gpu-2-mig-1g10gb-19-1': "
            "Insufficient Resources" in str(refused.value)
        )
        assert [m.profile for m in live_migs(node, H100)] == ["2g.20gb"]
        assert not spec_path(node, uid).exists()
        checkpoint = json.loads((node.plugins / DRIVER / "checkpoint.json").read_text())
        assert [c["name"] for c in json.loads(checkpoint["data"])["preparedClaims"]] == ["c1"]


async def test_a_restart_keeps_what_claims_hold_and_destroys_what_none_holds() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        await started(node)
        assert node.sim is not None
        pod = claim_pod("serve", "held")
        uid = allocate(node, "held", "gpu-3-mig-3g71gb-9-4", pod)
        await node.sim.admit(pod)
        (held,) = live_migs(node, H200)
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL

        # Meanwhile someone makes a MIG device no claim holds (a crashed Prepare would leave the same).
        fake = FakeNvml.from_profile("mig-dynamic", state_dir=node.root / "nvml")
        fake.nvmlInit()
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = 0, 1
        gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(
            fake.nvmlDeviceGetHandleByIndex(H200), 19, placement
        )
        fake.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        assert len(live_migs(node, H200)) == 2

        node.start_driver()
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        assert "Found unexpected MIG device (gpu-3-mig-1g18gb-19-0), attempt to tear down" in node.log()
        assert [m.uuid for m in live_migs(node, H200)] == [held.uuid]
        assert spec_path(node, uid).exists()
        await node.sim.terminate_pod("serve")
        assert live_migs(node, H200) == []
        assert not spec_path(node, uid).exists()


async def test_a_lost_checkpoint_keeps_the_partition_and_the_claim_is_rebuilt() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        await started(node)
        assert node.sim is not None
        pod = claim_pod("serve", "held")
        uid = allocate(node, "held", "gpu-2-mig-4g40gb-5-0", pod)
        await node.sim.admit(pod)
        (held,) = live_migs(node, H100)
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for name in ("checkpoint.json", "checkpoint.json.copy"):
            (node.plugins / DRIVER / name).unlink()

        node.start_driver()
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        assert "Found unexpected MIG device" not in node.log()
        # its CDI spec holds the partition until the API server confirms the claim; then it is prepared again,
        # on the same MIG device
        checkpoint = node.plugins / DRIVER / "checkpoint.json"
        await node.wait(
            lambda: checkpoint.exists() and uid in checkpoint.read_text(),
            "the claim rebuilt into the checkpoint",
        )
        assert [m.uuid for m in live_migs(node, H100)] == [held.uuid]
        await node.sim.terminate_pod("serve")
        assert live_migs(node, H100) == []


MIG_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "mig.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com" && '
                                    'device.attributes["gpu.nvidia.com"].type == "mig"'}}]},
}  # fmt: skip


async def test_the_readme_claim_gets_a_1g_partition_made_on_demand() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        node.api.create("deviceclasses", MIG_CLASS, namespace="")
        await started(node)
        assert node.sim is not None
        await node.wait_published(4 * 25)
        pod = claim_pod("notebook", "mig-1g")
        allocated = node.allocate(readme_yaml("dynamic-mig-claim"), pod)
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        # the first match in name order: the A100 40GB's 1g.10gb (GI profile 15, two memory slices)
        assert result["device"] == "gpu-0-mig-1g10gb-15-0"
        await node.sim.admit(pod)
        (mig,) = live_migs(node, 0)
        assert (mig.profile, mig.gi_profile_id, mig.placement_start, mig.placement_size) == (
            "1g.10gb",
            15,
            0,
            2,
        )
        await node.sim.terminate_pod("notebook")
        assert live_migs(node, 0) == []


async def test_an_xid_taints_every_partition_of_its_gpu() -> None:
    async with DraNode("mig-dynamic", env=GATE) as node:
        await started(node)
        await node.wait_published(4 * 25)
        inject(node, "--gpu", "3", "--xid", "79")

        def tainted() -> list[str]:
            return sorted(n for n, d in node.published().items() if d.get("taints"))

        await node.wait(lambda: len(tainted()) == 25, "a taint on each of the H200's 25 partitions")
        assert all(n.startswith("gpu-3-mig-") for n in tainted())
        assert node.published()["gpu-3-mig-1g18gb-19-0"]["taints"][0]["key"] == "gpu.nvidia.com/xid"
