"""Recovery: how soon after its quiet period a GPU with a reset-class XID is Healthy again at the kubelet.

Method: `kubegpu plugin` on the fake dgx-a100 (child process) against the kubelet simulator, with a short
quiet period Q and probe interval P. For each injection (XID 48, a reset-class fault, on a GPU that is
healthy) we take the time just before injecting, wait for the kubelet to see it Unhealthy, then for the
kubelet to see it Healthy again. Lateness = Healthy seen - (injected + Q): how long recovery took beyond
the quiet period it must wait by design. Baseline, same run: the probe interval P.

Target (issue 5): Healthy within one probe interval after the quiet period: lateness p99 <= P.

    python -m bench.recovery_latency [--rounds 3] [--quiet 1.0] [--probe 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from bench.common import Result, Row, interruptible, percentile, ratio
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind
from kubegpu.node.nvml.fake_state import StateDir


async def measure(rounds: int, quiet: float, probe: float) -> list[float]:
    env = {"KUBEGPU_RECOVERY_QUIET_SECONDS": str(quiet), "KUBEGPU_HEALTH_PROBE_SECONDS": str(probe)}
    lateness: list[float] = []
    async with SimulatedNode("dgx-a100", env=env) as node:
        node.start_plugin()
        await node.wait_allocatable(8)
        state = StateDir(node.state_dir)
        index = {g["uuid"]: int(g["index"]) for g in (state.read_meta() or {}).get("gpus", [])}
        for _ in range(rounds):
            for uuid, gpu in index.items():
                # A random phase, so injections do not lock onto the daemon's probe schedule.
                await asyncio.sleep(random.uniform(0, probe))
                mark = node.sim.last_seq
                injected = time.monotonic()
                state.inject_xid(gpu, 48)
                down = await node.sim.wait_for_event(
                    EventKind.DEVICES_UPDATED,
                    resource=GPU_RESOURCE,
                    after=mark,
                    where=lambda e, u=uuid: u in e.data["unhealthy"],
                    timeout=10,
                )
                up = await node.sim.wait_for_event(
                    EventKind.DEVICES_UPDATED,
                    resource=GPU_RESOURCE,
                    after=down.seq,
                    where=lambda e, u=uuid: u not in e.data["unhealthy"],
                    timeout=quiet + 10 * probe + 10,
                )
                lateness.append(up.time - (injected + quiet))
    return lateness


def run(rounds: int, quiet: float, probe: float) -> Result:
    lateness = asyncio.run(measure(rounds, quiet, probe))
    p50, p99 = percentile(lateness, 0.5), percentile(lateness, 0.99)
    passed = p99 <= probe
    metrics = {
        "n": len(lateness),
        "quiet_s": quiet,
        "probe_interval_s": probe,
        "lateness_p50_ms": round(p50 * 1e3, 1),
        "lateness_p99_ms": round(p99 * 1e3, 1),
        "lateness_max_ms": round(max(lateness) * 1e3, 1),
    }
    row = Row(
        "Recovery: Healthy at the kubelet after the quiet period, p50 / p99",
        f"{p50 * 1e3:.0f} / {p99 * 1e3:.0f} ms",
        f"{probe * 1e3:.0f} ms (one probe interval)",
        ratio(p99, probe),
        "p99 <= one probe interval",
        passed,
    )
    return Result(
        "recovery_latency", metrics, target="p99 lateness <= probe interval", passed=passed, rows=[row]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quiet", type=float, default=1.0)
    parser.add_argument("--probe", type=float, default=0.25)
    args = parser.parse_args()
    interruptible()
    run(args.rounds, args.quiet, args.probe).save()
