"""`kubegpu dra` with ConsumableShares: what Prepare of a shared claim costs against Prepare of a whole GPU.

Method: two simulated DRA nodes of `kubegpu demo` (apisim, the kubelet simulator's DRA side, the driver as a
child process on the fake NVML, dgx-a100), side by side in this run: one driver without shares, one with
`--consumable-shares memory`. Claims on gpu-0 are written as the scheduler writes them (whole; or a share
of 4Gi with its shareID and consumedCapacity), and one blocking client calls each driver's dra.sock directly,
alternating batches between the two: Prepare of a new claim, then its Unprepare. A shared claim's Prepare
also checks the other holders' configs, puts its consumption in the CDI spec's env, and writes the claim's
status.devices (a GET and a PUT through the light client) after the node lock is released; that write is
the difference measured.

    python -m bench.dra_shares_bench [--rounds 10] [--batch 25]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import grpc

from bench.common import Result, Row, interruptible, ms, ratio, summary_ms
from bench.dra_bench import PREPARE, UNPREPARE, _request
from kubegpu.api.dra.v1 import api_pb2 as dra
from kubegpu.demo.dranode import DRIVER, NODE, SimulatedDraNode
from kubegpu.resourceapi import reserved_status

SHARES = ("--feature-gates", "ConsumableShares=true", "--consumable-shares", "memory")


def claim_on_gpu0(node: SimulatedDraNode, name: str, shared: bool) -> dict[str, Any]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    created = node.api.create("resourceclaims", body)
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    if shared:
        result.update(shareID=str(uuid.uuid4()), consumedCapacity={"memory": "4Gi"})
    created["status"] = reserved_status({"devices": {"results": [result]}}, "bench", "pod-uid-bench")
    return node.api.update("resourceclaims", created, status=True)


def _measure(nodes: dict[str, SimulatedDraNode], rounds: int, batch: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {f"{k}_{step}": [] for k in nodes for step in ("prepare", "unprepare")}
    socks = {k: n.plugins / DRIVER / "dra.sock" for k, n in nodes.items()}
    channels = {k: grpc.insecure_channel(f"unix://{sock}") for k, sock in socks.items()}
    try:
        for i in range(rounds + 1):  # the first round warms up and is not counted
            for kind, node in nodes.items():
                prepare = channels[kind].unary_unary(PREPARE)
                unprepare = channels[kind].unary_unary(UNPREPARE)
                for j in range(batch):
                    one = _request([claim_on_gpu0(node, f"c-{i}-{j}", kind == "shared")])
                    start = time.perf_counter()
                    reply = prepare(one)
                    took = time.perf_counter() - start
                    assert all(c.error == "" for c in reply_claims(reply)), reply
                    start = time.perf_counter()
                    unprepare(one)
                    if i:
                        samples[f"{kind}_prepare"].append(took)
                        samples[f"{kind}_unprepare"].append(time.perf_counter() - start)
    finally:
        for channel in channels.values():
            channel.close()
    return samples


def reply_claims(reply: bytes) -> list[Any]:
    return list(dra.NodePrepareResourcesResponse.FromString(reply).claims.values())


async def _run(rounds: int, batch: int) -> Result:
    async with SimulatedDraNode("dgx-a100") as whole, SimulatedDraNode("dgx-a100") as shared:
        whole.start_driver()
        shared.start_driver(*SHARES)
        for node in (whole, shared):
            await node.wait_registered()
            await node.wait_published(8)
        samples = await asyncio.to_thread(_measure, {"whole": whole, "shared": shared}, rounds, batch)
        written = [c for c in shared.api.list("resourceclaims") if (c.get("status") or {}).get("devices")]
    s = {name: summary_ms(values) for name, values in samples.items()}
    base, mine = s["whole_prepare"], s["shared_prepare"]
    p50 = ratio(mine["p50_ms"], base["p50_ms"])
    rows = [
        Row("DRA Prepare of a new shared claim (ConsumableShares: status.devices written), p50 / p99",
            f"{ms(mine['p50_ms'])} / {ms(mine['p99_ms'])}",
            f"{ms(base['p50_ms'])} / {ms(base['p99_ms'])} (a whole GPU, shares off, same run)", p50,
            "informational", None),
    ]  # fmt: skip
    return Result(
        "dra_shares_bench",
        {"samples": {k: len(v) for k, v in samples.items()}, **s, "ratio_p50": p50,
         "statuses_written": len(written)},
        target="informational",
        passed=None,
        rows=rows,
    )  # fmt: skip


if __name__ == "__main__":
    interruptible()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=25)
    args = parser.parse_args()
    asyncio.run(_run(args.rounds, args.batch)).save()
