"""The demo's DRA act: `kubegpu dra` on the same simulated node registers with the kubelet's plugin watcher,
publishes its GPUs as ResourceSlices, and prepares a claim the scheduler (the structured allocator) gave
a GPU: the container gets the CDI ID of a per-claim CDI spec. The driver shares GPUs by memory
(ConsumableShares), which the sharing act shows."""

from __future__ import annotations

import signal
from typing import Any

from rich.text import Text

from kubegpu.demo.dranode import DRIVER, SimulatedDraNode, claim_pod
from kubegpu.demo.sharing_act import SHARES_FLAGS, sharing_act
from kubegpu.kubeletsim import PrepareError

CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "one-gpu", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
}


async def dra_act(node: SimulatedDraNode, say: Any, results: dict[str, Any]) -> None:
    """The act, on a node whose driver the demo started early (its start-up overlaps the plugin's acts)."""
    say.section("DRA: the same GPUs through resource.k8s.io")
    say.command(f"kubegpu dra --node-name node-a {' '.join(SHARES_FLAGS)}   # driver {DRIVER}")
    await node.wait_registered()
    assert node.sim is not None
    plugin = node.sim.dra_plugins(DRIVER)[0]
    say.say(f"registered through the plugin watcher; the 1.34 kubelet picked {plugin.service}")
    await node.wait(lambda: bool(node.published()), "published devices")
    names = sorted(node.published())
    results["dra"] = {"service": plugin.service, "devices": names}
    say.say(
        f"ResourceSlice pool node-a: {len(names)} device(s): "
        + ", ".join(names[:6])
        + (" ..." if len(names) > 6 else "")
    )
    pod = claim_pod("dra-pod", "one-gpu")
    claim = node.try_allocate(CLAIM, pod)
    if claim is None:
        say.say("no whole GPU to allocate on this profile (all are in MIG mode)")
        results["dra"]["cdi_devices"] = []
    else:
        uid = claim["metadata"]["uid"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        say.say(f"the scheduler allocated claim one-gpu ({uid[:8]}...) device {device}; the kubelet prepares")
        try:
            allocation = await node.sim.admit(pod)
        except PrepareError as err:
            say.say(Text(f"Prepare failed: {err}", style="red"))
            raise
        options = allocation.containers["main"].run_options
        cdi = list(options.cdi_devices) if options else []
        results["dra"]["cdi_devices"] = cdi
        say.say(Text.assemble("container CDI devices: ", (", ".join(cdi), "bold")))
        say.say(Text(f"spec written: {node.cdi.name}/k8s.gpu.nvidia.com-claim_{uid}.json", style="dim"))
        await node.sim.terminate_pod("dra-pod")
        say.say("pod gone: the claim is unprepared and its CDI spec removed")
    await sharing_act(node, say, results)
    results["dra"]["exit_code"] = await node.stop_driver(signal.SIGTERM)
