"""Allocate round trip over a unix socket: kubegpu's ResourceServer vs a bare grpcio echo server.

Both servers run in child processes on unix sockets; one client in this process alternates between them in
interleaved batches so machine noise hits both alike. The echo server returns the serialized request bytes
unchanged: the floor for any grpcio unary call of that size. Target: ours p50 and p99 <= 1.25x the echo's.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bench.common import Result, short_tmpdir, spawn_ready, stop_process, summary_ms
from kubegpu.api.v1beta1 import api_pb2

ECHO_SERVER = """
import sys, grpc
from concurrent import futures
sock = sys.argv[1]
def echo(request, context):
    return request
handler = grpc.method_handlers_generic_handler(
    "v1beta1.DevicePlugin", {"Allocate": grpc.unary_unary_rpc_method_handler(echo)})
import asyncio
async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix://" + sock)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""

PLUGIN_SERVER = """
import sys, asyncio
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.builders import make_inventory
from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.plugin.server import ResourceServer
async def main():
    inv = make_inventory(8, {(0, 1): 12})
    server = ResourceServer(build_resources(inv)[0], Path(sys.argv[1]), AllocateOptions(), inv.link_map)
    await server.start()
    print(server.socket_path, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    return spawn_ready([sys.executable, "-c", code, *args])


def run(rounds: int, batch: int) -> Result:
    root = Path(__file__).resolve().parent.parent
    from tests.builders import gpu_uuid

    tmp = short_tmpdir("kg-bench-")
    echo_sock = str(tmp / "echo.sock")
    echo = plugin = None

    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(0), gpu_uuid(1)])]
    )
    payload = request.SerializeToString()
    samples: dict[str, list[float]] = {"echo": [], "kubegpu": []}
    try:
        echo, _ = _spawn(ECHO_SERVER, echo_sock)
        plugin, plugin_sock = _spawn(PLUGIN_SERVER, str(tmp), str(root))
        with (
            grpc.insecure_channel(f"unix://{echo_sock}") as echo_ch,
            grpc.insecure_channel(f"unix://{plugin_sock}") as plugin_ch,
        ):
            calls = {
                "echo": echo_ch.unary_unary("/v1beta1.DevicePlugin/Allocate"),
                "kubegpu": plugin_ch.unary_unary("/v1beta1.DevicePlugin/Allocate"),
            }
            for call in calls.values():  # warm up connections and code paths
                for _ in range(200):
                    call(payload)
            for _ in range(rounds):
                for name, call in calls.items():
                    for _ in range(batch):
                        start = time.perf_counter()
                        call(payload)
                        samples[name].append(time.perf_counter() - start)
    finally:
        stop_process(echo)
        stop_process(plugin)
        shutil.rmtree(tmp, ignore_errors=True)
    echo_s, ours = summary_ms(samples["echo"]), summary_ms(samples["kubegpu"])
    ratio_p50 = round(ours["p50_ms"] / echo_s["p50_ms"], 3)
    ratio_p99 = round(ours["p99_ms"] / echo_s["p99_ms"], 3)
    return Result(
        "allocate_latency",
        {"kubegpu": ours, "grpc_echo": echo_s, "ratio_p50": ratio_p50, "ratio_p99": ratio_p99},
        target="ratio_p50 and ratio_p99 <= 1.25",
        passed=ratio_p50 <= 1.25 and ratio_p99 <= 1.25,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=250)
    args = parser.parse_args()
    run(args.rounds, args.batch).save()
