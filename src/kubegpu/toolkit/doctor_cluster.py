"""`kubegpu doctor --cluster`: the cluster-side GPU faults, found in one pass over a snapshot.

Every check yields findings with a status (ok, warn, fail), the object concerned, the evidence, the
fault it explains (the five classic ones: 1 the container sees no GPU, 2 the node shows no or too few
GPUs, 3 the pod is Pending, 4 the plugin crash-loops, 5 the GPU request is malformed) and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.cluster_facts import is_plugin_daemonset
from kubegpu.toolkit.findings import FAIL, OK, WARN, Finding, ordered
from kubegpu.toolkit.model import (
    DaemonSet,
    Node,
    Pod,
    PodLite,
    Toleration,
    condition,
    limits,
    node_ready,
    ref,
)
from kubegpu.toolkit.scheduling import selector_matches, untolerated
from kubegpu.toolkit.snapshot import Snapshot

PRESENT_LABELS = ("nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present")
ACCELERATOR_LABELS = ("cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator")
MAX_LISTED = 10
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


def promises_gpus(node: Node) -> bool:
    labels = _labels(node)
    return (
        any(labels.get(k) == "true" for k in PRESENT_LABELS)
        or any(k in labels for k in ACCELERATOR_LABELS)
        or _int(labels.get("nvidia.com/gpu.count")) > 0
    )


def _int(text: str | None) -> int:
    try:
        return int(text or "0")
    except ValueError:
        return 0


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
                    expected[f"nvidia.com/{m.group(1)}"] = _int(value)
        else:
            replicas = max(1, _int(labels.get("nvidia.com/gpu.replicas", "1")))
            count = _int(labels.get("nvidia.com/gpu.count"))
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


def _plugin_daemonsets(snap: Snapshot) -> list[DaemonSet]:
    return [ds for ds in snap.daemonsets if is_plugin_daemonset(ds)]


def _owned_by(pod: PodLite, ds: DaemonSet) -> bool:
    return pod.metadata.namespace == ds.metadata.namespace and any(
        o.kind == "DaemonSet" and o.name == ds.metadata.name for o in pod.metadata.owner_references or []
    )


def _check_plugin(snap: Snapshot, nodes_by_name: dict[str, Node]) -> Iterator[Finding]:
    daemonsets = _plugin_daemonsets(snap)
    if not daemonsets:
        if any(promises_gpus(n) for n in snap.nodes):
            yield Finding(
                "plugin-coverage",
                FAIL,
                "cluster",
                "GPU nodes exist but no device-plugin DaemonSet is in the snapshot",
                2,
                "deploy the device plugin (Helm chart nvidia-device-plugin, or kubegpu's DaemonSet)",
            )
        return
    for ds in daemonsets:
        ds_ref = f"daemonset/{ds.metadata.namespace}/{ds.metadata.name}"
        tmpl = ds.spec.template.spec
        pods = [p for p in snap.pods if _owned_by(p, ds)]
        affinity = (
            tmpl.affinity.node_affinity.required if tmpl.affinity and tmpl.affinity.node_affinity else None
        )
        if not tmpl.node_selector and affinity is None:
            gpu_less = sorted(
                p.spec.node_name
                for p in pods
                if p.spec.node_name
                and p.spec.node_name in nodes_by_name
                and not promises_gpus(nodes_by_name[p.spec.node_name])
            )
            yield Finding(
                "plugin-daemonset-selector",
                FAIL if gpu_less else WARN,
                ds_ref,
                "no nodeSelector or node affinity"
                + (
                    f"; its pods run on {len(gpu_less)} GPU-less node(s): {_names(gpu_less)}"
                    if gpu_less
                    else ""
                ),
                4,
                'restrict it to GPU nodes: nodeSelector {nvidia.com/gpu.present: "true"} (GFD/NFD '
                "label) or the Helm chart's affinity on feature.node.kubernetes.io/pci-10de.present",
            )
        else:
            yield Finding("plugin-daemonset-selector", OK, ds_ref, "targets GPU nodes only", None, "")
        yield from _check_crashloops(ds_ref, pods, nodes_by_name)
        yield from _check_coverage(ds, ds_ref, pods, snap.nodes)
        if (
            tmpl.runtime_class_name
            and snap.runtime_classes
            and tmpl.runtime_class_name not in {rc.metadata.name for rc in snap.runtime_classes}
        ):
            yield Finding(
                "runtime-class",
                FAIL,
                ds_ref,
                f"runtimeClassName {tmpl.runtime_class_name!r} does not exist, so its pods are rejected",
                4,
                "create the RuntimeClass (handler nvidia) or fix the name",
            )


def _crash_cause(message: str, gpu_node: bool) -> tuple[str, int, str]:
    text = message.lower()
    if "library_not_found" in text or "libnvidia-ml" in text or "could not load nvml" in text:
        if not gpu_node:
            return (
                "NVML library not found on a node without GPUs",
                4,
                "keep the plugin off GPU-less nodes (nodeSelector), or set failOnInitError: false",
            )
        return (
            "libnvidia-ml.so.1 not visible in the plugin container",
            1,
            "make nvidia the container runtime for the plugin: runtimeClassName: nvidia, or nvidia as "
            "containerd's default runtime "
            "(nvidia-ctk runtime configure --runtime=containerd --set-as-default)",
        )
    if "driver not loaded" in text or "driver_not_loaded" in text:
        return (
            "the NVIDIA kernel driver is not loaded",
            2,
            "load it on the node (modprobe nvidia; check dmesg, secure boot, the driver install)",
        )
    if "permission denied" in text and ("device-plugins" in text or ".sock" in text):
        return (
            "no permission on the device-plugin directory",
            4,
            "mount /var/lib/kubelet/device-plugins as a hostPath and run the plugin as root "
            "(or fix the SELinux "
            "label of the directory)",
        )
    if "kubelet.sock" in text and ("no such file" in text or "connect" in text):
        return (
            "kubelet.sock is not where the plugin looks",
            4,
            "mount the kubelet's real device-plugin directory "
            "(k0s, microk8s and others use a different root)",
        )
    return ("the container keeps exiting", 4, "read its log: kubectl -n <ns> logs <pod> --previous")


def _check_crashloops(ds_ref: str, pods: list[PodLite], nodes_by_name: dict[str, Node]) -> Iterator[Finding]:
    # One finding per cause, not per pod: a bad DaemonSet crash-loops the same way on thousands of nodes.
    causes: dict[tuple[str, int, str], list[tuple[Pod, int, str]]] = {}
    for pod in pods:
        if not isinstance(pod, Pod):  # DaemonSet pods are decoded whole; a lite one carries no statuses
            continue
        for status in pod.status.container_statuses or []:
            waiting = status.state.waiting if status.state else None
            if not (waiting and waiting.reason in ("CrashLoopBackOff", "Error", "RunContainerError")):
                continue
            last = (
                status.last_state.terminated if status.last_state and status.last_state.terminated else None
            )
            message = (last.message if last else None) or (waiting.message or "")
            node = nodes_by_name.get(pod.spec.node_name or "")
            key = _crash_cause(message, promises_gpus(node) if node else True)
            causes.setdefault(key, []).append((pod, status.restart_count, message))
    for (cause, fault, fix), crashing in causes.items():
        pod, restarts, message = crashing[0]
        tail = message.strip().splitlines()[-1][:300] if message.strip() else "no termination message"
        where = _names(sorted(p.spec.node_name or "?" for p, _, _ in crashing))
        subject = f"pod/{ref(pod.metadata)}" if len(crashing) == 1 else f"{len(crashing)} pods of {ds_ref}"
        yield Finding(
            "plugin-crashloop",
            FAIL,
            subject,
            f"crash-looping on {where} ({restarts} restarts): {cause}. Last words: {tail}",
            fault,
            fix,
        )
    if not causes:
        yield Finding(
            "plugin-crashloop", OK, ds_ref, f"{len(pods)} plugin pod(s), none crash-looping", None, ""
        )


# The DaemonSet controller adds these tolerations to every DaemonSet pod, so these taints never keep one off.
DAEMONSET_DEFAULT_TOLERATIONS = [
    Toleration(key=f"node.kubernetes.io/{key}", operator="Exists", effect=effect)
    for key, effect in (
        ("not-ready", "NoExecute"),
        ("unreachable", "NoExecute"),
        ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"),
        ("pid-pressure", "NoSchedule"),
        ("unschedulable", "NoSchedule"),
    )
]


def _check_coverage(ds: DaemonSet, ds_ref: str, pods: list[PodLite], nodes: list[Node]) -> Iterator[Finding]:
    covered = {p.spec.node_name for p in pods if p.spec.node_name}
    tmpl = ds.spec.template.spec
    missing = 0
    for node in nodes:
        if not promises_gpus(node) or node.metadata.name in covered:
            continue
        missing += 1
        tolerations = [*(tmpl.tolerations or []), *DAEMONSET_DEFAULT_TOLERATIONS]
        taint = untolerated(node.spec.taints or [], tolerations)
        if taint is not None:
            why = f"it does not tolerate the node's taint {taint.key}={taint.value or ''}:{taint.effect}"
            toleration = f"{{key: {taint.key}, operator: Exists, effect: {taint.effect}}}"
            fix = f"add to the DaemonSet's tolerations {toleration}"
        elif not selector_matches(tmpl, node):
            why = "its nodeSelector/affinity does not match the node's labels"
            fix = "label the node to match, or widen the DaemonSet's selector"
        else:
            why = "no pod is there (being created, evicted, or the node is new)"
            fix = "kubectl -n <ns> describe daemonset; check events for the node"
        yield Finding(
            "plugin-coverage",
            FAIL,
            f"node/{node.metadata.name}",
            f"GPU node without a pod of {ds_ref}: {why}",
            2,
            fix,
        )
    if not missing:
        yield Finding("plugin-coverage", OK, ds_ref, "every GPU node has a plugin pod", None, "")


def _gpu_limits(pod: PodLite) -> dict[str, str]:
    out: dict[str, str] = {}
    for c in (*(pod.spec.containers or ()), *(pod.spec.init_containers or ())):
        for name, amount in limits(c).items():
            if res.is_gpu(name):
                out[name] = str(amount)
    return out


def _names(names: list[str]) -> str:
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


def _check_pods(snap: Snapshot) -> Iterator[Finding]:
    plugin_rc = next(
        (
            ds.spec.template.spec.runtime_class_name
            for ds in _plugin_daemonsets(snap)
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
    if no_rc:
        yield Finding(
            "runtime-class",
            FAIL,
            f"{len(no_rc)} GPU pod(s)",
            f"running without runtimeClassName while the device plugin itself needs {plugin_rc!r} (so "
            f"nvidia is not the default runtime): {_names(sorted(no_rc))}",
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
    for node_name, pods in sorted(rejected.items()):
        yield Finding(
            "admission-errors",
            WARN,
            f"node/{node_name}",
            f"{len(pods)} pod(s) rejected with UnexpectedAdmissionError: {_names(sorted(pods))}",
            2,
            "the kubelet admitted them before the device plugin re-registered after a kubelet restart; "
            "they are never retried: delete them so their controllers recreate them, and make sure the "
            "plugin re-registers quickly (kubegpu watches kubelet.sock for this)",
        )
    if not rejected:
        yield Finding("admission-errors", OK, "cluster", "no UnexpectedAdmissionError pods", None, "")
    for pod in pending[:MAX_PENDING]:
        cond = condition(pod, "PodScheduled") if isinstance(pod, Pod) else None
        said = (cond.message if cond and cond.message else "not yet tried by the scheduler").split(
            " preemption:"
        )[0]
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
            f"{_names([ref(p.metadata) for p in pending[MAX_PENDING:]])}",
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
            f"NotReady: {_names(bad)}",
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
        (None, _check_plugin(snap, nodes_by_name)),
        (None, _check_pods(snap)),
        ("gpu-nodes-ready", _check_ready(snap.nodes)),
    ):
        found = list(produce)
        findings.extend(found)
        if check and not found:
            title = next(c.title for c in CHECKS if c.id == check)
            findings.append(Finding(check, OK, "cluster", title, None, ""))
    return ordered(findings)
