"""`kubegpu doctor --cluster` on the device-plugin DaemonSet: its node selection, crash loops, coverage.

A crash loop's termination message names the cause (no NVML library, no driver, the kubelet's socket
not where the plugin looks); a GPU node without a plugin pod is explained by its taints or labels.
"""

from __future__ import annotations

from collections.abc import Iterator

from kubegpu.toolkit.cluster_facts import is_plugin_daemonset, promises_gpus
from kubegpu.toolkit.doctor.findings import FAIL, OK, WARN, Finding, listed
from kubegpu.toolkit.model import DaemonSet, Node, Pod, PodLite, Toleration, ref
from kubegpu.toolkit.scheduling import selector_matches, untolerated
from kubegpu.toolkit.snapshot import Snapshot


def plugin_daemonsets(snap: Snapshot) -> list[DaemonSet]:
    return [ds for ds in snap.daemonsets if is_plugin_daemonset(ds)]


def owned_by(pod: PodLite, ds: DaemonSet) -> bool:
    return pod.metadata.namespace == ds.metadata.namespace and any(
        o.kind == "DaemonSet" and o.name == ds.metadata.name for o in pod.metadata.owner_references or []
    )


def check_plugin_daemonsets(snap: Snapshot, nodes_by_name: dict[str, Node]) -> Iterator[Finding]:
    daemonsets = plugin_daemonsets(snap)
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
        pods = [p for p in snap.pods if owned_by(p, ds)]
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
                    f"; its pods run on {len(gpu_less)} GPU-less node(s): {listed(gpu_less)}"
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
        where = listed(sorted(p.spec.node_name or "?" for p, _, _ in crashing))
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
