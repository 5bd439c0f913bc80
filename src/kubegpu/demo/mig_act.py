"""The demo's DynamicMIG act: a 1g partition made on demand.

A second simulated node runs `kubegpu dra --feature-gates DynamicMIG=true` on the fake NVML's `mig-dynamic`
profile (four GPUs in MIG mode, no MIG device yet). The driver publishes every partition the GPUs could hold,
with the shared counters that keep overlapping ones apart; the scheduler (the structured allocator) picks a
1g partition for a claim that asks for the profile by CEL; the kubelet prepares it and the MIG device exists
on the GPU (as `nvidia-smi -L` lists it, read from the fake NVML's node-wide state); the pod goes, the claim
is unprepared and the MIG device is gone."""

from __future__ import annotations

import signal
from typing import Any

from rich.text import Text

from kubegpu.demo.dranode import MIG_CLASS, SimulatedDraNode, claim_pod
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection

MIG_PROFILE = "mig-dynamic"
MIG_GATES = ("--feature-gates", "DynamicMIG=true")
PARTITION_PROFILE = "1g.10gb"
SELECTOR = f'device.attributes["gpu.nvidia.com"].profile == "{PARTITION_PROFILE}"'
MIG_CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "mig-1g", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "mig",
                    "exactly": {
                        "deviceClassName": "mig.nvidia.com",
                        "selectors": [{"cel": {"expression": SELECTOR}}],
                    },
                }
            ]
        }
    },
}


def mig_node() -> SimulatedDraNode:
    """The act's node; the demo enters it with its other nodes and starts the driver early
    (`start_mig_driver`), so the driver's start-up and first publish overlap the device plugin's acts."""
    return SimulatedDraNode(MIG_PROFILE)


def start_mig_driver(node: SimulatedDraNode) -> None:
    node.api.create("deviceclasses", MIG_CLASS, namespace="")
    node.start_driver(*MIG_GATES)


def _inventory(node: SimulatedDraNode) -> Inventory:
    """The node's GPUs and MIG devices as any process on it sees them (the fake NVML's state is node-wide)."""
    backend = load_nvml(NvmlSelection.fake(MIG_PROFILE, node.root / "nvml"))
    with nvml_session(backend.nvml):
        return discover(backend)


def smi_list(inventory: Inventory, gpu_uuid: str) -> list[str]:
    """`nvidia-smi -L` for one GPU: its line, then one line per MIG device on it."""
    gpu = inventory.gpu_by_uuid(gpu_uuid)
    assert gpu is not None
    return [f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})"] + [
        f"  MIG {mig.profile} Device {mig.index}: (UUID: {mig.uuid})" for mig in gpu.mig_devices
    ]


async def mig_act(node: SimulatedDraNode, say: Any, results: dict[str, Any]) -> None:
    """On the node from `mig_node`, its driver started by `start_mig_driver`."""
    say.section("DRA: a 1g partition made on demand (DynamicMIG)")
    say.command(f"KUBEGPU_FAKE_NVML={MIG_PROFILE} kubegpu dra --node-name node-a {' '.join(MIG_GATES)}")
    await node.wait_registered()
    assert node.sim is not None
    await node.wait(lambda: _pool_complete(node), "the pool's slices published")
    before = _inventory(node)
    counter_sets = sum(len(s["spec"].get("sharedCounters") or []) for s in node.slices())
    shown: dict[str, Any] = {
        "partitions": _partitions(node),
        "counter_sets": counter_sets,
        "mig_devices_before": sum(len(g.mig_devices) for g in before.gpus),
    }
    results["dynamic_mig"] = shown
    say.say(
        f"{len(before.gpus)} GPUs in MIG mode, no MIG device yet; the driver publishes "
        f"{shown['partitions']} partitions they could hold, and {counter_sets} counter sets (one per GPU) "
        "so the scheduler never gives out two that overlap"
    )
    say.say(f"claim mig-1g: class mig.nvidia.com, selector {SELECTOR}")
    pod = claim_pod("notebook", "mig-1g")
    claim = node.try_allocate(MIG_CLAIM, pod)
    if claim is None:
        raise AssertionError(f"the allocator found no {PARTITION_PROFILE} partition on {MIG_PROFILE}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    parent = node.published()[device]["attributes"]["parentUUID"]["string"]
    shown["device"] = device
    say.say(f"the scheduler picked partition {device}; the kubelet prepares it, the driver creates it")
    allocation = await node.sim.admit(pod)
    options = allocation.containers["main"].run_options
    shown["cdi_devices"] = list(options.cdi_devices) if options else []
    now = _inventory(node)
    made = now.gpu_by_uuid(parent)
    assert made is not None
    shown["mig_devices"] = [
        {
            "profile": m.profile,
            "gi_profile_id": m.gi_profile_id,
            "placement": [m.placement_start, m.placement_size],
        }
        for m in made.mig_devices
    ]
    say.command(f"nvidia-smi -L   # on the node, GPU {made.index}")
    listing = smi_list(now, parent)
    shown["nvidia_smi_l"] = listing
    for line in listing:
        say.say(Text(line, style="bold" if line.startswith("  MIG") else ""))
    say.say(Text.assemble("container CDI devices: ", (", ".join(shown["cdi_devices"]), "bold")))
    await node.sim.terminate_pod("notebook")
    after = _inventory(node)
    shown["mig_devices_after"] = sum(len(g.mig_devices) for g in after.gpus)
    say.say(
        f"pod gone: the claim is unprepared and the MIG device destroyed ({shown['mig_devices_after']} MIG "
        "devices left on the node)"
    )
    say.command(f"nvidia-smi -L   # GPU {made.index} again")
    for line in smi_list(after, parent):
        say.say(line)
    shown["exit_code"] = await node.stop_driver(signal.SIGTERM)


def _pool_complete(node: SimulatedDraNode) -> bool:
    """Every slice of the pool's newest generation is there (the driver publishes the partitions in
    several slices: the counters, then the devices)."""
    slices = node.slices()
    if not slices:
        return False
    newest = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
    return len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]


def _partitions(node: SimulatedDraNode) -> int:
    return sum(1 for d in node.published().values() if d["attributes"].get("type", {}).get("string") == "mig")
