"""`kubegpu doctor --cluster`: the cluster-side GPU faults, found in one pass over a snapshot.

Every check yields findings with a status (ok, warn, fail), the object concerned, the evidence, the
fault it explains (the five classic ones: 1 the container sees no GPU, 2 the node shows no or too few
GPUs, 3 the pod is Pending, 4 the plugin crash-loops, 5 the GPU request is malformed) and the fix.

This module checks the GPU nodes and the GPU pods and runs every check; the device-plugin DaemonSet's
checks are in `doctor.plugin`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.cluster_facts import ACCELERATOR_LABELS, PRESENT_LABELS, label_count, promises_gpus
from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding, listed, ordered
from kubegpu.toolkit.doctor.plugin import check_plugin_daemonsets, plugin_daemonsets
from kubegpu.toolkit.model import Node, Pod, PodLite, condition, limits, node_ready, ref
from kubegpu.toolkit.scheduling import filter_summary
from kubegpu.toolkit.snapshot import Snapshot

MAX_PENDING = 20


@dataclass(frozen=True)
class Check:
    id: str
    title: str


CHECKS = (
    Check("gpu-capacity", "GPU nodes advertise the GPUs their labels promise"),
    Check("unhealthy-gpus", "no GPU is reported unhealthy (capacity > allocatable)"),
    Check("stale-mig-resources", "no MIG resources left over from an earlier MIG layout"),
    Check("plugin-daemonset-selector", "the device-plugin DaemonSet only targets GPU nodes"),
    Check("plugin-crashloop", "device-plugin pods are running"),
    Check("plugin-coverage", "every GPU node runs a device-plugin pod"),
    Check("runtime-class", "GPU pods name the RuntimeClass the nodes need"),
    Check("admission-errors", "no pod was rejected with UnexpectedAdmissionError"),
    Check("pending-gpu-pods", "no GPU pod is stuck Pending"),
    Check("gpu-nodes-ready", "GPU nodes are Ready"),
)


def _labels(node: Node) -> dict[str, str]:
    return node.metadata.labels or {}


def _gpu_amounts(node: Node) -> tuple[dict[str, int], dict[str, int]]:
    cap = {n: v for n, v in res.node_amounts(node.status.capacity or {}).items() if res.is_gpu(n)}
    alloc = {n: v for n, v in res.node_amounts(node.status.allocatable or {}).items() if res.is_gpu(n)}
    return cap, alloc


def _check_capacity(nodes: list[Node]) -> Iterator[Finding]:
    for node in nodes:
        if not promises_gpus(node):
            continue
        labels = _labels(node)
        cap, _ = _gpu_amounts(node)
        name = node.metadata.name
        strategy = labels.get("nvidia.com/mig.strategy", "none")
        if not any(cap.values()):
            yield Finding(
                "gpu-capacity",
                FAIL,
                f"node/{name}",
                f"labels promise GPUs ({_promise_text(labels)}) but the node advertises no GPU resource "
                "(capacity nvidia.com/gpu is 0 or absent)",
                2,
                "the device plugin is not registered on this node: check its pod there (kubectl -n "
                "<ns> logs), then run `kubegpu doctor` on the node for the driver, libnvidia-ml.so.1 and "
                "the container runtime",
            )
            continue
        expected: dict[str, int] = {}
        if strategy == "mixed":
            for key, value in labels.items():
                m = re.fullmatch(r"nvidia\.com/(mig-.+)\.count", key)
                if m:
                    expected[f"nvidia.com/{m.group(1)}"] = label_count(value)
        else:
            replicas = max(1, label_count(labels.get("nvidia.com/gpu.replicas", "1")))
            count = label_count(labels.get("nvidia.com/gpu.count"))
            if count:
                shared = labels.get("nvidia.com/gpu.sharing-strategy") not in (None, "none")
                gpu_name = "nvidia.com/gpu.shared" if shared and "nvidia.com/gpu.shared" in cap else res.GPU
                expected[gpu_name] = count * replicas
        short = {r: (want, cap.get(r, 0)) for r, want in expected.items() if cap.get(r, 0) < want}
        if short:
            text = ", ".join(f"{r}: labels say {want}, capacity {have}" for r, (want, have) in short.items())
            yield Finding(
                "gpu-capacity",
                FAIL,
                f"node/{name}",
                text,
                2,
                "some GPUs are missing from the plugin's device list: check `nvidia-smi -L` on the "
                "node (a GPU fallen off the bus, XID 79) and the plugin's log for devices it skipped",
            )


def _promise_text(labels: dict[str, str]) -> str:
    keys = [
        k
        for k in (*PRESENT_LABELS, *ACCELERATOR_LABELS, "nvidia.com/gpu.count", "nvidia.com/gpu.product")
        if k in labels
    ]
    return ", ".join(f"{k}={labels[k]}" for k in keys[:3])


def _check_unhealthy(nodes: list[Node]) -> Iterator[Finding]:
    for node in nodes:
        cap, alloc = _gpu_amounts(node)
        for name, have in sorted(cap.items()):
            if have > alloc.get(name, 0) and not (res.is_mig(name) and alloc.get(name, 0) == 0):
                yield Finding(
                    "unhealthy-gpus",
                    WARN,
                    f"node/{node.metadata.name}",
                    f"{name}: capacity {have}, allocatable {alloc.get(name, 0)}: "
                    f"{have - alloc.get(name, 0)} device(s) reported Unhealthy",
                    2,
                    "look for XID errors on the node (`kubegpu doctor` there, or dmesg | grep NVRM), "
                    "reset or replace the GPU; NVIDIA's plugin keeps a device Unhealthy until its pod "
                    "restarts, kubegpu's re-advertises it once it recovers",
                )


def _check_stale_mig(nodes: list[Node]) -> Iterator[Finding]:
    for node in nodes:
        cap, alloc = _gpu_amounts(node)
        strategy = _labels(node).get("nvidia.com/mig.strategy", "none")
        for name in sorted(n for n in cap if res.is_mig(n)):
            stale = alloc.get(name, 0) == 0 or strategy != "mixed"
            if stale:
                why = (
                    f"allocatable 0 with capacity {cap[name]}"
                    if alloc.get(name, 0) == 0
                    else f"the node's MIG strategy is {strategy}, which never advertises {name}"
                )
                yield Finding(
                    "stale-mig-resources",
                    WARN,
                    f"node/{node.metadata.name}",
                    f"{name} is still listed ({why}): left over from an earlier MIG layout",
                    2,
                    "the kubelet keeps extended resources it once saw until it restarts (NVIDIA "
                    "k8s-device-plugin#240): restart the kubelet on the node after MIG reconfiguration, "
                    "or remove the resource from the node status",
                )


def _gpu_limits(pod: PodLite) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in (*(pod.spec.containers or ()), *(pod.spec.init_containers or ())):
        for name, amount in limits(c).items():
            if res.is_gpu(name):
                out[name] = str(amount)
    return out


def _check_pods(snap: Snapshot) -> Iterator[Finding]:
    plugin_rc = next(
        (
            ds.spec.template.spec.runtime_class_name
            for ds in plugin_daemonsets(snap)
            if ds.spec.template.spec.runtime_class_name
        ),
        None,
    )
    no_rc: list[str] = []
    rejected: dict[str, list[str]] = {}
    pending: list[PodLite] = []
    for pod in snap.pods:
        if pod.status.reason == "UnexpectedAdmissionError":
            rejected.setdefault(pod.spec.node_name or "?", []).append(ref(pod.metadata))
            continue
        if pod.status.phase in ("Succeeded", "Failed") or not _gpu_limits(pod):
            continue
        if not pod.spec.node_name:
            pending.append(pod)
        elif plugin_rc and not pod.spec.runtime_class_name:
            no_rc.append(ref(pod.metadata))
    yield from _runtime_class_findings(no_rc, plugin_rc)
    yield from _admission_findings(rejected)
    yield from _pending_findings(pending)


def _runtime_class_findings(no_rc: list[str], plugin_rc: str | None) -> Iterator[Finding]:
    if no_rc:
        yield Finding(
            "runtime-class",
            FAIL,
            f"{len(no_rc)} GPU pod(s)",
            f"running without runtimeClassName while the device plugin itself needs {plugin_rc!r} (so "
            f"nvidia is not the default runtime): {listed(sorted(no_rc))}",
            1,
            f"set runtimeClassName: {plugin_rc} in their pod templates; otherwise CUDA reports "
            "CUDA_ERROR_NO_DEVICE. Or make nvidia containerd's default runtime on GPU nodes",
        )
    else:
        yield Finding(
            "runtime-class",
            OK,
            "cluster",
            "no GPU pod lacks a RuntimeClass the cluster needs"
            if plugin_rc
            else "the plugin runs without a RuntimeClass, so GPU pods need none",
            None,
            "",
        )


def _admission_findings(rejected: dict[str, list[str]]) -> Iterator[Finding]:
    for node_name, pods in sorted(rejected.items()):
        yield Finding(
            "admission-errors",
            WARN,
            f"node/{node_name}",
            f"{len(pods)} pod(s) rejected with UnexpectedAdmissionError: {listed(sorted(pods))}",
            2,
            "the kubelet admitted them before the device plugin re-registered after a kubelet restart; "
            "they are never retried: delete them so their controllers recreate them, and make sure the "
            "plugin re-registers quickly (kubegpu watches kubelet.sock for this)",
        )
    if not rejected:
        yield Finding("admission-errors", OK, "cluster", "no UnexpectedAdmissionError pods", None, "")


def _pending_findings(pending: list[PodLite]) -> Iterator[Finding]:
    for pod in pending[:MAX_PENDING]:
        cond = condition(pod, "PodScheduled") if isinstance(pod, Pod) else None
        said = filter_summary(cond.message) if cond and cond.message else "not yet tried by the scheduler"
        yield Finding(
            "pending-gpu-pods",
            WARN,
            f"pod/{ref(pod.metadata)}",
            f"Pending, asks for {', '.join(f'{n}: {v}' for n, v in _gpu_limits(pod).items())}; "
            f"scheduler: {said}",
            3,
            f"kubegpu explain {ref(pod.metadata)}",
        )
    if len(pending) > MAX_PENDING:
        yield Finding(
            "pending-gpu-pods",
            WARN,
            f"{len(pending) - MAX_PENDING} more pod(s)",
            f"also Pending with GPU requests (only the first {MAX_PENDING} are listed): "
            f"{listed([ref(p.metadata) for p in pending[MAX_PENDING:]])}",
            3,
            "kubegpu explain NAMESPACE/NAME for each",
        )
    if not pending:
        yield Finding("pending-gpu-pods", OK, "cluster", "no GPU pod is Pending", None, "")


def _check_ready(nodes: list[Node]) -> Iterator[Finding]:
    bad = [n.metadata.name for n in nodes if promises_gpus(n) and node_ready(n) is False]
    if bad:
        yield Finding(
            "gpu-nodes-ready",
            WARN,
            f"{len(bad)} GPU node(s)",
            f"NotReady: {listed(bad)}",
            2,
            "kubectl describe node; a NotReady node advertises nothing the scheduler can use",
        )


def doctor_cluster(snap: Snapshot) -> list[Finding]:
    nodes_by_name = {n.metadata.name: n for n in snap.nodes}
    findings: list[Finding] = []
    for check, produce in (
        ("gpu-capacity", _check_capacity(snap.nodes)),
        ("unhealthy-gpus", _check_unhealthy(snap.nodes)),
        ("stale-mig-resources", _check_stale_mig(snap.nodes)),
        (None, check_plugin_daemonsets(snap, nodes_by_name)),
        (None, _check_pods(snap)),
        ("gpu-nodes-ready", _check_ready(snap.nodes)),
    ):
        found = list(produce)
        findings.extend(found)
        if check and not found:
            title = next(c.title for c in CHECKS if c.id == check)
            findings.append(Finding(check, OK, "cluster", title, None, ""))
    return ordered(findings)
