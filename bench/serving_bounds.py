"""Bounded serving: the daemon's peak memory and log volume under a hostile client of its socket.

Method: `kubegpu plugin` as a child process on the fake dgx-a100 (8 GPUs), the kubelet simulator in this
process, as in `kubegpu demo`. Once the kubelet lists the devices (and after a 0.5 s settle) the daemon's
RSS is read: the baseline. Then, on one gRPC connection, 100 Allocate calls at a time, `--rounds` times
over, for each load below, while a thread samples the daemon's RSS every 10 ms:
  - 4 MB Allocates (95,000 IDs): the fuzzer's load from issue 11, which peaked at 1.3-1.7 GB;
  - 10,000-ID Allocates (420 KB), which peaked at 246 MB;
  - the largest body the socket accepts, just under its receive limit (refused by validation);
  - the 4 MB load again over 100 connections at once, one call each;
  - 1,000 undecodable bodies (100 in flight), with the daemon's log lines counted while they run;
  - and, on a second daemon serving 8 GPUs x 500 time-sliced replicas (its receive limit grows with its
    devices, to about 1 MB), 100 calls in flight of a body just under that limit.
After the loads the kubelet must still list every device and admit a pod: nothing crashed or leaked.

Reported: peak RSS per load against the idle daemon's RSS (ratio), against the DaemonSet's memory limit
(256 MiB, from the chart's values); log lines written for 1,000 bad bodies and for the refused Allocates.
Before the limits (issue 11): 1.3-1.7 GB and 246 MB for the first two loads, and an ERROR with a 6-line
traceback per undecodable body.

    python -m bench.serving_bounds [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import yaml

from bench.common import MB, REPO_ROOT, Result, Row, interruptible, ratio
from kubegpu.api.v1beta1 import api_pb2
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod

IN_FLIGHT = 100
SETTLE_S = 0.5
SAMPLE_S = 0.01
TARGET_SHARE = 0.5  # peak RSS at most half the DaemonSet's limit: room for a GC pass, a reload, a scrape
REPLICAS = 500
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def daemonset_memory_limit_mb() -> float:
    values = yaml.safe_load((REPO_ROOT / "deployments/helm/kubegpu/values.yaml").read_text())
    limit = values["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), f"unexpected memory limit {limit!r} in the chart's values"
    return float(limit.removesuffix("Mi"))


class PeakRss:
    """The highest RSS of a process, sampled in a thread while the `with` block runs."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self._process.memory_info().rss / MB)
            except psutil.Error:
                return
            time.sleep(SAMPLE_S)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def allocate_body(ids: list[str]) -> bytes:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    ).SerializeToString()


def fake_ids(count: int, length: int = 40) -> list[str]:
    return [f"GPU-{i:0{length - 4}d}" for i in range(count)]


def body_just_under(limit: int) -> bytes:
    """An Allocate body of unknown 40-character IDs, as close under `limit` bytes as whole IDs allow."""
    count = (limit - 8) // 42
    body = allocate_body(fake_ids(count))
    while len(body) > limit:
        count -= 1
        body = allocate_body(fake_ids(count))
    return body


@dataclass
class Load:
    name: str
    body: bytes
    connections: int = 1  # 1: every call on one connection; else one call per connection, all at once


async def calls(socket: Path, load: Load, rounds: int) -> Counter[str]:
    codes: Counter[str] = Counter()
    target = f"unix://{socket}"

    async def one(call: grpc.aio.UnaryUnaryMultiCallable) -> None:
        try:
            await call(load.body, timeout=60)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as err:
            codes[err.code().name] += 1

    for _ in range(rounds):
        if load.connections == 1:
            async with grpc.aio.insecure_channel(target, options=UNLIMITED) as channel:
                call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
                await asyncio.gather(*(one(call) for _ in range(IN_FLIGHT)))
        else:
            channels = [
                grpc.aio.insecure_channel(target, options=[*UNLIMITED, ("grpc.use_local_subchannel_pool", 1)])
                for _ in range(load.connections)
            ]
            try:
                await asyncio.gather(
                    *(one(c.unary_unary("/v1beta1.DevicePlugin/Allocate")) for c in channels)
                )
            finally:
                await asyncio.gather(*(c.close() for c in channels))
    return codes


@dataclass
class Measured:
    name: str
    body_bytes: int
    peak_mb: float
    codes: dict[str, int]


async def run_loads(
    node: SimulatedNode, pid: int, loads: list[Load], rounds: int, idle: float
) -> list[Measured]:
    socket = node.plugin_dir / "nvidia-gpu.sock"
    out = []
    for load in loads:
        with PeakRss(pid) as peak:
            codes = await calls(socket, load, rounds)
        out.append(Measured(load.name, len(load.body), max(peak.peak, idle), dict(codes)))
        print(f"  {load.name}: {len(load.body):,} bytes, peak {peak.peak:.1f} MB, {dict(codes)}", flush=True)
    return out


async def still_serving(node: SimulatedNode, devices: int, name: str) -> None:
    await node.wait_allocatable(devices, timeout=10)
    pod = await node.sim.admit(Pod(name, containers=[Container("c", {GPU_RESOURCE: 1})]))
    assert len(pod.containers["c"].devices[GPU_RESOURCE]) == 1
    node.sim.remove_pod(name)


def log_lines(node: SimulatedNode) -> list[str]:
    return node.plugin_log().splitlines()


async def undecodable_flood(node: SimulatedNode, count: int) -> dict[str, int]:
    before = len(log_lines(node))
    codes = await calls(
        node.plugin_dir / "nvidia-gpu.sock", Load("undecodable", b"\xff" * 64), count // IN_FLIGHT
    )
    await asyncio.sleep(SETTLE_S)  # let the daemon flush what it logs
    new = log_lines(node)[before:]
    return {
        "bodies": count,
        "invalid_argument": codes["INVALID_ARGUMENT"],
        "log_lines": len(new),
        "warning_lines": sum(" WARNING " in line for line in new),
        "error_lines": sum(" ERROR " in line for line in new),
        "traceback_lines": sum(line.startswith("Traceback") for line in new),
    }


async def idle_rss(node: SimulatedNode, devices: int, *args: str) -> tuple[int, float]:
    proc = node.start_plugin(*args)
    await node.wait_allocatable(devices, timeout=60)
    await asyncio.sleep(SETTLE_S)
    return proc.pid, psutil.Process(proc.pid).memory_info().rss / MB


async def _run(rounds: int) -> Result:
    limit_mb = daemonset_memory_limit_mb()
    target_mb = limit_mb * TARGET_SHARE
    async with SimulatedNode("dgx-a100") as node:
        pid, idle = await idle_rss(node, 8)
        four_mb = allocate_body(fake_ids(95_000))
        loads = [
            Load("4 MB Allocates (95,000 IDs)", four_mb),
            Load("10,000-ID Allocates", allocate_body(fake_ids(10_000))),
            Load("largest accepted body (refused by validation)", body_just_under(64 * 1024)),
            Load(f"4 MB Allocates over {IN_FLIGHT} connections", four_mb, connections=IN_FLIGHT),
        ]
        measured = await run_loads(node, pid, loads, rounds, idle)
        with PeakRss(pid) as peak:
            logs = await undecodable_flood(node, 1000)
        measured.append(Measured("1,000 undecodable bodies", 64, max(peak.peak, idle), {}))
        await still_serving(node, 8, "after-hostile-load")
        if node.plugin is None or node.plugin.poll() is not None:
            raise RuntimeError(f"the plugin died under load\n{node.plugin_log()}")
        refusal_lines = sum("refusing Allocate" in line for line in log_lines(node))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "replicas.yaml"
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            f"    - name: nvidia.com/gpu\n      replicas: {REPLICAS}\n"
        )
        async with SimulatedNode("dgx-a100") as big:
            big_pid, big_idle = await idle_rss(big, 8 * REPLICAS, "--config-file", str(config))
            big_limit = _receive_limit_from_log(big.plugin_log())
            largest = Load(f"8 x {REPLICAS} replicas: largest accepted body", body_just_under(big_limit))
            (big_measured,) = await run_loads(big, big_pid, [largest], rounds, big_idle)
            await still_serving(big, 8 * REPLICAS, "after-big-load")
    worst = max(m.peak_mb for m in [*measured, big_measured])
    rows = [
        Row(
            f"Daemon peak RSS, {IN_FLIGHT} calls in flight: {m.name}",
            f"{m.peak_mb:.1f} MB",
            f"{idle:.1f} MB (the same daemon idle)",
            ratio(m.peak_mb, idle),
            f"<= {target_mb:.0f} MiB (half the DaemonSet's {limit_mb:.0f}Mi)",
            m.peak_mb <= target_mb,
        )
        for m in measured
    ]
    rows.append(
        Row(
            f"Daemon peak RSS, 8 GPUs x {REPLICAS} replicas ({big_limit // 1024} KiB limit), {IN_FLIGHT} "
            "largest accepted bodies in flight",
            f"{big_measured.peak_mb:.1f} MB",
            f"{big_idle:.1f} MB (the same daemon idle)",
            ratio(big_measured.peak_mb, big_idle),
            f"<= {target_mb:.0f} MiB",
            big_measured.peak_mb <= target_mb,
        )
    )
    quiet = logs["error_lines"] == logs["traceback_lines"] == 0 and logs["log_lines"] <= 2
    rows.append(
        Row(
            "Log lines written for 1,000 undecodable bodies",
            f"{logs['log_lines']} ({logs['warning_lines']} WARNING, {logs['error_lines']} ERROR)",
            "",
            None,
            "<= 2, no ERROR, no traceback",
            quiet,
        )
    )
    refused = sum(
        n for m in measured for code, n in m.codes.items() if code in ("INVALID_ARGUMENT", "UNKNOWN")
    )
    rows.append(
        Row(
            f"Log lines written for {refused:,} refused Allocates",
            str(refusal_lines),
            "",
            None,
            "<= 10 a minute",
            refusal_lines <= 10,
        )
    )
    return Result(
        "serving_bounds",
        {
            "idle_mb": round(idle, 1),
            "loads": [
                {"name": m.name, "body_bytes": m.body_bytes, "peak_mb": round(m.peak_mb, 1), "codes": m.codes}
                for m in [*measured, big_measured]
            ],
            "replicas_idle_mb": round(big_idle, 1),
            "replicas_receive_limit": big_limit,
            "undecodable": logs,
            "refusal_log_lines": refusal_lines,
            "refused_allocates": refused,
            "rounds": rounds,
            "in_flight": IN_FLIGHT,
            "daemonset_limit_mb": limit_mb,
            "worst_peak_mb": round(worst, 1),
        },
        target=f"peak RSS <= {target_mb:.0f} MiB under every load; bad bodies do not flood the log",
        passed=all(r.passed for r in rows),
        rows=rows,
    )


def _receive_limit_from_log(log: str) -> int:
    """The limit the daemon announced when it started serving ("requests up to N KiB")."""
    for line in log.splitlines():
        if "serving nvidia.com/gpu on" in line and "requests up to " in line:
            return int(line.split("requests up to ", 1)[1].split(" KiB", 1)[0]) * 1024
    raise RuntimeError(f"the daemon did not announce its receive limit\n{log}")


def run(rounds: int = 5) -> Result:
    return asyncio.run(_run(rounds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help=f"rounds of {IN_FLIGHT} calls per load")
    args = parser.parse_args()
    interruptible()
    run(args.rounds).save()
