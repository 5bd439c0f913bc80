"""`kubegpu lint`'s rules for one container: its GPU quantities, names, sharing, MIG mix and env."""

from __future__ import annotations

import contextlib
import re

from kubegpu.common import quantity
from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.lint import apierrors
from kubegpu.toolkit.lint.rules import ERROR, LOOKS_LIKE_GPU, WARNING, LintContext
from kubegpu.toolkit.manifests import Path, Workload
from kubegpu.toolkit.model import Container, limits, requests

# Names NVIDIA's plugin can serve: nvidia.com/gpu, nvidia.com/mig-<profile>, optionally renamed .shared.
_VALID_NVIDIA = re.compile(
    r"^nvidia\.com/(gpu|mig-(\d+c\.)?\d+g\.\d+gb(\.(me|gfx|all|me\.all))*)(\.shared)?$"
)


def _quantity_checks(ctx: LintContext, where: Path, c: Container) -> dict[str, dict[str, int | None]]:
    """KG004/KG015/KG003 per quantity; returns parsed nanos {'requests': {...}, 'limits': {...}} (None =
    bad or negative: what the API server refuses counts for nothing)."""
    parsed: dict[str, dict[str, int | None]] = {}
    w = ctx.workload
    for part, amounts in (("requests", requests(c)), ("limits", limits(c))):
        parsed[part] = {}
        for name, raw in amounts.items():
            qpath = (*where, "resources", part, name)
            try:
                nanos = quantity.parse_nanos(raw)
            except quantity.QuantityError as exc:
                refused = (
                    "; the API server refuses the object: "
                    + apierrors.cannot_decode(w.kind, w.api_version, exc.apiserver)
                    if exc.apiserver
                    else ""
                )
                ctx.add(
                    "KG004",
                    qpath,
                    f"{name}: {exc}{refused}",
                    "write a Kubernetes quantity: 1, 500m, 2Gi, 1e3",
                    c.name,
                )
                parsed[part][name] = None
                continue
            if nanos < 0:
                ctx.add(
                    "KG015",
                    qpath,
                    f"{part}.{name} is {raw!r}, a negative amount; the API server refuses it: "
                    + apierrors.invalid(
                        _field(ctx, where, part, name), quantity.canonical(raw), apierrors.IS_NEGATIVE
                    ),
                    f"ask for 0 or more; for GPUs a whole number such as {name}: 1"
                    if is_extended_resource_name(name)
                    else "ask for 0 or more, e.g. 500m of cpu or 2Gi of memory",
                    c.name,
                )
                parsed[part][name] = None
            else:
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
                    "the API server refuses it: "
                    + apierrors.invalid(
                        _field(ctx, where, part, name), quantity.canonical(raw), apierrors.NOT_INTEGER
                    ),
                    f"use a whole number; to give a container part of a GPU, {share}",
                    c.name,
                )
    return parsed


def _field(ctx: LintContext, where: Path, part: str, name: str) -> str:
    """The API server's field path of a quantity, for its error text (built only for a finding: 60,000 pods
    have 240,000 quantities and few findings)."""
    return apierrors.field_path(ctx.api_path((*where, "resources", part)), name)


def _count(nanos: int | None) -> int:
    return quantity.ceil_div(nanos or 0, quantity.NANO)


def check_container(ctx: LintContext, group: str, index: int, c: Container) -> None:
    where: Path = (group, index)
    parsed = _quantity_checks(ctx, where, c)
    reqs, lims = parsed["requests"], parsed["limits"]
    gpu_names = sorted({n for n in (*reqs, *lims) if res.is_gpu(n) or LOOKS_LIKE_GPU.search(n)})
    for name in gpu_names:
        _check_gpu_resource(ctx, where, c, name, reqs, lims)
    gpu_limits = {n: _count(v) for n, v in lims.items() if res.is_gpu(n) and v}
    _check_sharing(ctx, where, c, gpu_limits)
    _check_mig_mix(ctx, where, c, gpu_limits)
    if group == "initContainers" and gpu_limits:
        _check_init_gpu(ctx, where, c, gpu_limits)
    _check_visible_devices(ctx, where, c)
    if c.resources is not None and gpu_limits and _has_claims(ctx.workload):
        ctx.add(
            "KG014",
            (*where, "resources"),
            "the pod uses DRA resourceClaims and device-plugin GPUs together; the two allocators do not "
            "know about each other and may hand out the same GPU",
            "use either DRA claims or nvidia.com/* limits for GPUs, not both",
            c.name,
        )


def _check_gpu_resource(
    ctx: LintContext,
    where: Path,
    c: Container,
    name: str,
    reqs: dict[str, int | None],
    lims: dict[str, int | None],
) -> None:
    """KG009 (the name), KG001/KG002 (requests against limits) for one GPU-looking resource."""
    if not is_extended_resource_name(name) and name not in (res.CPU, res.MEMORY, res.EPHEMERAL):
        ctx.add(
            "KG009",
            (*where, "resources"),
            f"{name!r} is not a valid extended resource name; the API "
            "server rejects it (must be a standard resource type or fully qualified)",
            "use nvidia.com/gpu (or the exact name the device plugin advertises)",
            c.name,
        )
        return
    if not is_extended_resource_name(name):
        return
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
    elif name in reqs and name in lims and None not in (reqs[name], lims[name]) and reqs[name] != lims[name]:
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


def _check_mig_mix(ctx: LintContext, where: Path, c: Container, gpu_limits: dict[str, int]) -> None:
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


def _check_visible_devices(ctx: LintContext, where: Path, c: Container) -> None:
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


def _has_claims(w: Workload) -> bool:
    return bool(w.spec.resource_claims)


def _check_sharing(ctx: LintContext, where: Path, c: Container, gpu_limits: dict[str, int]) -> None:
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


def _check_init_gpu(ctx: LintContext, where: Path, c: Container, gpu_limits: dict[str, int]) -> None:
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
