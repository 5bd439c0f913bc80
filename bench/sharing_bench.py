"""Sharing and MIG at scale: config load + resource build, ListAndWatch message size, daemon RSS.

Method:
- Build time: `resolve()` of a config file + `build_resources()` for 8 GPUs x 48 time-slicing replicas
  (384 devices) and for 8 GPUs x 7 MIG devices under `mixed` (56 devices), median of N runs each, against
  the same work for the same 8 GPUs without sharing or MIG, measured interleaved in the same run.
- Message size: the serialized ListAndWatchResponse for those resources against the kubelet's default 4 MiB
  gRPC receive limit (target: far below it).
- RSS: `kubegpu plugin` on the fake hgx-h100 with 48 replicas per GPU, against the same daemon without
  sharing, both read once the kubelet simulator lists their devices.

    python -m bench.sharing_bench [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from bench.common import MB, Result, Row, interruptible, ratio
from kubegpu.allocation.from_settings import resource_options
from kubegpu.allocation.resources import build_resources
from kubegpu.demo.simnode import SimulatedNode
from kubegpu.node.inventory import Inventory, MigDevice
from kubegpu.plugin.server import device_list
from kubegpu.settings.plugin import resolve
from tests.builders import make_inventory
from tests.settings.test_plugin_settings import defaults

KUBELET_LIMIT = 4 * 1024 * 1024
REPLICAS = 48
CONFIG = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    f"    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
)


def mig_inventory(gpus: int = 8, per_gpu: int = 7) -> Inventory:
    base = make_inventory(gpus)
    migged = tuple(
        dataclasses.replace(
            g,
            mig_enabled=True,
            mig_capable=True,
            mig_devices=tuple(
                MigDevice(f"MIG-{g.index:08x}-0000-4000-8000-{m:012x}", m, 7 + m, 0, "1g.5gb", 5 << 30)
                for m in range(per_gpu)
            ),
        )
        for g in base.gpus
    )
    return dataclasses.replace(base, gpus=migged)


def timed(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def daemon_rss(config: Path | None) -> tuple[float, int]:
    args = ["--config-file", str(config)] if config else []
    async with SimulatedNode("hgx-h100", plugin_args=args) as node:
        node.start_plugin()
        await node.wait_allocatable(8 * (REPLICAS if config else 1))
        await asyncio.sleep(0.5)
        assert node.plugin is not None
        return psutil.Process(node.plugin.pid).memory_info().rss / MB, len(node.sim.devices("nvidia.com/gpu"))


def run(runs: int) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix="kg-share-"))
    config = tmp / "ts.yaml"
    config.write_text(CONFIG)
    plain = tmp / "plain.yaml"
    plain.write_text("version: v1\n")
    gpus, migs = make_inventory(8), mig_inventory()

    def shared() -> None:
        build_resources(gpus, resource_options(resolve(defaults(config_file=str(config)))))

    def mig() -> None:
        build_resources(
            migs, resource_options(resolve(defaults(config_file=str(plain), mig_strategy="mixed")))
        )

    def baseline() -> None:
        build_resources(gpus, resource_options(resolve(defaults(config_file=str(plain)))))

    for fn in (shared, mig, baseline):  # warm up imports and caches
        fn()
    t_shared, t_mig, t_base = (timed(fn, runs) for fn in (shared, mig, baseline))
    (replicated,) = build_resources(gpus, resource_options(resolve(defaults(config_file=str(config)))))
    mig_resources = build_resources(migs, resource_options(resolve(defaults(mig_strategy="mixed"))))
    size_shared = device_list(replicated).ByteSize()
    size_mig = max(device_list(r).ByteSize() for r in mig_resources)
    rss_shared, devices = asyncio.run(daemon_rss(config))
    rss_plain, _ = asyncio.run(daemon_rss(None))
    metrics = {
        "build_shared_ms": round(t_shared * 1e3, 3),
        "build_mig_ms": round(t_mig * 1e3, 3),
        "build_baseline_ms": round(t_base * 1e3, 3),
        "listandwatch_bytes_384": size_shared,
        "listandwatch_bytes_mig": size_mig,
        "rss_shared_mb": round(rss_shared, 1),
        "rss_plain_mb": round(rss_plain, 1),
        "devices_seen_by_kubelet": devices,
    }
    rows = [
        Row("Config load + build, 8 GPUs x 48 replicas", f"{t_shared * 1e3:.2f} ms",
            f"{t_base * 1e3:.2f} ms (8 GPUs, no sharing)", ratio(t_shared, t_base)),
        Row("Config load + build, 8 x 7 MIG (mixed)", f"{t_mig * 1e3:.2f} ms",
            f"{t_base * 1e3:.2f} ms (8 GPUs, no MIG)", ratio(t_mig, t_base)),
        Row("ListAndWatch message, 384 replicas", f"{size_shared / 1024:.1f} KiB", "4096 KiB (kubelet limit)",
            ratio(size_shared, KUBELET_LIMIT), "far below 4 MiB", size_shared < KUBELET_LIMIT / 50),
        Row("Daemon RSS with 384 replicas", f"{rss_shared:.1f} MB", f"{rss_plain:.1f} MB (8 unshared GPUs)",
            ratio(rss_shared, rss_plain), "no more than a few MB above unshared", rss_shared - rss_plain < 5),
    ]  # fmt: skip
    return Result(
        "sharing_bench", metrics, target="message far below 4 MiB; RSS flat in device count", rows=rows
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    interruptible()
    run(args.runs).save()
