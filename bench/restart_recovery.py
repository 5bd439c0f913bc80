"""Kubelet restart -> the plugin registered again with its devices listed at the kubelet.

Method: one kubelet simulator in this process, the plugin in a child process on the fake NVML, exactly as
in `kubegpu demo`. Each round calls `sim.restart()` (the kubelet stops, wipes the device-plugin directory
but for its checkpoint and serves a new kubelet.sock) and waits for the first DEVICES_UPDATED of the
resource after it (the kubelet processed the first ListAndWatch message of the new registration). The
latency runs from just before `restart()` to that event's timestamp; `kubelet_up_to_listed` also reports
the plugin's share alone (from the KUBELET_STARTED event on). Between rounds the benchmark waits until the
node is back to full allocatable, then a random 50-70 ms, so the rounds do not overlap and a poller's phase
is random.

Baselines, same run and same simulator, advertising the same resource and device IDs:
- the bare event-driven plugin: grpc.aio with the committed stubs and inotify on the directory, and nothing
  else; when its socket is deleted it serves again and registers at once. This is the floor of the path
  (restart, the Register round trip with the kubelet's dial-back, the first ListAndWatch send) for a
  Python plugin; the ratio is what our path adds to it.
- a naive plugin that checks every 20 ms whether its socket still exists and, when it is gone, serves
  again and re-registers, retrying every 20 ms until the kubelet answers.
The plugins take turns in blocks (`--blocks`), so machine noise hits all alike.

Targets: median <= 50 ms (issue 2); issue 13 asks for <= 8 ms, which depends on the machine: the
ratio to the bare plugin is the number to compare.

    python -m bench.restart_recovery [--restarts 50] [--blocks 2] [--profile dgx-a100]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import time

from bench.common import REPO_ROOT, Result, Row, interruptible, ms, ratio, stop_process, summary_ms
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind

TARGET_MEDIAN_MS = 50.0
WARM_UP = 2  # unmeasured restarts each time a plugin takes its turn

# What both baseline plugins share: the servicer, serving on their socket, one Register attempt.
PLUGIN_COMMON = r"""
import asyncio, os, sys
import grpc
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc

plugin_dir, resource, ids = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
SOCKET = os.path.join(plugin_dir, ENDPOINT)
KUBELET = os.path.join(plugin_dir, "kubelet.sock")
LIST = api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health="Healthy") for i in ids])


class Plugin(api_pb2_grpc.DevicePluginServicer):
    async def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(self, request, context):
        yield LIST
        await asyncio.Event().wait()


async def serve():
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(Plugin(), server)
    server.add_insecure_port("unix://" + SOCKET)
    await server.start()
    return server


async def register():
    request = api_pb2.RegisterRequest(version="v1beta1", endpoint=ENDPOINT, resource_name=resource,
                                      options=api_pb2.DevicePluginOptions())
    try:
        async with grpc.aio.insecure_channel("unix://" + KUBELET) as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)
        return True
    except grpc.aio.AioRpcError:
        return False
"""

NAIVE_PLUGIN = (
    'ENDPOINT = "naive.sock"\n'
    + PLUGIN_COMMON
    + r"""
POLL_S = 0.02


async def main():
    server = None
    while True:
        if server is None or not os.path.exists(SOCKET):
            if server is not None:
                await server.stop(None)
            server = await serve()
            while not await register():
                await asyncio.sleep(POLL_S)
        await asyncio.sleep(POLL_S)


asyncio.run(main())
"""
)

BARE_PLUGIN = (
    'ENDPOINT = "bare.sock"\n'
    + PLUGIN_COMMON
    + r"""
from asyncinotify import Inotify, Mask


async def main():
    with Inotify() as inotify:
        inotify.add_watch(plugin_dir, Mask.CREATE | Mask.DELETE)
        server = await serve()
        pending = not await register()
        events = aiter(inotify)
        while True:
            try:
                await asyncio.wait_for(anext(events), 0.02 if pending else None)
            except TimeoutError:
                pass
            if not os.path.exists(SOCKET):  # the kubelet wiped it: serve again, then register
                await server.stop(None)
                server = await serve()
                pending = True
            if pending and os.path.exists(KUBELET):
                pending = not await register()


asyncio.run(main())
"""
)


class Contender:
    """Starts and stops one of the two plugins on the node."""

    def __init__(self, name: str, node: SimulatedNode, device_ids: list[str]) -> None:
        self.name = name
        self.node = node
        self.device_ids = device_ids
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        if self.name == "kubegpu":
            self.node.start_plugin()
        else:
            self.proc = self._spawn(NAIVE_PLUGIN if self.name == "naive" else BARE_PLUGIN)
        await wait_listed(self.node, len(self.device_ids))

    def _spawn(self, code: str) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable,
            "-c",
            code,
            str(self.node.plugin_dir),
            GPU_RESOURCE,
            ",".join(self.device_ids),
        ]
        with open(self.node.root / f"{self.name}.log", "ab") as log:
            return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)

    async def stop(self) -> None:
        if self.name == "kubegpu":
            await self.node.stop_plugin()
        else:
            proc, self.proc = self.proc, None
            await asyncio.to_thread(stop_process, proc)


async def wait_listed(node: SimulatedNode, count: int, timeout: float = 20.0) -> None:
    await node.sim.wait_for(
        lambda: (
            node.sim.registered(GPU_RESOURCE)
            and sum(d.health == "Healthy" for d in node.sim.devices(GPU_RESOURCE).values()) == count
        ),
        timeout=timeout,
    )


async def measure_restarts(node: SimulatedNode, rounds: int, count: int) -> tuple[list[float], list[float]]:
    """(restart() called -> devices listed, kubelet serving -> devices listed) per round, in seconds.

    Two unmeasured restarts first: a plugin's first ones run code paths for the first time."""
    total, share = [], []
    for done in range(rounds + WARM_UP):
        await asyncio.sleep(0.05 + random.uniform(0, 0.02))
        mark = node.sim.last_seq
        started = time.monotonic()
        await node.sim.restart()
        listed = await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=mark, timeout=10
        )
        up = node.sim.events(EventKind.KUBELET_STARTED, after=mark)[0]
        if done >= WARM_UP:
            total.append(listed.time - started)
            share.append(listed.time - up.time)
        await wait_listed(node, count)
    return total, share


async def _run(restarts: int, blocks: int, profile: str) -> Result:
    names = ("kubegpu", "bare", "naive")
    samples: dict[str, list[float]] = {n: [] for n in names}
    shares: dict[str, list[float]] = {n: [] for n in names}
    async with SimulatedNode(profile) as node:
        contenders: list[Contender] = []
        try:
            node.start_plugin()
            await node.sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, timeout=20)
            device_ids = sorted(node.sim.devices(GPU_RESOURCE))
            contenders = [Contender(n, node, device_ids) for n in names]
            await wait_listed(node, len(device_ids))
            running: Contender | None = contenders[0]
            sizes = [restarts // blocks + (1 if b < restarts % blocks else 0) for b in range(blocks)]
            for size in sizes:
                for contender in contenders:
                    if running is not contender:
                        if running is not None:
                            await running.stop()
                        running = None
                        await contender.start()
                        running = contender
                    total, share = await measure_restarts(node, size, len(device_ids))
                    samples[contender.name] += total
                    shares[contender.name] += share
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n--- plugin log ---\n{node.plugin_log()}") from None
        finally:
            for contender in contenders[1:]:
                await contender.stop()
    ours_s, bare_s, naive_s = (summary_ms(samples[n]) for n in names)
    ours_up, bare_up = summary_ms(shares["kubegpu"]), summary_ms(shares["bare"])
    r50 = ratio(ours_s["p50_ms"], bare_s["p50_ms"])
    r99 = ratio(ours_s["p99_ms"], bare_s["p99_ms"])
    passed = ours_s["p50_ms"] <= TARGET_MEDIAN_MS
    target = f"median <= {TARGET_MEDIAN_MS:g} ms"
    return Result(
        "restart_recovery",
        {
            "kubegpu": ours_s,
            "bare_event_driven_plugin": bare_s,
            "naive_20ms_poller": naive_s,
            "ratio_p50": r50,
            "ratio_p99": r99,
            "ratio_p50_vs_naive": ratio(ours_s["p50_ms"], naive_s["p50_ms"]),
            "kubegpu_kubelet_up_to_listed": ours_up,
            "bare_kubelet_up_to_listed": bare_up,
            "naive_kubelet_up_to_listed": summary_ms(shares["naive"]),
            "profile": profile,
        },
        target=target,
        passed=passed,
        rows=[
            Row(
                "Kubelet restart -> devices listed, p50",
                ms(ours_s["p50_ms"]),
                f"{ms(bare_s['p50_ms'])} (bare event-driven plugin); "
                f"naive 20 ms poller {ms(naive_s['p50_ms'])}",
                r50,
                target,
                passed,
            ),
            Row(
                "Kubelet restart -> devices listed, p99 / max",
                f"{ms(ours_s['p99_ms'])} / {ms(ours_s['max_ms'])}",
                f"{ms(bare_s['p99_ms'])} / {ms(bare_s['max_ms'])} (bare event-driven plugin)",
                r99,
            ),
            Row(
                "Kubelet serving -> devices listed (the plugin's share), p50",
                ms(ours_up["p50_ms"]),
                f"{ms(bare_up['p50_ms'])} (bare event-driven plugin)",
                ratio(ours_up["p50_ms"], bare_up["p50_ms"]),
            ),
        ],
    )


def run(restarts: int = 50, blocks: int = 2, profile: str = "dgx-a100") -> Result:
    return asyncio.run(_run(restarts, max(1, min(blocks, restarts)), profile))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--restarts", type=int, default=50, help="kubelet restarts per plugin")
    parser.add_argument("--blocks", type=int, default=2, help="alternate the two plugins this many times")
    parser.add_argument("--profile", default="dgx-a100", help="fake NVML profile")
    args = parser.parse_args()
    interruptible()
    run(args.restarts, args.blocks, args.profile).save()
