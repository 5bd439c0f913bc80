"""`kubegpu lint --snapshot`'s rules: whether the cluster in the snapshot can run the pod at all."""

from __future__ import annotations

from kubegpu.common import quantity
from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.lint.rules import LOOKS_LIKE_GPU, LintContext, all_containers
from kubegpu.toolkit.manifests import Workload
from kubegpu.toolkit.model import Node, Taint, Toleration, limits
from kubegpu.toolkit.scheduling import selector_matches, untolerated

_CONDITION_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")


def check_cluster(ctx: LintContext) -> None:
    cluster = ctx.options.cluster
    assert cluster is not None
    spec = ctx.workload.spec
    wanted = _wanted_gpus(ctx.workload)
    try:
        effective = res.pod_requests(spec)
    except quantity.QuantityError:
        effective = {}
    for name in sorted(wanted):
        _check_offered(ctx, cluster, name, effective.get(name, wanted[name]))
    _check_runtime_class(ctx, cluster, bool(wanted))


def _wanted_gpus(w: Workload) -> dict[str, int]:
    """The largest limit of each GPU resource over the pod's containers (bad quantities: KG004's job)."""
    wanted: dict[str, int] = {}
    for _group, _index, c in all_containers(w):
        for name, raw in limits(c).items():
            if is_extended_resource_name(name) and (res.is_gpu(name) or LOOKS_LIKE_GPU.search(name)):
                try:
                    wanted[name] = max(wanted.get(name, 0), quantity.value(raw))
                except quantity.QuantityError:
                    continue
    return wanted


def _check_offered(ctx: LintContext, cluster: ClusterFacts, name: str, need: int) -> None:
    """KG009, KG012, KG013, KG010: some node offers `need` of `name` and lets the pod in."""
    spec = ctx.workload.spec
    offered = cluster.offered.get(name, [])
    if not offered and bridging_classes(cluster, name):
        return  # served through DRA (KEP-5004): the scheduler makes a claim of that class; see `explain`
    if not offered:
        known = ", ".join(sorted(n for n in cluster.offered if res.is_gpu(n))) or "none"
        ctx.add(
            "KG009",
            ("containers",),
            f"no node in the cluster offers {name}; the pod would stay Pending (Insufficient {name})",
            f"request a resource the cluster has (GPU resources offered: {known})",
        )
        return
    biggest = max(amount for _, amount in offered)
    if need > biggest:
        ctx.add(
            "KG012",
            ("containers",),
            f"the pod needs {need} {name} but the largest node offers {biggest}; it can never schedule",
            f"request at most {biggest} per pod, or split the work across pods",
        )
    matching = [(n, a) for n, a in offered if selector_matches(spec, n)]
    if not matching:
        ctx.add(
            "KG013",
            ("nodeSelector",) if spec.node_selector else ("affinity",),
            f"nodeSelector/affinity excludes all {len(offered)} node(s) that offer {name}",
            "match the labels of the GPU nodes (kubectl get nodes -L nvidia.com/gpu.product)",
        )
        return
    pod_tolerations: list[Toleration] = list(spec.tolerations or [])
    blocking = [(n, untolerated(_admin_taints(n), pod_tolerations)) for n, _ in matching]
    if all(t is not None for _, t in blocking):
        taint = blocking[0][1]
        assert taint is not None
        value = f", value: {taint.value}" if taint.value else ""
        op = "Equal" if taint.value else "Exists"
        ctx.add(
            "KG010",
            ("tolerations",),
            f"every node offering {name} ({len(matching)}) has a taint the pod does not tolerate, e.g. "
            f"{taint.key}={taint.value or ''}:{taint.effect} on {blocking[0][0].metadata.name}",
            f"add tolerations: [{{key: {taint.key}, operator: {op}{value}, effect: {taint.effect}}}]",
        )


def _check_runtime_class(ctx: LintContext, cluster: ClusterFacts, wants_gpus: bool) -> None:
    """KG011: the pod names the RuntimeClass GPU pods need here, and it exists."""
    spec = ctx.workload.spec
    if wants_gpus and cluster.plugin_runtime_class and not spec.runtime_class_name:
        rc = cluster.plugin_runtime_class
        ctx.add(
            "KG011",
            ("runtimeClassName",),
            f"the device plugin ({cluster.plugin_daemonset}) itself runs with runtimeClassName: {rc}, so the "
            "nvidia runtime is not the default; without it the container gets no GPU (CUDA_ERROR_NO_DEVICE)",
            f"set runtimeClassName: {rc}",
        )
    if (
        spec.runtime_class_name
        and cluster.runtime_classes
        and spec.runtime_class_name not in cluster.runtime_classes
    ):
        ctx.add(
            "KG011",
            ("runtimeClassName",),
            f"RuntimeClass {spec.runtime_class_name!r} does not exist in the cluster; the API server rejects "
            "the pod",
            f"use one of: {', '.join(sorted(cluster.runtime_classes))}",
        )


def _admin_taints(node: Node) -> list[Taint]:
    """Taints an admin set on purpose; condition taints (not-ready, ...) come and go, not a spec bug."""
    return [t for t in node.spec.taints or [] if not t.key.startswith(_CONDITION_TAINT_PREFIXES)]


def bridging_classes(cluster: ClusterFacts, name: str) -> list[str]:
    """The DeviceClasses whose `extendedResourceName` is `name` (the extended-resource bridge, KEP-5004:
    beta and on in 1.36): a pod asking for `name` can get a device of that class where no node advertises
    it."""
    return sorted(
        str((c.get("metadata") or {}).get("name", ""))
        for c in cluster.dra.get("DeviceClass", [])
        if (c.get("spec") or {}).get("extendedResourceName") == name
    )
