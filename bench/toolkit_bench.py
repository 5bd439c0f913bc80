"""Benchmark: `kubegpu explain` and `kubegpu doctor --cluster` on a generated 5,000-node, 100,000-pod
snapshot, against simply parsing the same snapshot with `json.loads` in the same run.

Each measurement runs in its own fresh process, so peak memory (ru_maxrss) is that task's alone; time is
measured inside the process around the work (reading the file included, interpreter start excluded).
Targets: <= 2 s and <= 500 MB for each tool.

    python -m bench.toolkit_bench [--nodes 5000] [--pods 100000] [--json]

The generated snapshot is cached in bench/results/. Results go to bench/results/toolkit_bench.json as
the other benchmarks' (rows for the README table), so `bench/run_all.py` can list it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import os
import random
import subprocess
import zlib
from typing import Any

from bench.common import Result, Row
from tests.fixtures.toolkit.make_cluster import DEFAULT_TOLERATIONS, TS

RESULTS = Path(__file__).parent / "results"
PENDING_POD = "team-00/job-000000-" + f"{zlib.crc32(b'0') % 100000:05x}"  # the first pending 8-GPU pod
POOLS = [  # (share of nodes, pool, GPUs per node, taint)
    (0.45, "a100", 8, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}),
    (0.15, "h100", 8, {"key": "dedicated", "value": "research", "effect": "NoSchedule"}),
    (0.10, "t4", 4, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}),
    (0.30, "cpu", 0, None),
]


def _node(name: str, pool: str, gpus: int, taint: dict[str, str] | None) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "pool": pool,
        "topology.kubernetes.io/zone": f"us-east-1{'abc'[zlib.crc32(name.encode()) % 3]}",
        "node.kubernetes.io/instance-type": {
            "a100": "p4de.24xlarge",
            "h100": "p5.48xlarge",
            "t4": "g4dn.12xlarge",
            "cpu": "m6i.8xlarge",
        }[pool],
    }
    cap = {"cpu": "96", "memory": "1056762808Ki", "pods": "110", "ephemeral-storage": "500Gi"}
    if gpus:
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.product": {
                    "a100": "NVIDIA-A100-SXM4-80GB",
                    "h100": "NVIDIA-H100-80GB-HBM3",
                    "t4": "Tesla-T4",
                }[pool],
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/cuda.driver-version.full": "550.127.05",
            }
        )
        cap["nvidia.com/gpu"] = str(gpus)
    alloc = {**cap, "cpu": "95500m", "memory": "1007Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "creationTimestamp": TS,
            "resourceVersion": "1",
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "providerID": f"aws:///us-east-1a/i-{zlib.crc32(name.encode()):08x}",
            **({"taints": [taint]} if taint else {}),
        },
        "status": {
            "capacity": cap,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": TS,
                    "lastTransitionTime": TS,
                }
                for t, s, r, m in (
                    (
                        "MemoryPressure",
                        "False",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                )
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.4",
                "containerRuntimeVersion": "containerd://1.7.27",
                "osImage": "Ubuntu 22.04.5 LTS",
                "kernelVersion": "6.8.0-1019-aws",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
        },
    }


def _pod(i: int, node: str | None, gpus: int, pool: str | None, phase: str) -> dict[str, Any]:
    name = f"job-{i:06d}-{zlib.crc32(str(i).encode()) % 100000:05x}"
    limits: dict[str, str] = {"memory": f"{4 + gpus * 32}Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    tolerations = list(DEFAULT_TOLERATIONS)
    if pool in ("a100", "t4"):
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    elif pool == "h100":
        tolerations.append(
            {"key": "dedicated", "operator": "Equal", "value": "research", "effect": "NoSchedule"}
        )
    container = {
        "name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "train.py"],
        "args": ["--epochs", "10"],
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "resources": {"limits": limits, "requests": {"cpu": f"{1 + gpus * 4}", **limits}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            }
        ],
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "priority": 0,
        "tolerations": tolerations,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "securityContext": {},
        "terminationGracePeriodSeconds": 30,
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
                },
            }
        ],
    }
    if gpus:
        spec["runtimeClassName"] = "nvidia"
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if node:
        spec["nodeName"] = node
        status.update(
            {
                "hostIP": "10.0.0.1",
                "podIP": "10.1.0.1",
                "startTime": TS,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": TS}
                    for t in (
                        "PodReadyToStartContainers",
                        "Initialized",
                        "Ready",
                        "ContainersReady",
                        "PodScheduled",
                    )
                ],
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "imageID": "nvcr.io/nvidia/pytorch@sha256:" + "ab" * 32,
                        "containerID": "containerd://" + "cd" * 32,
                        "state": {"running": {"startedAt": TS}},
                    }
                ],
            }
        )
    else:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5000 nodes are available",
                "lastTransitionTime": TS,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": f"team-{i % 40:02d}",
            "uid": f"{i:08x}-0000-4000-8000-000000000000",
            "creationTimestamp": TS,
            "resourceVersion": str(1000 + i),
            "labels": {"app": f"job-{i % 500}", "batch.kubernetes.io/job-name": name[:10]},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name[:10],
                    "uid": "0",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": status,
    }


def generate(nodes: int, pods: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    gpu_nodes: list[tuple[str, str, int]] = []
    all_nodes: list[str] = []
    for share, pool, gpus, taint in POOLS:
        for k in range(int(nodes * share)):
            name = f"{pool}-{k:05d}"
            items.append(_node(name, pool, gpus, taint))
            all_nodes.append(name)
            if gpus:
                gpu_nodes.append((name, pool, gpus))
    free = {name: gpus for name, _, gpus in gpu_nodes}
    pending = 0
    for i in range(pods):
        if i % 200 == 0:  # 0.5% pending GPU pods, the first one is the one `explain` looks at
            items.append(_pod(i, None, 8, "a100", "Pending"))
            pending += 1
        elif i % 3 == 0 and gpu_nodes:
            name, pool, _ = gpu_nodes[rng.randrange(len(gpu_nodes))]
            want = rng.choice((1, 1, 2, 4))
            if free[name] >= want:
                free[name] -= want
                items.append(_pod(i, name, want, pool, "Running"))
            else:
                items.append(_pod(i, name, 0, pool, "Running"))
        else:
            node = all_nodes[rng.randrange(len(all_nodes))]
            items.append(_pod(i, node, 0, None, rng.choice(("Running", "Running", "Running", "Succeeded"))))
    items.append(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "handler": "nvidia",
            "metadata": {"name": "nvidia"},
        }
    )
    items.append(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
            "spec": {
                "template": {
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [
                            {"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}
                        ],
                    }
                }
            },
            "status": {"desiredNumberScheduled": len(gpu_nodes)},
        }
    )
    return json.dumps(
        {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    ).encode()


# Run in a child process: prints {"seconds": ..., "peak_mb": ...}.
# Run in a child process, through the CLI commands as a user runs them; prints {"seconds", "peak_mb"}.
CHILD = r"""
import contextlib, io, json, os, resource, sys, time
task, path, pod = sys.argv[1], sys.argv[2], sys.argv[3]
if task != "json":
    from kubegpu.toolkit.cli import doctor, explain
start = time.perf_counter()
if task == "json":
    with open(path, "rb") as f:
        data = json.loads(f.read())
else:
    command, args = (explain, [pod]) if task == "explain" else (doctor, ["--cluster"])
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        try:
            command.main([*args, "--snapshot", path, "--json"], standalone_mode=False)
        except SystemExit as exit:
            if exit.code not in (0, 1):  # 2: bad input, so nothing was measured
                raise
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(task: str, path: Path, pod: str = "") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, task, str(path), pod], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"snapshot-{args.nodes}n-{args.pods}p.json"
    if not path.exists():
        path.write_bytes(generate(args.nodes, args.pods))
    baseline = measure("json", path)
    report: dict[str, Any] = {
        "nodes": args.nodes,
        "pods": args.pods,
        "snapshot_mb": round(path.stat().st_size / 2**20, 1),
        "json_loads": baseline,
    }
    for task in ("explain", "doctor"):
        m = measure(task, path, PENDING_POD)
        m["time_ratio"] = round(m["seconds"] / baseline["seconds"], 2)
        m["memory_ratio"] = round(m["peak_mb"] / baseline["peak_mb"], 2)
        m["meets_target"] = m["seconds"] <= 2.0 and m["peak_mb"] <= 500
        report[task] = m
    # Other work on the machine skews the timings; say how busy it was.
    report["load_average_1m"] = round(os.getloadavg()[0], 2)
    _save(report)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"snapshot: {args.nodes} nodes, {args.pods} pods, {report['snapshot_mb']} MB of JSON "
        f"(load average {report['load_average_1m']} on {os.cpu_count()} CPUs)"
    )
    print(
        f"{'':10} {'seconds':>8} {'peak MB':>8} {'x json time':>12} {'x json mem':>11}  "
        "target (<=2 s, <=500 MB)"
    )
    print(f"{'json.loads':10} {baseline['seconds']:8.2f} {baseline['peak_mb']:8.0f} {1.0:12.2f} {1.0:11.2f}")
    for task in ("explain", "doctor"):
        m = report[task]
        print(
            f"{task:10} {m['seconds']:8.2f} {m['peak_mb']:8.0f} {m['time_ratio']:12.2f} "
            f"{m['memory_ratio']:11.2f}  "
            f"{'met' if m['meets_target'] else 'MISSED'}"
        )


def _save(report: dict[str, Any]) -> None:
    """Rows for the README table, in bench/common's format."""
    size = f"{report['nodes']:,} nodes / {report['pods']:,} pods"
    base = report["json_loads"]
    rows = []
    for task, label in (("explain", "kubegpu explain"), ("doctor", "kubegpu doctor --cluster")):
        m = report[task]
        rows.append(
            Row(
                f"{label}, {size}: time",
                f"{m['seconds']:.2f} s",
                f"{base['seconds']:.2f} s (json.loads of the snapshot)",
                m["time_ratio"],
                "<= 2 s",
                m["seconds"] <= 2.0,
            )
        )
        rows.append(
            Row(
                f"{label}, {size}: peak memory",
                f"{m['peak_mb']:.0f} MB",
                f"{base['peak_mb']:.0f} MB (json.loads of the snapshot)",
                m["memory_ratio"],
                "<= 500 MB",
                m["peak_mb"] <= 500,
            )
        )
    Result(
        "toolkit_bench",
        metrics=report,
        target="<= 2 s and <= 500 MB per command",
        passed=all(r.passed for r in rows),
        rows=rows,
    ).save()


if __name__ == "__main__":
    main()
