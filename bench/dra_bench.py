"""`kubegpu dra`: NodePrepareResources round trip against a bare grpcio echo, and the driver's memory.

Method: the simulated DRA node of `kubegpu demo` (apisim, the kubelet simulator's DRA side, the driver as a
child process on the fake NVML, dgx-a100). Once the driver has registered and published, claims allocated
on gpu-0 are created in the API server, and one blocking client in this process calls the driver's dra.sock
directly, interleaved in batches with a bare grpcio echo server (a child process answering the serialized
request unchanged on the same method name: the floor for any Python gRPC call of that size):

- Prepare of a prepared claim (what the kubelet sends after it restarted): the checkpoint answers.
- Prepare of a new claim, then its Unprepare (timed apart): the claim GET from the API server through the
  driver's light client, two durable checkpoint writes and the claim's CDI spec written atomically (fsync).

RSS: the driver's, after publishing and after the calls (psutil), against a bare Python process serving a
grpc.aio server on a unix socket (as in bench/rss.py). The driver here runs on the fake NVML and reads a
kubeconfig, neither of which a driver on a real node in a pod loads (the fake, its profile reader, msgspec,
the YAML reader). Their share is measured in the same run by a probe process that walks the driver's
real-node path (the CLI, the DRA settings, the light API client on a pod's kind of access, the daemon on
the real pynvml), reads its RSS, then loads the fake NVML with the same profile and reads it again; the
real-node row is the served driver's RSS less that share. Target (issue 18): <= 1.5x the bare server on a
real node; it was 2.66x (97 MB) with the official kubernetes client.

    python -m bench.dra_bench [--rounds 10] [--batch 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import grpc
import psutil

from bench.common import (
    MB,
    Result,
    Row,
    interruptible,
    ms,
    ratio,
    short_tmpdir,
    spawn_ready,
    stop_process,
    summary_ms,
)
from bench.rss import BARE_SERVER
from kubegpu.api.dra.v1 import api_pb2 as dra
from kubegpu.demo.dranode import DRIVER, NODE, SimulatedDraNode
from kubegpu.resourceapi import reserved_status

PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
ECHO_SERVER = """
import sys, grpc, asyncio
def echo(request, context):
    return request
handler = grpc.method_handlers_generic_handler(
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    {"NodePrepareResources": grpc.unary_unary_rpc_method_handler(echo)})
async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""
TARGET_RATIO = 1.25  # the Allocate rule: ours <= 1.25x the echo
RSS_TARGET_RATIO = 1.5  # issue 18: the driver's RSS on a real node <= 1.5x a bare grpc.aio server

# The driver's path on a real node in a pod (no kubeconfig: no YAML reader), then the fake NVML on top: RSS
# (MB) after each, one per line.
REAL_PATH_PROBE = """
import os, sys
os.environ.pop("KUBEGPU_FAKE_NVML", None)
os.environ["NODE_NAME"] = "node-a"
import click, psutil
from kubegpu.cli.main import main
main.get_command(click.Context(main), "dra")
from kubegpu.dra.cli import _settings
from kubegpu.settings.given import read_given
from kubegpu.settings.setting import DRA
from kubegpu.settings.table import for_command
from kubegpu.settings.env import DaemonEnv, NvmlSelection
from kubegpu.node.health import HealthSettings
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.daemon import DraDaemon
from kubegpu.settings.kubeaccess import ApiAccess
given = read_given(for_command(DRA))
nvml = load_nvml(NvmlSelection.from_given(given, DRA))
daemon = DraDaemon(_settings(given), nvml, HealthSettings.from_settings(DaemonEnv.from_given(given)),
                   KubeClient(ApiAccess(server="https://10.96.0.1:443", insecure=True)))
assert not nvml.is_fake and "kubegpu.node.nvml.fake" not in sys.modules and "yaml" not in sys.modules
print(psutil.Process().memory_info().rss / 2**20, flush=True)
load_nvml(NvmlSelection(fake_profile=sys.argv[1]))
print(psutil.Process().memory_info().rss / 2**20, flush=True)
"""


def fake_share(profile: str) -> float:
    """What loading the fake NVML (and with it the YAML reader) adds to the driver's real-node path (MB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "KUBECONFIG"))}
    out = subprocess.run(
        [sys.executable, "-c", REAL_PATH_PROBE, profile], env=env, capture_output=True, text=True, check=True
    )
    real, with_fake = (float(line) for line in out.stdout.split())
    return with_fake - real


def claim_on_gpu0(node: SimulatedDraNode, name: str) -> dict[str, Any]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    created = node.api.create("resourceclaims", body)
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    created["status"] = reserved_status({"devices": {"results": [result]}}, "bench", "pod-uid-bench")
    return node.api.update("resourceclaims", created, status=True)


def _request(claims: list[dict[str, Any]]) -> bytes:
    refs = [
        dra.Claim(namespace="default", uid=c["metadata"]["uid"], name=c["metadata"]["name"]) for c in claims
    ]
    return dra.NodePrepareResourcesRequest(claims=refs).SerializeToString()


def _measure(node: SimulatedDraNode, echo_sock: str, rounds: int, batch: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"echo": [], "prepared": [], "new": [], "unprepare": []}
    sock = node.plugins / DRIVER / "dra.sock"
    held = claim_on_gpu0(node, "held")
    fresh = [claim_on_gpu0(node, f"new-{i}") for i in range(rounds * batch // 4)]
    with (
        grpc.insecure_channel(f"unix://{echo_sock}") as echo_ch,
        grpc.insecure_channel(f"unix://{sock}") as ch,
    ):
        echo = echo_ch.unary_unary(PREPARE)
        prepare, unprepare = ch.unary_unary(PREPARE), ch.unary_unary(UNPREPARE)
        payload = _request([held])
        answer = dra.NodePrepareResourcesResponse.FromString(prepare(payload))
        assert answer.claims[held["metadata"]["uid"]].error == "", answer
        unprepare(payload)  # gpu-0 free again for the new claims
        answer = dra.NodePrepareResourcesResponse.FromString(prepare(payload))
        for _ in range(200):  # warm up
            echo(payload)
            prepare(payload)
        unprepare(payload)
        for _ in range(rounds):
            for _ in range(batch):
                start = time.perf_counter()
                echo(payload)
                samples["echo"].append(time.perf_counter() - start)
            prepare(payload)
            for _ in range(batch):
                start = time.perf_counter()
                prepare(payload)
                samples["prepared"].append(time.perf_counter() - start)
            unprepare(payload)
            for claim in fresh[: batch // 4]:
                one = _request([claim])
                start = time.perf_counter()
                reply = dra.NodePrepareResourcesResponse.FromString(prepare(one))
                samples["new"].append(time.perf_counter() - start)
                assert reply.claims[claim["metadata"]["uid"]].error == "", reply
                start = time.perf_counter()
                unprepare(one)
                samples["unprepare"].append(time.perf_counter() - start)
            fresh = fresh[batch // 4 :]
    return samples


async def _run(rounds: int, batch: int) -> Result:
    tmp = short_tmpdir("kg-dra-bench-")
    echo = bare = None
    try:
        echo, _ = spawn_ready([sys.executable, "-c", ECHO_SERVER, str(tmp / "echo.sock")])
        bare, _ = spawn_ready([sys.executable, "-c", BARE_SERVER, str(tmp / "bare.sock")])
        async with SimulatedDraNode("dgx-a100") as node:
            node.start_driver()
            await node.wait_registered()
            await node.wait_published(8)
            await asyncio.sleep(0.5)
            assert node.driver is not None
            driver = psutil.Process(node.driver.pid)
            rss_published = driver.memory_info().rss / MB
            samples = await asyncio.to_thread(_measure, node, str(tmp / "echo.sock"), rounds, batch)
            rss_after = driver.memory_info().rss / MB
            bare_rss = psutil.Process(bare.pid).memory_info().rss / MB
        fake_mb = await asyncio.to_thread(fake_share, "dgx-a100")
    finally:
        stop_process(echo)
        stop_process(bare)
        shutil.rmtree(tmp, ignore_errors=True)
    s = {name: summary_ms(values) for name, values in samples.items()}
    p50 = ratio(s["prepared"]["p50_ms"], s["echo"]["p50_ms"])
    p99 = ratio(s["prepared"]["p99_ms"], s["echo"]["p99_ms"])
    echo_p50 = f"{ms(s['echo']['p50_ms'])} (bare grpcio echo)"
    echo_p99 = f"{ms(s['echo']['p99_ms'])} (bare grpcio echo)"
    target = f"<= {TARGET_RATIO}x baseline"
    new, gone = s["new"], s["unprepare"]
    real_rss = rss_after - fake_mb
    rss_ratio = ratio(real_rss, bare_rss)
    rows = [
        Row("DRA Prepare round trip, prepared claim, p50", ms(s["prepared"]["p50_ms"]), echo_p50, p50, target,
            p50 <= TARGET_RATIO),
        Row("DRA Prepare round trip, prepared claim, p99", ms(s["prepared"]["p99_ms"]), echo_p99, p99, target,
            p99 <= TARGET_RATIO),
        Row("DRA Prepare of a new claim (claim GET, durable checkpoint, CDI spec), p50 / p99",
            f"{ms(new['p50_ms'])} / {ms(new['p99_ms'])}", echo_p50, ratio(new["p50_ms"], s["echo"]["p50_ms"]),
            "informational", None),
        Row("DRA Unprepare, p50 / p99", f"{ms(gone['p50_ms'])} / {ms(gone['p99_ms'])}", echo_p50,
            ratio(gone["p50_ms"], s["echo"]["p50_ms"]), "informational", None),
        Row(f"DRA driver RSS after the calls, real node in a pod (fake NVML run less the fake's measured "
            f"{fake_mb:.1f} MB, YAML reader included)", f"{real_rss:.1f} MB",
            f"{bare_rss:.1f} MB (bare grpc.aio server)", rss_ratio, f"<= {RSS_TARGET_RATIO}x (2.66x before)",
            rss_ratio <= RSS_TARGET_RATIO),
        Row("DRA driver RSS after publishing (8 GPUs) / after the calls, on the fake NVML with a kubeconfig",
            f"{rss_published:.1f} / {rss_after:.1f} MB", f"{bare_rss:.1f} MB (bare grpc.aio server)",
            ratio(rss_after, bare_rss), "informational (97.0 MB, 2.66x, before)", None),
    ]  # fmt: skip
    return Result(
        "dra_bench",
        {"samples": {k: len(v) for k, v in samples.items()}, **s, "rss_published_mb": rss_published,
         "rss_after_mb": rss_after, "bare_rss_mb": bare_rss, "fake_share_mb": fake_mb,
         "real_rss_mb": real_rss, "ratio_rss_real": rss_ratio, "ratio_p50": p50, "ratio_p99": p99},
        target=f"prepared-claim ratio_p50, ratio_p99 <= {TARGET_RATIO}; real-node RSS <= {RSS_TARGET_RATIO}x",
        passed=p50 <= TARGET_RATIO and p99 <= TARGET_RATIO and rss_ratio <= RSS_TARGET_RATIO,
        rows=rows,
    )  # fmt: skip


if __name__ == "__main__":
    interruptible()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(_run(args.rounds, args.batch)).save()
