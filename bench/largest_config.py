"""Peak memory at the largest config the plugin accepts, under the most it admits at once.

The largest config: 8 GPUs x 7,960 time-sliced replicas (63,680 devices), the most whose ListAndWatch
message fits the kubelet's 4 MiB (more is refused at start). Method: `kubegpu plugin` as a child process on
the fake dgx-a100, the kubelet simulator in this process; once the kubelet lists the devices (and after a
0.5 s settle) the daemon's RSS is read: the baseline. Then 100 valid GetPreferredAllocation calls at once,
each listing every device as available (3 MB each), `--rounds` times, while a thread samples the daemon's
RSS every 10 ms. Before calls were admitted by the size of what they may carry, this peaked at 257-262 MiB,
over the DaemonSet's 256Mi limit.

Reported: the peak against the idle daemon (ratio) and against the DaemonSet's limit; how many calls were
served and how many refused (RESOURCE_EXHAUSTED, which the kubelet retries).

    python -m bench.largest_config [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import Counter
from pathlib import Path

import grpc

from bench.common import Result, Row, interruptible, ratio
from bench.serving_bounds import IN_FLIGHT, UNLIMITED, PeakRss, daemonset_memory_limit_mb, idle_rss
from kubegpu.api.v1beta1 import api_pb2
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode

REPLICAS = 7960  # the most on 8 GPUs whose device list fits the kubelet's 4 MiB message
DEVICES = 8 * REPLICAS


async def preferred_calls(socket: Path, ids: list[str], rounds: int) -> Counter[str]:
    body = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)
        ]
    ).SerializeToString()
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=UNLIMITED) as channel:
        call = channel.unary_unary("/v1beta1.DevicePlugin/GetPreferredAllocation")

        async def one() -> None:
            try:
                await call(body, timeout=120)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as err:
                codes[err.code().name] += 1

        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
    return codes


async def _run(rounds: int) -> Result:
    limit_mb = daemonset_memory_limit_mb()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "replicas.yaml"
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            f"    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
        )
        async with SimulatedNode("dgx-a100") as node:
            pid, idle = await idle_rss(node, DEVICES, "--config-file", str(config))
            ids = list(node.sim.devices(GPU_RESOURCE))
            assert len(ids) == DEVICES, len(ids)
            with PeakRss(pid) as peak:
                codes = await preferred_calls(node.plugin_dir / "nvidia-gpu.sock", ids, rounds)
            await node.wait_allocatable(DEVICES, timeout=30)
    peak_mb = max(peak.peak, idle)
    print(f"  idle {idle:.1f} MB, peak {peak_mb:.1f} MB, {dict(codes)}", flush=True)
    row = Row(
        f"Daemon peak RSS at the largest accepted config (8 GPUs x {REPLICAS} replicas, {DEVICES:,} "
        "devices), "
        f"{IN_FLIGHT} GetPreferredAllocation calls listing every device in flight",
        f"{peak_mb:.1f} MB ({codes['OK']} served, {codes['RESOURCE_EXHAUSTED']} refused to be retried)",
        f"{idle:.1f} MB (the same daemon idle)",
        ratio(peak_mb, idle),
        f"<= {limit_mb:.0f} MiB (the DaemonSet's limit)",
        peak_mb <= limit_mb and codes["OK"] > 0,
    )
    return Result(
        "largest_config",
        {
            "replicas": REPLICAS,
            "devices": DEVICES,
            "idle_mb": round(idle, 1),
            "peak_mb": round(peak_mb, 1),
            "codes": dict(codes),
            "rounds": rounds,
            "in_flight": IN_FLIGHT,
            "daemonset_limit_mb": limit_mb,
        },
        target=f"peak RSS <= {limit_mb:.0f} MiB at the largest accepted config",
        passed=row.passed,
        rows=[row],
    )


def run(rounds: int = 2) -> Result:
    return asyncio.run(_run(rounds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help=f"rounds of {IN_FLIGHT} calls")
    args = parser.parse_args()
    interruptible()
    run(args.rounds).save()
