"""`kubegpu lint`: GPU mistakes in pod specs, found before they reach the cluster.

Each rule has a stable id (KG0xx) and a severity. "error" means the object will be rejected by the
API server, never schedule, or fail at admission; "warning" means it runs but not as intended.
Rules marked (snapshot) need `--snapshot`, a dump of the target cluster.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit import quantity
from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.manifests import Manifests, Path, Workload, path_text
from kubegpu.toolkit.model import Container, Node, Taint, Toleration, limits, requests
from kubegpu.toolkit.scheduling import selector_matches, untolerated

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    summary: str
    needs_snapshot: bool = False


RULES = {
    r.id: r
    for r in (
        Rule("KG000", "invalid-manifest", ERROR, "the document is not a readable Kubernetes object"),
        Rule("KG001", "gpu-only-in-requests", ERROR, "a GPU is in requests but not in limits"),
        Rule("KG002", "gpu-requests-not-limits", ERROR, "GPU requests differ from GPU limits"),
        Rule("KG003", "gpu-not-integer", ERROR, "a GPU quantity is fractional (0.5, 500m)"),
        Rule("KG004", "invalid-quantity", ERROR, "a resource quantity does not parse"),
        Rule(
            "KG005",
            "shared-gpu-above-one",
            WARNING,
            "more than one replica of a shared (time-sliced/MPS) GPU; an error where the plugin rejects it",
        ),
        Rule(
            "KG006", "mixed-mig-types", WARNING, "one container asks for two MIG types, or MIG and full GPUs"
        ),
        Rule("KG007", "init-container-holds-gpu", WARNING, "an init container or sidecar holds GPUs"),
        Rule(
            "KG008", "visible-devices-env", WARNING, "NVIDIA_VISIBLE_DEVICES set by hand bypasses accounting"
        ),
        Rule(
            "KG009",
            "unknown-gpu-resource",
            ERROR,
            "a GPU resource name no NVIDIA plugin serves (or, with a snapshot, no node offers)",
        ),
        Rule(
            "KG010",
            "missing-toleration",
            ERROR,
            "every node offering the GPU has a taint the pod does not tolerate",
            True,
        ),
        Rule(
            "KG011", "missing-runtime-class", ERROR, "GPU pods must name the nvidia RuntimeClass here", True
        ),
        Rule("KG012", "gpu-exceeds-any-node", ERROR, "no single node has as many GPUs as requested", True),
        Rule(
            "KG013",
            "selector-excludes-gpu-nodes",
            ERROR,
            "nodeSelector/affinity excludes every node offering the GPU",
            True,
        ),
        Rule(
            "KG014",
            "device-plugin-and-dra",
            WARNING,
            "one container uses both DRA claims and device-plugin GPUs",
        ),
    )
}

# Names NVIDIA's plugin can serve: nvidia.com/gpu, nvidia.com/mig-<profile>, optionally renamed .shared.
_VALID_NVIDIA = re.compile(
    r"^nvidia\.com/(gpu|mig-(\d+c\.)?\d+g\.\d+gb(\.(me|gfx|all|me\.all))*)(\.shared)?$"
)
_CONDITION_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
_LOOKS_LIKE_GPU = re.compile(r"gpu|mig-|nvidia", re.IGNORECASE)


@dataclass
class Finding:
    rule: str
    name: str
    severity: str
    file: str
    line: int | None
    doc: int
    object: str
    container: str | None
    path: str
    message: str
    fix: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class LintOptions:
    cluster: ClusterFacts | None = None
    fail_requests_greater_than_one: bool | None = None  # from --plugin-config, when given


@dataclass
class _Ctx:
    workload: Workload
    options: LintOptions
    findings: list[Finding]

    def add(
        self,
        rule_id: str,
        path: Path,
        message: str,
        fix: str,
        container: str | None = None,
        severity: str | None = None,
    ) -> None:
        rule = RULES[rule_id]
        w = self.workload
        full = (*w.spec_path, *path)
        self.findings.append(
            Finding(
                rule=rule.id,
                name=rule.name,
                severity=severity or rule.severity,
                file=w.source.file,
                line=w.source.line(full),
                doc=w.source.doc,
                object=w.ref,
                container=container,
                path=path_text(full),
                message=message,
                fix=fix,
            )
        )


def _all_containers(w: Workload) -> Iterator[tuple[str, int, Container]]:
    for index, c in enumerate(w.spec.init_containers or []):
        yield "initContainers", index, c
    for index, c in enumerate(w.spec.containers or []):
        yield "containers", index, c


def _quantity_checks(ctx: _Ctx, where: Path, c: Container) -> dict[str, dict[str, int | None]]:
    """KG004/KG003 per quantity; returns parsed nanos {'requests': {...}, 'limits': {...}} (None = bad)."""
    parsed: dict[str, dict[str, int | None]] = {}
    for part, amounts in (("requests", requests(c)), ("limits", limits(c))):
        parsed[part] = {}
        for name, raw in amounts.items():
            qpath = (*where, "resources", part, name)
            try:
                nanos = quantity.parse_nanos(raw)
            except quantity.QuantityError as exc:
                ctx.add(
                    "KG004", qpath, f"{name}: {exc}", "write a Kubernetes quantity: 1, 500m, 2Gi, 1e3", c.name
                )
                parsed[part][name] = None
                continue
            parsed[part][name] = nanos
            if is_extended_resource_name(name) and nanos % quantity.NANO != 0:
                share = (
                    "request a MIG profile (nvidia.com/mig-1g.10gb) or a time-sliced/MPS replica "
                    "(nvidia.com/gpu.shared)"
                )
                ctx.add(
                    "KG003",
                    qpath,
                    f"{part}.{name} is {raw!r}, but extended resources such as GPUs are whole devices; "
                    "the API server rejects it (must be an integer)",
                    f"use a whole number; to give a container part of a GPU, {share}",
                    c.name,
                )
    return parsed


def _count(nanos: int | None) -> int:
    return quantity.ceil_div(nanos or 0, quantity.NANO)


def _check_container(ctx: _Ctx, group: str, index: int, c: Container) -> None:
    where: Path = (group, index)
    parsed = _quantity_checks(ctx, where, c)
    reqs, lims = parsed["requests"], parsed["limits"]
    gpu_names = sorted({n for n in (*reqs, *lims) if res.is_gpu(n) or _LOOKS_LIKE_GPU.search(n)})
    for name in gpu_names:
        if not is_extended_resource_name(name) and name not in (res.CPU, res.MEMORY, res.EPHEMERAL):
            ctx.add(
                "KG009",
                (*where, "resources"),
                f"{name!r} is not a valid extended resource name; the API "
                "server rejects it (must be a standard resource type or fully qualified)",
                "use nvidia.com/gpu (or the exact name the device plugin advertises)",
                c.name,
            )
            continue
        if not is_extended_resource_name(name):
            continue
        if name in reqs and name not in lims:
            ctx.add(
                "KG001",
                (*where, "resources", "requests", name),
                f"{name} is in requests but not in limits; extended resources must be set in limits, so the "
                "API server rejects this (Limit must be set for non overcommitable resources)",
                f"move it to resources.limits ({name}: {_count(reqs[name])}); the request "
                "then defaults to the limit",
                c.name,
            )
        elif (
            name in reqs
            and name in lims
            and None not in (reqs[name], lims[name])
            and reqs[name] != lims[name]
        ):
            ctx.add(
                "KG002",
                (*where, "resources", "requests", name),
                f"{name} requests {_count(reqs[name])} but limits {_count(lims[name])}; extended resources "
                "cannot be overcommitted, so the API server rejects this (must be equal to the limit)",
                "set requests and limits to the same number, or drop the request (it defaults to the limit)",
                c.name,
            )
        if not _VALID_NVIDIA.match(name) and name.startswith("nvidia.com/") and ctx.options.cluster is None:
            ctx.add(
                "KG009",
                (*where, "resources", "limits" if name in lims else "requests", name),
                f"{name} is not a resource NVIDIA's device plugin advertises; the pod would stay Pending "
                "(Insufficient " + name + ")",
                "use nvidia.com/gpu, nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb), or the "
                "'.shared' name of a time-sliced resource",
                c.name,
            )
    gpu_limits = {n: _count(v) for n, v in lims.items() if res.is_gpu(n) and v}
    _check_sharing(ctx, where, c, gpu_limits)
    migs = sorted(n for n in gpu_limits if res.is_mig(n))
    fulls = sorted(n for n in gpu_limits if not res.is_mig(n))
    if len(migs) > 1 or (migs and fulls):
        why = (
            "CUDA cannot use MIG devices and full GPUs together"
            if fulls
            else "CUDA enumerates only one MIG device per process"
        )
        ctx.add(
            "KG006",
            (*where, "resources", "limits"),
            f"the container asks for {', '.join(migs + fulls)}; {why}, "
            "so part of what is allocated stays idle",
            "request a single MIG profile per container (use several containers, or a bigger profile)",
            c.name,
        )
    if group == "initContainers" and gpu_limits:
        _check_init_gpu(ctx, where, c, gpu_limits)
    for env_index, env in enumerate(c.env or []):
        if env.name == "NVIDIA_VISIBLE_DEVICES" and (env.value or "") not in ("", "void", "none"):
            ctx.add(
                "KG008",
                (*where, "env", env_index),
                f"NVIDIA_VISIBLE_DEVICES={env.value} is set by hand; the container then sees GPUs the "
                "scheduler gave to other pods (the device plugin sets this variable itself)",
                f"remove it and request GPUs through resources.limits ({res.GPU}: N)",
                c.name,
            )
    if c.resources is not None and gpu_limits and _has_claims(ctx.workload):
        ctx.add(
            "KG014",
            (*where, "resources"),
            "the pod uses DRA resourceClaims and device-plugin GPUs together; the two allocators do not "
            "know about each other and may hand out the same GPU",
            "use either DRA claims or nvidia.com/* limits for GPUs, not both",
            c.name,
        )


def _has_claims(w: Workload) -> bool:
    return bool(w.spec.resource_claims)


def _check_sharing(ctx: _Ctx, where: Path, c: Container, gpu_limits: dict[str, int]) -> None:
    cluster = ctx.options.cluster
    for name, count in gpu_limits.items():
        if count <= 1:
            continue
        strategy = cluster.sharing(name) if cluster else None
        if strategy is None and not res.is_shared(name):
            continue
        fail_gt_one = ctx.options.fail_requests_greater_than_one
        if fail_gt_one is None and strategy == "mps":
            fail_gt_one = True  # v0.20 default for MPS
        strategy_text = strategy or "time-slicing"
        message = (
            f"{name}: {count} asks for {count} replicas of a shared ({strategy_text}) GPU; replicas may come "
            "from one physical GPU, so this adds no compute"
        )
        if fail_gt_one:
            message += (
                f"; with failRequestsGreaterThanOne the plugin rejects it at admission (maximum request "
                f"size for shared resources is 1; found {count})"
            )
        ctx.add(
            "KG005",
            (*where, "resources", "limits", name),
            message,
            f"request {name}: 1 per container, or request full GPUs ({name.removesuffix('.shared')}) from "
            "an unshared pool",
            c.name,
            severity=ERROR if fail_gt_one else WARNING,
        )


def _check_init_gpu(ctx: _Ctx, where: Path, c: Container, gpu_limits: dict[str, int]) -> None:
    app: dict[str, int] = {}
    for container in ctx.workload.spec.containers or []:
        for name, raw in limits(container).items():
            if res.is_gpu(name):
                with contextlib.suppress(quantity.QuantityError):  # KG004 reports it
                    app[name] = app.get(name, 0) + quantity.value(raw)
    detail = ", ".join(f"{n}: {v}" for n, v in sorted(gpu_limits.items()))
    if c.restart_policy == "Always":
        ctx.add(
            "KG007",
            (*where, "resources", "limits"),
            f"sidecar {c.name} holds {detail} for the pod's whole life, on top of the app containers' GPUs",
            "move GPU work into an app container, or drop the sidecar's GPU limit",
            c.name,
        )
        return
    extra = {n: v - app.get(n, 0) for n, v in gpu_limits.items() if v > app.get(n, 0)}
    if extra:
        idle = ", ".join(f"{n}: {v}" for n, v in sorted(extra.items()))
        ctx.add(
            "KG007",
            (*where, "resources", "limits"),
            f"init container {c.name} asks for {detail}, more than the app containers; the pod reserves the "
            f"larger amount for its whole life, so {idle} stay idle after initialisation",
            "give the init container no more GPUs than the app containers use, or none",
            c.name,
        )


def _check_cluster(ctx: _Ctx) -> None:
    cluster = ctx.options.cluster
    assert cluster is not None
    w = ctx.workload
    spec = w.spec
    pod_tolerations: list[Toleration] = list(spec.tolerations or [])
    wanted: dict[str, int] = {}
    for _group, _index, c in _all_containers(w):
        for name, raw in limits(c).items():
            if is_extended_resource_name(name) and (res.is_gpu(name) or _LOOKS_LIKE_GPU.search(name)):
                try:
                    wanted[name] = max(wanted.get(name, 0), quantity.value(raw))
                except quantity.QuantityError:
                    continue
    try:
        effective = res.pod_requests(spec)
    except quantity.QuantityError:
        effective = {}
    for name in sorted(wanted):
        need = effective.get(name, wanted[name])
        offered = cluster.offered.get(name, [])
        if not offered:
            known = ", ".join(sorted(n for n in cluster.offered if res.is_gpu(n))) or "none"
            ctx.add(
                "KG009",
                ("containers",),
                f"no node in the cluster offers {name}; the pod would stay Pending (Insufficient {name})",
                f"request a resource the cluster has (GPU resources offered: {known})",
            )
            continue
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
            continue
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
    if wanted and cluster.plugin_runtime_class and not spec.runtime_class_name:
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


def lint(manifests: Manifests, options: LintOptions | None = None) -> list[Finding]:
    """Every finding in the manifests, in file order."""
    options = options or LintOptions()
    findings: list[Finding] = []
    for problem in manifests.problems:
        rule = RULES["KG000"]
        findings.append(
            Finding(
                rule=rule.id,
                name=rule.name,
                severity=rule.severity,
                file=problem.source.file,
                line=problem.line or problem.source.line(problem.path),
                doc=problem.source.doc,
                object=problem.object,
                container=None,
                path=path_text(problem.path),
                message=problem.message,
                fix="fix the document so that `kubectl apply --dry-run=server -f` accepts it",
            )
        )
    for workload in manifests.workloads:
        ctx = _Ctx(workload, options, findings)
        for group, index, c in _all_containers(workload):
            _check_container(ctx, group, index, c)
        if options.cluster is not None:
            _check_cluster(ctx)
    findings.sort(key=lambda f: (f.file, f.doc, f.line or 0, f.rule))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.severity == ERROR for f in findings) else 0
