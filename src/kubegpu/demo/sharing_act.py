"""The demo's sharing act (ConsumableShares): the DRA driver publishes each GPU for several claims by memory
(`--consumable-shares memory`), two pods get 24Gi and 12Gi of one GPU, each container learns what it
consumed from its env, and a third claim for 20Gi of that GPU stays unallocated; `explain`'s account says
why (what is left, and who holds the rest)."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

from kubegpu.demo.dranode import DRIVER, SimulatedDraNode, claim_pod
from kubegpu.resourceapi import explain, holders, parse_claim, parse_class, parse_slice
from kubegpu.resourceapi.explain import CAPACITY

SHARES_FLAGS = ("--feature-gates", "ConsumableShares=true", "--consumable-shares", "memory")
SHARERS = (("train", "24Gi"), ("serve", "12Gi"))
PENDING = ("batch", "20Gi")


def memory_claim(name: str, memory: str, uuid: str | None = None) -> dict[str, Any]:
    """A claim for `memory` of a GPU (of the GPU with `uuid`, when given)."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}
    if uuid:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _env(node: SimulatedDraNode, uid: str) -> dict[str, str]:
    spec = json.loads((node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    env = spec["devices"][0]["containerEdits"].get("env", [])
    return dict(e.split("=", 1) for e in env)


def why_pending(node: SimulatedDraNode, name: str, device: str) -> str:
    """What explain says of `device` for the claim `name`: the capacity it lacks, and its sharers."""
    claims = node.api.list("resourceclaims")
    pending = [parse_claim(c) for c in claims if c["metadata"]["name"] == name]
    allocated = [parse_claim(c) for c in claims if (c.get("status") or {}).get("allocation")]
    (account,) = explain(
        pending,
        [parse_class(c) for c in node.api.list("deviceclasses")],
        [parse_slice(s) for s in node.slices()],
        [node.api.get("nodes", "node-a", namespace="")],
        holders(allocated),
    )
    for verdict in account.requests[0].verdicts:
        if verdict.device.device == device and verdict.verdict == CAPACITY:
            return verdict.detail
    return account.summary


async def sharing_act(node: SimulatedDraNode, say: Any, results: dict[str, Any]) -> None:
    """On the demo's DRA node, its driver started with `SHARES_FLAGS`."""
    assert node.sim is not None
    say.section("DRA: one GPU shared by memory (ConsumableShares)")
    say.command("kubegpu dra " + " ".join(SHARES_FLAGS))
    shared: dict[str, Any] = {}
    results["sharing"] = shared
    uuid = None
    for name, memory in SHARERS:
        pod = claim_pod(f"{name}-pod", name)
        claim = node.try_allocate(memory_claim(name, memory, uuid), pod)
        if claim is None:
            say.say(f"no GPU takes {memory} for claim {name} on this profile: nothing to share")
            return
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        uuid = node.published()[result["device"]]["attributes"]["uuid"]["string"]
        await node.sim.admit(pod)
        env = _env(node, claim["metadata"]["uid"])
        shared[name] = {
            "device": result["device"],
            "consumed": result["consumedCapacity"]["memory"],
            "env_memory_bytes": int(env["KUBEGPU_CONSUMED_MEMORY_BYTES"]),
            "status": node.api.get("resourceclaims", name)["status"].get("devices", []),
        }
        say.say(
            Text.assemble(
                f"claim {name}: {memory} of {result['device']} (share {result['shareID'][:8]}...), env ",
                (f"KUBEGPU_CONSUMED_MEMORY_BYTES={env['KUBEGPU_CONSUMED_MEMORY_BYTES']}", "bold"),
                f" of KUBEGPU_DEVICE_MEMORY_BYTES={env['KUBEGPU_DEVICE_MEMORY_BYTES']}",
            )
        )
    name, memory = PENDING
    device = shared[SHARERS[0][0]]["device"]
    if node.try_allocate(memory_claim(name, memory, uuid), claim_pod(f"{name}-pod", name)) is not None:
        say.say(f"claim {name} fit as well: the GPU is larger than this act expects")
        return
    reason = why_pending(node, name, device)
    shared["pending"] = {"claim": name, "reason": reason}
    say.say(Text.assemble(f"claim {name} ({memory} of {device}) stays pending: ", (reason, "yellow")))
    for sharer, _ in SHARERS:
        await node.sim.terminate_pod(f"{sharer}-pod")
