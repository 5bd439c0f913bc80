"""Fault suite: the daemon against the faults nodes actually see, each scenario with its figures.

Every scenario runs `kubegpu plugin` as a child process on the fake NVML against the kubelet simulator
(`SimulatedNode`) and checks after each fault: the daemon did not crash, capacity is restored, the device
IDs are the ones from before, and no stale socket is left. It prints recovered/total and recovery time
p50/p99 per scenario.

Scenarios (counts are arguments; `--quick` runs a few of each, which CI does through
tests/contract/test_fault_suite.py):
- kubelet-restarts: the kubelet restarts (socket directory wiped) N times in a row;
- sigkills: the daemon is SIGKILLed and started again N times;
- xid-storm: XIDs at ~1,000 events/s for S seconds on one GPU, then a critical XID on another must still be
  seen promptly (the storm's XIDs are application-class, so capacity must stay);
- flaky-nvml: 30% of NVML calls on two GPUs fail for S seconds; nothing may crash or flap to unhealthy
  permanently, and a later XID is still handled;
- dir-recreated: the device-plugin directory is removed and re-created N times (kubelet reinstall);
- reload-under-load: SIGHUP every 100 ms while Allocates run; at most 1% may be refused (an unchanged
  config is applied in place, without restarting servers).
The "full disk for the features file" case belongs to `kubegpu labels` and is tested in its own tests.

    python -m bench.fault_suite [--quick] [--restarts 100] [--kills 50] [--storm-seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from bench.common import Result, Row, interruptible, percentile
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind, KubeletSimulator
from kubegpu.node.nvml.fake_state import StateDir

GPUS = 8


@dataclass
class Outcome:
    name: str
    total: int = 0
    recovered: int = 0
    times_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def ok(self, seconds: float) -> None:
        self.recovered += 1
        self.times_s.append(seconds)

    @property
    def passed(self) -> bool:
        return self.total > 0 and self.recovered == self.total and not self.notes

    def row(self) -> Row:
        p50 = percentile(self.times_s, 0.5) * 1e3 if self.times_s else float("nan")
        p99 = percentile(self.times_s, 0.99) * 1e3 if self.times_s else float("nan")
        value = f"{self.recovered}/{self.total} recovered, p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        if self.notes:
            value += "; " + "; ".join(self.notes[:3])
        return Row(f"Fault: {self.name}", value, target="all recovered, nothing crashed", passed=self.passed)


async def _check_node(node: SimulatedNode, ids: set[str], outcome: Outcome, healthy: int = GPUS) -> None:
    if node.plugin is None or node.plugin.poll() is not None:
        outcome.notes.append("daemon exited")
    if set(node.sim.devices(GPU_RESOURCE)) != ids:
        outcome.notes.append("device IDs changed")
    if node.plugin_sockets() != ["nvidia-gpu.sock"]:
        outcome.notes.append(f"sockets {node.plugin_sockets()}")
    if node.sim.allocatable().get(GPU_RESOURCE) != healthy:
        outcome.notes.append(f"allocatable {node.sim.allocatable().get(GPU_RESOURCE)}")


async def _started(node: SimulatedNode) -> set[str]:
    node.start_plugin()
    await node.wait_allocatable(GPUS)
    return set(node.sim.devices(GPU_RESOURCE))


async def kubelet_restarts(count: int) -> Outcome:
    outcome = Outcome("kubelet restarts", total=count)
    async with SimulatedNode() as node:
        ids = await _started(node)
        for _ in range(count):
            mark, start = node.sim.last_seq, time.monotonic()
            await node.sim.restart()
            try:
                event = await node.sim.wait_for_event(
                    EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=mark, timeout=10
                )
            except TimeoutError:
                outcome.notes.append("not re-registered within 10 s")
                continue
            outcome.ok(event.time - start)
        await _check_node(node, ids, outcome)
    return outcome


async def sigkills(count: int) -> Outcome:
    outcome = Outcome("daemon SIGKILLed and restarted", total=count)
    async with SimulatedNode() as node:
        ids = await _started(node)
        for _ in range(count):
            await node.stop_plugin(signal.SIGKILL)
            start = time.monotonic()
            node.start_plugin()
            try:
                await node.wait_allocatable(GPUS, timeout=20)
            except TimeoutError:
                outcome.notes.append("not back within 20 s")
                continue
            outcome.ok(time.monotonic() - start)
            if set(node.sim.devices(GPU_RESOURCE)) != ids or node.plugin_sockets() != ["nvidia-gpu.sock"]:
                outcome.notes.append("IDs or sockets differ after a restart")
        await _check_node(node, ids, outcome)
    return outcome


async def xid_storm(seconds: float, rate: int = 1000) -> Outcome:
    outcome = Outcome(f"XID storm ({rate}/s for {seconds:g} s)", total=1)
    async with SimulatedNode() as node:
        ids = await _started(node)
        state = StateDir(node.state_dir)
        stop = threading.Event()

        def storm() -> None:
            sent, start = 0, time.monotonic()
            while not stop.is_set() and time.monotonic() - start < seconds:
                state.inject_xid(0, 13)  # application-class: must not take GPU 0 out
                sent += 1
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)

        thread = threading.Thread(target=storm, daemon=True)
        thread.start()
        await asyncio.sleep(seconds / 2)
        mark, start = node.sim.last_seq, time.monotonic()
        state.inject_xid(5, 48)  # in the middle of the storm, a real fault on another GPU
        try:
            event = await node.sim.wait_for_event(
                EventKind.DEVICES_UPDATED,
                resource=GPU_RESOURCE,
                after=mark,
                where=lambda e: len(e.data["unhealthy"]) == 1,
                timeout=10,
            )
            outcome.ok(event.time - start)
        except TimeoutError:
            outcome.notes.append("critical XID during the storm not seen within 10 s")
        await asyncio.to_thread(thread.join)
        stop.set()
        await _check_node(node, ids, outcome, healthy=GPUS - 1)
    return outcome


async def flaky_nvml(seconds: float) -> Outcome:
    env = {"KUBEGPU_RECOVERY_QUIET_SECONDS": "0.5", "KUBEGPU_HEALTH_PROBE_SECONDS": "0.1"}
    outcome = Outcome(f"flaky NVML (30% of calls on 2 GPUs fail, {seconds:g} s)", total=1)
    async with SimulatedNode(env=env) as node:
        ids = await _started(node)
        state = StateDir(node.state_dir)
        for gpu in (2, 3):
            state.inject_flaky(gpu, 0.3)
        await asyncio.sleep(seconds)
        for gpu in (2, 3):
            state.recover(gpu)
        start = time.monotonic()
        try:
            await node.wait_allocatable(GPUS, timeout=10)  # whatever flapped is back
            outcome.ok(time.monotonic() - start)
        except TimeoutError:
            outcome.notes.append("capacity not restored after the flakiness stopped")
        await _check_node(node, ids, outcome)
    return outcome


async def dir_recreated(count: int) -> Outcome:
    outcome = Outcome("device-plugin dir removed and re-created", total=count)
    async with SimulatedNode() as node:
        ids = await _started(node)
        for _ in range(count):
            await node.sim.stop()
            shutil.rmtree(node.plugin_dir)
            await asyncio.sleep(0.05)
            start = time.monotonic()
            node.sim = KubeletSimulator(node.plugin_dir)  # a reinstalled kubelet re-creates the directory
            await node.sim.start()
            try:
                await node.wait_allocatable(GPUS, timeout=10)
                outcome.ok(time.monotonic() - start)
            except TimeoutError:
                outcome.notes.append("not re-registered within 10 s")
        await _check_node(node, ids, outcome)
    return outcome


async def reload_under_load(seconds: float) -> Outcome:
    outcome = Outcome(f"SIGHUP every 100 ms under Allocate load ({seconds:g} s)", total=1)
    async with SimulatedNode() as node:
        config = node.root / "config.yaml"
        config.write_text("version: v1\n")
        node.start_plugin("--config-file", str(config))
        await node.wait_allocatable(GPUS)
        ids = sorted(node.sim.devices(GPU_RESOURCE))
        calls = errors = 0
        done = threading.Event()

        def load() -> None:
            nonlocal calls, errors
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids[:2])]
            )
            while not done.is_set():
                # A reload restarts the server, so connect afresh after an error, as the kubelet would.
                with grpc.insecure_channel(f"unix://{node.plugin_dir / 'nvidia-gpu.sock'}") as channel:
                    stub = api_pb2_grpc.DevicePluginStub(channel)
                    while not done.is_set():
                        calls += 1
                        try:
                            stub.Allocate(request, timeout=2)
                        except grpc.RpcError:
                            errors += 1
                            time.sleep(0.01)
                            break

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            node.signal_plugin(signal.SIGHUP)
            await asyncio.sleep(0.1)
        done.set()
        await asyncio.to_thread(thread.join)
        start = time.monotonic()
        try:
            await node.wait_allocatable(GPUS, timeout=10)
            outcome.ok(time.monotonic() - start)
        except TimeoutError:
            outcome.notes.append("capacity not back after the reloads")
        outcome.notes.extend([] if calls else ["no Allocate calls were made"])
        await _check_node(node, set(ids), outcome)
        rate = errors / calls if calls else 1.0
        outcome.name += f", {calls} Allocates, {errors} refused ({rate:.1%})"
        if rate > 0.01:  # an unchanged config is applied in place: Allocates must keep working
            outcome.notes.append(f"{rate:.1%} of Allocates refused during reloads")
    return outcome


SCENARIOS: dict[str, Callable[[argparse.Namespace], object]] = {
    "kubelet-restarts": lambda a: kubelet_restarts(a.restarts),
    "sigkills": lambda a: sigkills(a.kills),
    "xid-storm": lambda a: xid_storm(a.storm_seconds),
    "flaky-nvml": lambda a: flaky_nvml(a.storm_seconds),
    "dir-recreated": lambda a: dir_recreated(a.recreates),
    "reload-under-load": lambda a: reload_under_load(a.storm_seconds),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few of each: what CI runs")
    parser.add_argument("--restarts", type=int, default=100)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--recreates", type=int, default=10)
    parser.add_argument("--storm-seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args(argv)
    if args.quick:
        args.restarts, args.kills, args.recreates, args.storm_seconds = 5, 2, 2, 1.0
    return args


def run(args: argparse.Namespace) -> Result:
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    outcomes: list[Outcome] = []
    for name, scenario in SCENARIOS.items():
        if args.only and name not in args.only:
            continue
        outcome = asyncio.run(scenario(args))  # type: ignore[arg-type]
        print(outcome.row().metric, "->", outcome.row().value, flush=True)
        outcomes.append(outcome)
    metrics = {
        o.name: {
            "recovered": o.recovered,
            "total": o.total,
            "times_ms": [round(t * 1e3, 2) for t in o.times_s],
        }
        for o in outcomes
    }
    return Result(
        "fault_suite",
        metrics,
        target="every fault recovered, nothing crashed",
        passed=all(o.passed for o in outcomes),
        rows=[o.row() for o in outcomes],
    )


if __name__ == "__main__":
    interruptible()
    run(parse_args()).save()
