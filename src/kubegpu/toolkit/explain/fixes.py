"""What would let a Pending GPU pod schedule: the counterfactual fixes `kubegpu explain` offers.

Each fix answers a "what if" per node: what to free there, its unhealthy GPUs back, a toleration, a
different selector, the node uncordoned; plus the cluster-wide ones (no node offers the resource at
all, the free GPUs are fragmented).
"""

from __future__ import annotations

from typing import Any

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.explain.report import Fix, pool_of
from kubegpu.toolkit.model import Node, Pod, Taint, Toleration, ref, taints
from kubegpu.toolkit.scheduling import (
    DO_NOT_SCHEDULE,
    NODE_AFFINITY,
    NODE_RESOURCES_FIT,
    NODE_UNSCHEDULABLE,
    TAINT_TOLERATION,
    NodeState,
    Outcome,
    PodQuery,
    filter_node,
    tolerates,
)


def fixes(query: PodQuery, states: dict[str, NodeState], outcome: Outcome, gpu_names: list[str]) -> list[Fix]:
    """Every fix, most fundamental first: a missing resource, then resources, then the other filters."""
    return [
        *_missing_resources(states, gpu_names),
        *_resource_fixes(query, states, outcome, gpu_names),
        *_filter_fixes(query, states, outcome),
    ]


def _missing_resources(states: dict[str, NodeState], gpu_names: list[str]) -> list[Fix]:
    found = []
    for name in gpu_names:
        if not any(s.capacity.get(name, 0) > 0 or s.allocatable.get(name, 0) > 0 for s in states.values()):
            offered = sorted(
                {n for s in states.values() for n, v in s.allocatable.items() if res.is_gpu(n) and v}
            )
            found.append(
                Fix(
                    "no-such-resource",
                    f"no node advertises {name}, so no amount of waiting helps; GPU resources offered: "
                    f"{', '.join(offered) or 'none'}. Check the device plugin and its MIG strategy on the "
                    "nodes meant to serve it (kubegpu doctor --cluster).",
                )
            )
    return found


def _resource_fixes(
    query: PodQuery, states: dict[str, NodeState], outcome: Outcome, gpu_names: list[str]
) -> list[Fix]:
    """For the nodes that pass everything but NodeResourcesFit: what exactly would have to change there."""
    free_rows: list[dict[str, Any]] = []
    unhealthy_rows: list[dict[str, Any]] = []
    eligible: list[NodeState] = []
    for node_name, rejection in outcome.rejections.items():
        if rejection.plugin != NODE_RESOURCES_FIT:
            continue
        state = states[node_name]
        eligible.append(state)
        row = _free_row(query, node_name, state)
        if row is not None:
            free_rows.append(row)
        unhealthy_rows.extend(_unhealthy_rows(query.requests, node_name, state, gpu_names))
    found = []
    if free_rows:
        free_rows.sort(key=lambda r: (r["gpus_to_free"], r["node"]))
        best = free_rows[0]
        what = ", ".join(f"{v} {n}" for n, v in best["free"].items())
        found.append(
            Fix(
                "free-gpus",
                f"{len(free_rows)} node(s) would take the pod once resources are freed there; the "
                f"cheapest is {best['node']} (free {what}).",
                free_rows,
            )
        )
    if unhealthy_rows:
        fitting = [r for r in unhealthy_rows if r["would_fit"]]
        lead = f"{len(fitting)} of them would fit the pod with those GPUs healthy. " if fitting else ""
        found.append(
            Fix(
                "unhealthy-gpus",
                f"{len(unhealthy_rows)} node(s) have GPUs the device plugin reports unhealthy (capacity > "
                f"allocatable), hiding capacity. {lead}Check the node for XID errors (kubegpu doctor on "
                "the node) and restart or replace the GPU; kubegpu's plugin re-advertises a recovered GPU "
                "by itself.",
                unhealthy_rows,
            )
        )
    return found + _fragmentation_fixes(query.requests, eligible, gpu_names)


def _free_row(query: PodQuery, node_name: str, state: NodeState) -> dict[str, Any] | None:
    """What to free on a node big enough for the pod, and which pods hold it; None if it is too small."""
    reqs = query.requests
    short = {n: reqs[n] - state.free(n) for n in reqs if reqs[n] > 0 and reqs[n] > state.free(n)}
    if res.PODS not in short and state.pod_count + 1 > state.allocatable.get(res.PODS, 0):
        short[res.PODS] = state.pod_count + 1 - state.allocatable.get(res.PODS, 0)
    if any(reqs[n] > state.allocatable.get(n, 0) for n in reqs):
        return None
    holders = sorted(state.gpu_pods, key=lambda p: (p[0].spec.priority or 0, ref(p[0].metadata)))
    pod_priority = query.pod.spec.priority or 0
    return {
        "node": node_name,
        "free": {n: res.display(n, v) for n, v in short.items()},
        "gpus_to_free": sum(v for n, v in short.items() if res.is_gpu(n)),
        "holders": [ref(p.metadata) for p, _ in holders][:5],
        "lower_priority_holders": [
            ref(p.metadata) for p, _ in holders if (p.spec.priority or 0) < pod_priority
        ],
    }


def _unhealthy_rows(
    reqs: dict[str, int], node_name: str, state: NodeState, gpu_names: list[str]
) -> list[dict[str, Any]]:
    """The node's GPU resources where unhealthy devices hide capacity the pod would need."""
    rows = []
    for name in gpu_names:
        hidden = state.capacity.get(name, 0) - state.allocatable.get(name, 0)
        if hidden > 0 and reqs[name] > state.free(name) and state.capacity.get(name, 0) >= reqs[name]:
            with_healthy = state.capacity.get(name, 0) - state.requested.get(name, 0)
            rows.append(
                {
                    "node": node_name,
                    "resource": name,
                    "unhealthy": hidden,
                    "free_now": max(0, state.free(name)),
                    "free_if_healthy": max(0, with_healthy),
                    "would_fit": with_healthy >= reqs[name],
                }
            )
    return rows


def _fragmentation_fixes(reqs: dict[str, int], eligible: list[NodeState], gpu_names: list[str]) -> list[Fix]:
    found = []
    for name in gpu_names:
        want = reqs.get(name, 0)
        offering = [s for s in eligible if s.allocatable.get(name, 0) > 0]
        free_eligible = [max(0, s.free(name)) for s in offering]
        if want > 1 and sum(free_eligible) >= want and max(free_eligible, default=0) < want:
            found.append(
                Fix(
                    "fragmentation",
                    f"{sum(free_eligible)} {name} are free across the {len(offering)} node(s) that offer it "
                    f"and the pod may use, but no single node has {want}: the free GPUs are fragmented "
                    f"(largest free block {max(free_eligible)}). Pack smaller pods together (drain or "
                    "reschedule the pods on the node with the fewest GPUs to free), "
                    "or split the job across pods.",
                )
            )
    return found


def _filter_fixes(query: PodQuery, states: dict[str, NodeState], outcome: Outcome) -> list[Fix]:
    """Nodes blocked by something other than resources that would fit once that is changed."""
    by_taint: dict[tuple[str, str, str], list[str]] = {}
    by_selector: list[str] = []
    cordoned: list[str] = []
    for node_name, rejection in outcome.rejections.items():
        state = states[node_name]
        if rejection.plugin == TAINT_TOLERATION:
            blocking = _blocking_taints(state.node, query.tolerations)
            if filter_node(_with_tolerations(query, blocking), state) is None:
                for t in blocking:
                    by_taint.setdefault((t.key, t.value or "", t.effect), []).append(node_name)
        elif (
            rejection.plugin == NODE_AFFINITY
            and filter_node(query, state, frozenset({NODE_AFFINITY})) is None
        ):
            by_selector.append(node_name)
        elif (
            rejection.plugin == NODE_UNSCHEDULABLE
            and filter_node(query, state, frozenset({NODE_UNSCHEDULABLE})) is None
        ):
            cordoned.append(node_name)
    found = [
        _toleration_fix(taint, names) for taint, names in sorted(by_taint.items(), key=lambda kv: -len(kv[1]))
    ]
    if by_selector:
        found.append(
            Fix(
                "selector",
                f"{len(by_selector)} node(s) ({_few(by_selector)}) have room but do not match the pod's "
                "nodeSelector/affinity "
                f"({_selector_text(query.pod)}); relax it if those nodes would do.",
                [{"node": n, "pool": pool_of(states[n].node)} for n in by_selector],
            )
        )
    if cordoned:
        found.append(
            Fix(
                "uncordon",
                f"{len(cordoned)} cordoned node(s) would take the pod: kubectl uncordon {' '.join(cordoned)} "
                "(if the maintenance is over).",
                [{"node": n} for n in cordoned],
            )
        )
    return found


def _toleration_fix(taint: tuple[str, str, str], names: list[str]) -> Fix:
    key, value, effect = taint
    tol = (
        f'{{key: {key}, operator: Equal, value: "{value}", effect: {effect}}}'
        if value
        else f"{{key: {key}, operator: Exists, effect: {effect}}}"
    )
    return Fix(
        "toleration",
        f"{len(names)} node(s) ({_few(names)}) would take the pod if it tolerated "
        f"{key}={value}:{effect}; if the pod belongs there, add to its tolerations: {tol}",
        [{"node": n} for n in names],
    )


def _with_tolerations(query: PodQuery, extra: list[Taint]) -> PodQuery:
    tols = [
        *query.tolerations,
        *(Toleration(key=t.key, operator="Equal", value=t.value or "", effect=t.effect) for t in extra),
    ]
    return PodQuery(query.pod, query.requests, tols, query.prefilter_names)


def _blocking_taints(node: Node, tols: list[Toleration]) -> list[Taint]:
    return [t for t in taints(node) if t.effect in DO_NOT_SCHEDULE and not any(tolerates(x, t) for x in tols)]


def _few(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _selector_text(pod: Pod) -> str:
    parts = [f"{k}={v}" for k, v in (pod.spec.node_selector or {}).items()]
    if pod.spec.affinity and pod.spec.affinity.node_affinity and pod.spec.affinity.node_affinity.required:
        parts.append("required node affinity")
    return ", ".join(parts) or "none"
