"""XID injected -> Unhealthy on the DRA driver's health stream, as the kubelet reads it.

Method: `kubegpu dra` as a child process on the fake NVML, the kubelet simulator (v1.36: the health stream
on) and the simulated API server in this process (`SimulatedDraNode`, as the contract tests use it). Each
sample takes a timestamp, injects an XID into one GPU through the fake's state directory (what
`kubegpu fake-nvml inject` does) and waits for the kubelet's first processed NodeWatchResources message
(DRA_HEALTH_UPDATED) that has that GPU's device Unhealthy; the latency is that event's time minus the one
taken before the injection. Per driver lifetime the last GPU is spent on a warm-up injection (retried until
it shows: the health thread is armed), then GPUs 0 .. n-2 are measured once each; then the driver restarts.

Baseline, same run: the device plugin's XID -> ListAndWatch update at the kubelet (`bench.xid_latency`'s
method, on the same profile and XID), so the ratio is what the DRA path costs against the device-plugin
path for the same event.

    python -m bench.dra_health_latency [--injections 35] [--xid 48] [--profile dgx-a100]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from bench.common import Result, interruptible, latency_rows, ratio, summary_ms
from bench.xid_latency import _run as device_plugin_run
from kubegpu.demo.dranode import SimulatedDraNode
from kubegpu.kubeletsim import EventKind
from kubegpu.node.nvml.fake_state import StateDir

TARGET_P99_MS = 50.0  # the device plugin's own target for the same path
WARMUP_RETRY_S = 0.25


async def _unhealthy(node: SimulatedDraNode, device: str, after: int, timeout: float) -> float:
    assert node.sim is not None
    event = await node.sim.wait_for_event(
        EventKind.DRA_HEALTH_UPDATED,
        after=after,
        where=lambda e: any(d[1] == device and d[2] == "Unhealthy" for d in e.data["changed"]),
        timeout=timeout,
    )
    return event.time


async def _warm_up(node: SimulatedDraNode, state: StateDir, gpu: int, device: str, xid: int) -> None:
    assert node.sim is not None
    deadline = time.monotonic() + 30
    while True:
        mark = node.sim.last_seq
        state.inject_xid(gpu, xid)
        try:
            await _unhealthy(node, device, mark, WARMUP_RETRY_S)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{device} never became unhealthy\n--- driver log ---\n{node.log()}"
                ) from None


async def _dra_samples(injections: int, xid: int, profile: str) -> tuple[list[float], int]:
    samples: list[float] = []
    lifetimes = 0
    async with SimulatedDraNode(profile, kubelet="1.36", health_retry_period=0.2) as node:
        assert node.sim is not None
        state = StateDir(node.root / "nvml").create()
        while len(samples) < injections:
            node.start_driver()
            lifetimes += 1
            await node.wait_registered()
            meta = state.read_meta()
            assert meta is not None
            gpus = len(meta["gpus"])
            await node.wait_published(gpus)
            by_uuid = {d["attributes"]["uuid"]["string"]: name for name, d in node.published().items()}
            names = [by_uuid[g["uuid"]] for g in meta["gpus"]]  # NVML index -> the device's published name
            warm = gpus - 1
            await _warm_up(node, state, warm, names[warm], xid)
            for gpu in range(min(warm, injections - len(samples))):
                await asyncio.sleep(random.uniform(0.005, 0.02))
                mark = node.sim.last_seq
                started = time.monotonic()
                state.inject_xid(gpu, xid)
                try:
                    seen = await _unhealthy(node, names[gpu], mark, 10)
                except TimeoutError as err:
                    raise TimeoutError(f"{err}\n--- driver log ---\n{node.log()}") from None
                samples.append(seen - started)
            await node.stop_driver()
    return samples, lifetimes


async def _run(injections: int, xid: int, profile: str) -> Result:
    ours, lifetimes = await _dra_samples(injections, xid, profile)
    baseline = await device_plugin_run(injections, xid, profile)
    base_s = baseline.metrics["kubegpu"]
    assert isinstance(base_s, dict)
    ours_s = summary_ms(ours)
    r50, r99 = ratio(ours_s["p50_ms"], base_s["p50_ms"]), ratio(ours_s["p99_ms"], base_s["p99_ms"])
    target = f"p99 <= {TARGET_P99_MS:g} ms"
    passed = ours_s["p99_ms"] <= TARGET_P99_MS
    return Result(
        "dra_health_latency",
        {
            "kubegpu_dra": ours_s,
            "device_plugin": base_s,
            "ratio_p50": r50,
            "ratio_p99": r99,
            "xid": xid,
            "profile": profile,
            "driver_lifetimes": lifetimes,
        },
        target=target,
        passed=passed,
        rows=latency_rows(
            "DRA: XID -> Unhealthy on the kubelet's health stream",
            ours_s,
            base_s,
            ("device plugin: XID -> ListAndWatch update", "device plugin, same path"),
            target,
            passed,
        ),
    )


def run(injections: int = 35, xid: int = 48, profile: str = "dgx-a100") -> Result:
    return asyncio.run(_run(injections, xid, profile))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--injections", type=int, default=35, help="measured XID injections (each path)")
    parser.add_argument("--xid", type=int, default=48, help="a critical XID (48: double-bit ECC error)")
    parser.add_argument("--profile", default="dgx-a100", help="fake NVML profile (2 or more GPUs)")
    args = parser.parse_args()
    interruptible()
    run(args.injections, args.xid, args.profile).save()
