"""Benchmark: `kubegpu explain` for a pod with a DRA claim on a generated cluster of GPU nodes with
ResourceSlices, against `kubegpu explain` for a device-plugin GPU pod on the same snapshot.

Method: N nodes (default 1,000) with 8 GPUs each, published as one ResourceSlice per node with NVIDIA's
attribute set (the same GPU model everywhere, as real clusters are); NVIDIA's DeviceClass; a pending pod
whose claim template asks for a GPU with at least 40 GiB (no node has one, so every node's every device is
judged: the worst case), and a pending pod that asks for 16 `nvidia.com/gpu` (no node has that many). Each
explain runs in its own child process through the CLI command, as a user runs it, timed from the call to
its end (the snapshot is read in both). Best of 3 runs each.

Baseline, same run, same snapshot: the device-plugin pod. The ratio is what the DynamicResources filter
(CEL on every device, the allocator on every node) adds on top of reading the snapshot and the other
filters.

Target: <= 4x the baseline.

    python -m bench.dra_explain_bench [--nodes 1000]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import subprocess
import tempfile
from typing import Any

from bench.common import Result, Row, interruptible, ratio

TARGET_RATIO = 4.0
RUNS = 3
DRIVER = "gpu.nvidia.com"
GPU_CLASS = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
BIG_GPU = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'


def _gpu(node: int, minor: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{node:08x}-{minor:04x}-0000-0000-000000000000"},
            "productName": {"string": "Tesla T4"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Turing"},
            "cudaComputeCapability": {"version": "7.5.0"},
            "driverVersion": {"version": "550.90.7"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 1:02x}:00.0"},
        },
        "capacity": {"memory": {"value": "15Gi"}},
    }


def snapshot(nodes: int) -> bytes:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    items: list[dict[str, Any]] = []
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                "status": {
                    "allocatable": resources,
                    "capacity": resources,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
        items.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{name}-{DRIVER}-x"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "nodeName": name,
                    "devices": [_gpu(i, m) for m in range(8)],
                },
            }
        )
    items.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": GPU_CLASS}}]},
        }
    )
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": BIG_GPU}}]},
    }
    items.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "big-gpu", "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }
    )
    for name, spec in (
        ("dra", {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "big-gpu"}],
                 "containers": [{"name": "c", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}]}),
        ("plugin", {"containers": [{"name": "c", "image": "cuda",
                                    "resources": {"limits": {"nvidia.com/gpu": "16"}}}]}),
    ):  # fmt: skip
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": spec,
                "status": {"phase": "Pending"},
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}).encode()


CHILD = r"""
import contextlib, json, os, sys, time
from kubegpu.toolkit.cli import explain
path, pod = sys.argv[1], sys.argv[2]
start = time.perf_counter()
with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
    try:
        explain.main([pod, "--snapshot", path, "--json"], standalone_mode=False)
    except SystemExit as exit:
        if exit.code not in (0, 1):
            raise
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def timed(path: Path, pod: str) -> float:
    best = float("inf")
    for _ in range(RUNS):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), pod],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        best = min(best, float(json.loads(out.stdout.splitlines()[-1])["seconds"]))
    return best


def run(nodes: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="kg-dra-explain-") as tmp:
        path = Path(tmp) / "snapshot.json"
        path.write_bytes(snapshot(nodes))
        dra = timed(path, "ml/dra")
        plugin = timed(path, "ml/plugin")
    r = ratio(dra, plugin)
    size = f"{nodes:,} nodes x 8 GPUs in ResourceSlices"
    return Result(
        name="dra_explain_bench",
        metrics={"nodes": nodes, "dra_seconds": dra, "plugin_seconds": plugin, "ratio": r},
        target=f"<= {TARGET_RATIO:g}x baseline",
        passed=r <= TARGET_RATIO,
        rows=[
            Row(
                f"kubegpu explain, pod with a DRA claim no node satisfies ({size}): time",
                f"{dra:.2f} s",
                f"{plugin:.2f} s (explain of a device-plugin pod, same snapshot)",
                r,
                f"<= {TARGET_RATIO:g}x baseline",
                r <= TARGET_RATIO,
            )
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="GPU nodes in the generated cluster")
    args = parser.parse_args()
    interruptible()
    run(args.nodes).save()


if __name__ == "__main__":
    main()
