"""ResourceSlice publish time after a health change: `SlicePublisher.update()` -> the new slice in a watch.

Method: the simulated API server (`apisim`, v1, DRADeviceTaints on) in this process; a
`SlicePublisher` on its own asyncio loop in a thread, publishing an 8-GPU node with 7 MIG devices each
(64 devices with NVIDIA's attribute set, one slice); an independent watcher thread (the official client,
raw watch of all ResourceSlices) timestamps every event. Each sample toggles a taint on one GPU (what an
XID, then its recovery, does), calls `update()` and waits for the watch event with the new generation.

Baseline, same run, same server, same watcher: a bare `replace` of a slice with the same 64 devices (the
same taint toggled, generation bumped) through the publisher's own light client (`dra/kubeapi.py`), from the
call to its watch event. The ratio
shows what the publisher adds on top of one write (waking up, comparing, building the body).

Target: p50 <= 2x the baseline.

    python -m bench.slice_publish [--rounds 60]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from bench.common import Result, Row, interruptible, ms, ratio, summary_ms
from kubegpu.apisim import ApiServerSim
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.publisher import SlicePublisher
from kubegpu.settings.kubeaccess import ApiAccess

DRIVER = "gpu.nvidia.com"
BASELINE_DRIVER = "baseline.example.com"
NODE = "bench-node"
TARGET_RATIO = 2.0


def devices(tainted: int | None) -> list[dict[str, Any]]:
    """8 A100s with 7 MIG devices each, attributes as NVIDIA's driver publishes them."""
    out: list[dict[str, Any]] = []
    for g in range(8):
        uuid = f"GPU-{g:08x}-1111-2222-3333-{g:012x}"
        common = {
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "550.90.7"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 + g:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{g:02x}"},
        }
        gpu: dict[str, Any] = {
            "name": f"gpu-{g}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, **common},
            "capacity": {"memory": {"value": "40Gi"}},
        }
        migs = [
            {
                "name": f"gpu-{g}-mig-1g5gb-{m}",
                "attributes": {
                    "type": {"string": "mig"},
                    "uuid": {"string": f"MIG-{g:04x}{m:04x}-1111-2222-3333-{g:06x}{m:06x}"},
                    "parentUUID": {"string": uuid},
                    "profile": {"string": "1g.5gb"},
                    **common,
                },
                "capacity": {"memory": {"value": "4864Mi"}, "multiprocessors": {"value": "14"}},
            }
            for m in range(7)
        ]
        if g == tainted:
            taint = [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]
            gpu["taints"] = taint
            for mig in migs:
                mig["taints"] = copy.deepcopy(taint)
        out += [gpu, *migs]
    return out


class Watcher:
    """Every ResourceSlice event with the time it arrived, from a raw watch in a thread."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.cond = threading.Condition()
        self.response: Any = None
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        version = ""
        while not self.stopped:
            with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
                self.response = self.custom.list_cluster_custom_object(
                    "resource.k8s.io",
                    "v1",
                    "resourceslices",
                    watch=True,
                    resource_version=version,
                    timeout_seconds=3600,  # the server ends it sooner (apisim: 30 s): watch again from there
                    _preload_content=False,
                )
                for line in iter_resp_lines(self.response):
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    now = time.perf_counter()
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    with self.cond:
                        self.events.append((now, obj))
                        self.cond.notify_all()

    def stop(self) -> None:
        self.stopped = True
        if self.response is not None:
            self.response.shutdown()

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def wait(self, since: int, match: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, obj in self.events[since:]:
                    if match(obj):
                        return t
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the watch did not show the slice in time")
                self.cond.wait(left)


def generation_is(driver: str, generation: int) -> Callable[[dict[str, Any]], bool]:
    def match(obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") == driver and (spec.get("pool") or {}).get("generation") == generation

    return match


def run(rounds: int) -> Result:
    with ApiServerSim() as api:
        api.add_node(NODE)
        api_client = client.ApiClient(client.Configuration(host=api.url))
        watcher = Watcher(api_client)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        light = KubeClient(ApiAccess(server=api.url))
        publisher = SlicePublisher(light, driver_name=DRIVER, node_name=NODE)
        task = asyncio.run_coroutine_threadsafe(publisher.run(), loop)
        node_uid = api.get("nodes", NODE)["metadata"]["uid"]
        baseline_obj = light.request(
            "POST",
            "/apis/resource.k8s.io/v1/resourceslices",
            body={
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "generateName": f"{NODE}-{BASELINE_DRIVER}-",
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}],
                },
                "spec": {
                    "driver": BASELINE_DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices(None),
                },
            },
        )

        ours_generation = 0  # the last one the watch showed (the publisher sets its own after the write)

        def ours(tainted: int | None) -> float:
            nonlocal ours_generation
            ours_generation += 1
            since = watcher.mark()
            start = time.perf_counter()
            publisher.update(devices(tainted))
            return watcher.wait(since, generation_is(DRIVER, ours_generation)) - start

        def baseline(tainted: int | None) -> float:
            nonlocal baseline_obj
            body = copy.deepcopy(baseline_obj)
            generation = body["spec"]["pool"]["generation"] + 1
            body["spec"]["pool"]["generation"] = generation
            body["spec"]["devices"] = devices(tainted)
            since = watcher.mark()
            start = time.perf_counter()
            replaced = light.request(
                "PUT", f"/apis/resource.k8s.io/v1/resourceslices/{body['metadata']['name']}", body=body
            )
            seen = watcher.wait(since, generation_is(BASELINE_DRIVER, generation)) - start
            baseline_obj = replaced
            return seen

        for tainted in (None, 3, None):  # warm-up: first publication, the taint probe, recovery
            ours(tainted)
            baseline(tainted)
        samples: dict[str, list[float]] = {"ours": [], "baseline": []}
        for i in range(rounds):
            tainted = 3 if i % 2 == 0 else None  # an XID, then its recovery
            # alternate the order so neither side always runs right after the other's write
            pair = (
                (("ours", ours), ("baseline", baseline))
                if i % 4 < 2
                else (("baseline", baseline), ("ours", ours))
            )
            for name, measure in pair:
                samples[name].append(measure(tainted))
                time.sleep(0.005)
        asyncio.run_coroutine_threadsafe(publisher.stop(), loop).result(10)
        task.result(10)
        loop.call_soon_threadsafe(loop.stop)
        watcher.stop()
        api_client.close()
        light.close()
    mine, base = summary_ms(samples["ours"]), summary_ms(samples["baseline"])
    r50, r99 = ratio(mine["p50_ms"], base["p50_ms"]), ratio(mine["p99_ms"], base["p99_ms"])
    size = "8 GPUs x 7 MIG, 64 devices"
    return Result(
        name="slice_publish",
        metrics={
            "rounds": rounds,
            "publisher": mine,
            "bare_replace": base,
            "ratio_p50": r50,
            "ratio_p99": r99,
        },
        target=f"p50 <= {TARGET_RATIO:g}x baseline",
        passed=r50 <= TARGET_RATIO,
        rows=[
            Row(
                f"ResourceSlice publish after a health change -> seen by a watch ({size}), p50",
                ms(mine["p50_ms"]),
                f"{ms(base['p50_ms'])} (bare replace of the same slice)",
                r50,
                f"<= {TARGET_RATIO:g}x baseline",
                r50 <= TARGET_RATIO,
            ),
            Row(
                f"ResourceSlice publish after a health change -> seen by a watch ({size}), p99",
                ms(mine["p99_ms"]),
                f"{ms(base['p99_ms'])} (bare replace of the same slice)",
                r99,
                "",
                None,
            ),
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=60, help="health changes measured (each side)")
    args = parser.parse_args()
    interruptible()
    run(args.rounds).save()


if __name__ == "__main__":
    main()
