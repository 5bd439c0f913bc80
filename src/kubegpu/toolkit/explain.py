"""`kubegpu explain`: why a GPU pod is Pending, and what would let it schedule.

Runs the scheduler's filters (see `scheduling.py`) on every node, then asks counterfactual questions
per node: would it fit with N GPUs freed, with its unhealthy GPUs back, with a toleration, with a
different selector, uncordoned? Fragmentation is measured cluster-wide per request size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.model import Node, Pod, Taint, Toleration, condition, node_ready, ref, taints
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
    node_states,
    run_filters,
    tolerates,
)
from kubegpu.toolkit.snapshot import Snapshot

SIZES = (1, 2, 4, 8)
POOL_LABELS = (
    "pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "nvidia.com/gpu.product",
    "node.kubernetes.io/instance-type",
)


def pool_of(node: Node) -> str:
    node_labels = node.metadata.labels or {}
    for key in POOL_LABELS:
        if key in node_labels:
            return node_labels[key]
    return "-"


@dataclass
class GpuCount:
    capacity: int
    allocatable: int
    requested: int

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)


@dataclass
class NodeVerdict:
    node: str
    pool: str
    fits: bool
    plugin: str | None
    reasons: list[str]
    gpus: dict[str, GpuCount]


@dataclass
class Fix:
    kind: (
        str  # free-gpus, unhealthy-gpus, fragmentation, toleration, selector, uncordon, no-such-resource, ...
    )
    summary: str
    nodes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FragmentationRow:
    size: int
    free: int
    fits: int  # how many pods of this size the free GPUs can take
    stranded: int  # free GPUs no pod of this size can use
    percent: float  # stranded / free
    largest_block: int


@dataclass
class Explanation:
    pod: str
    phase: str
    node_name: str | None
    status: str  # pending-unschedulable, would-fit, bound, finished, admission-rejected
    requests: dict[str, str]
    gpu_resources: list[str]
    message: str | None
    recorded_message: str | None
    feasible_nodes: list[str]
    nodes: list[NodeVerdict]
    fixes: list[Fix]
    fragmentation: dict[str, list[FragmentationRow]]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "pending-unschedulable" else 0

    def to_json(self) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies, which is most of the cost with 5,000 nodes.
        return {
            "pod": self.pod,
            "phase": self.phase,
            "node_name": self.node_name,
            "status": self.status,
            "requests": self.requests,
            "gpu_resources": self.gpu_resources,
            "message": self.message,
            "recorded_message": self.recorded_message,
            "feasible_nodes": self.feasible_nodes,
            "nodes": [
                {
                    "node": v.node,
                    "pool": v.pool,
                    "fits": v.fits,
                    "plugin": v.plugin,
                    "reasons": v.reasons,
                    "gpus": {
                        n: {
                            "capacity": c.capacity,
                            "allocatable": c.allocatable,
                            "requested": c.requested,
                            "free": c.free,
                        }
                        for n, c in v.gpus.items()
                    },
                }
                for v in self.nodes
            ],
            "fixes": [asdict(f) for f in self.fixes],
            "fragmentation": {n: [asdict(r) for r in rows] for n, rows in self.fragmentation.items()},
            "notes": self.notes,
            "exit_code": self.exit_code,
        }


def _gpu_counts(state: NodeState, names: list[str]) -> dict[str, GpuCount]:
    return {
        n: GpuCount(state.capacity.get(n, 0), state.allocatable.get(n, 0), state.requested.get(n, 0))
        for n in names
    }


def fragmentation(states: dict[str, NodeState], resource: str) -> list[FragmentationRow]:
    """Per request size: of the free `resource` on schedulable nodes, how much no pod of that size can use."""
    frees = [
        max(0, s.free(resource))
        for s in states.values()
        if s.allocatable.get(resource, 0) > 0
        and not s.node.spec.unschedulable
        and node_ready(s.node) is not False
    ]
    total = sum(frees)
    rows = []
    for size in SIZES:
        fits = sum(f // size for f in frees)
        stranded = total - fits * size
        rows.append(
            FragmentationRow(
                size,
                total,
                fits,
                stranded,
                round(100.0 * stranded / total, 1) if total else 0.0,
                max(frees, default=0),
            )
        )
    return rows


def _with_tolerations(query: PodQuery, extra: list[Taint]) -> PodQuery:
    tols = [
        *query.tolerations,
        *(Toleration(key=t.key, operator="Equal", value=t.value or "", effect=t.effect) for t in extra),
    ]
    return PodQuery(query.pod, query.requests, tols, query.prefilter_names)


def _blocking_taints(node: Node, tols: list[Toleration]) -> list[Taint]:
    return [t for t in taints(node) if t.effect in DO_NOT_SCHEDULE and not any(tolerates(x, t) for x in tols)]


def _fixes(
    query: PodQuery, states: dict[str, NodeState], outcome: Outcome, gpu_names: list[str]
) -> list[Fix]:
    fixes: list[Fix] = []
    reqs = query.requests
    for name in gpu_names:
        if not any(s.capacity.get(name, 0) > 0 or s.allocatable.get(name, 0) > 0 for s in states.values()):
            offered = sorted(
                {n for s in states.values() for n, v in s.allocatable.items() if res.is_gpu(n) and v}
            )
            fixes.append(
                Fix(
                    "no-such-resource",
                    f"no node advertises {name}, so no amount of waiting helps; GPU resources offered: "
                    f"{', '.join(offered) or 'none'}. Check the device plugin and its MIG strategy on the "
                    "nodes meant to serve it (kubegpu doctor --cluster).",
                )
            )

    # Nodes that pass everything but NodeResourcesFit: what exactly would have to be freed there.
    free_rows: list[dict[str, Any]] = []
    unhealthy_rows: list[dict[str, Any]] = []
    eligible: list[NodeState] = []
    for node_name, rejection in outcome.rejections.items():
        if rejection.plugin != NODE_RESOURCES_FIT:
            continue
        state = states[node_name]
        eligible.append(state)
        short = {n: reqs[n] - state.free(n) for n in reqs if reqs[n] > 0 and reqs[n] > state.free(n)}
        if res.PODS not in short and state.pod_count + 1 > state.allocatable.get(res.PODS, 0):
            short[res.PODS] = state.pod_count + 1 - state.allocatable.get(res.PODS, 0)
        too_small = [n for n in reqs if reqs[n] > state.allocatable.get(n, 0)]
        if not too_small:
            holders = sorted(state.gpu_pods, key=lambda p: (p[0].spec.priority or 0, ref(p[0].metadata)))
            pod_priority = query.pod.spec.priority or 0
            free_rows.append(
                {
                    "node": node_name,
                    "free": {n: res.display(n, v) for n, v in short.items()},
                    "gpus_to_free": sum(v for n, v in short.items() if res.is_gpu(n)),
                    "holders": [ref(p.metadata) for p, _ in holders][:5],
                    "lower_priority_holders": [
                        ref(p.metadata) for p, _ in holders if (p.spec.priority or 0) < pod_priority
                    ],
                }
            )
        for name in gpu_names:
            hidden = state.capacity.get(name, 0) - state.allocatable.get(name, 0)
            if hidden > 0 and reqs[name] > state.free(name) and state.capacity.get(name, 0) >= reqs[name]:
                with_healthy = state.capacity.get(name, 0) - state.requested.get(name, 0)
                unhealthy_rows.append(
                    {
                        "node": node_name,
                        "resource": name,
                        "unhealthy": hidden,
                        "free_now": max(0, state.free(name)),
                        "free_if_healthy": max(0, with_healthy),
                        "would_fit": with_healthy >= reqs[name],
                    }
                )
    if free_rows:
        free_rows.sort(key=lambda r: (r["gpus_to_free"], r["node"]))
        best = free_rows[0]
        what = ", ".join(f"{v} {n}" for n, v in best["free"].items())
        fixes.append(
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
        fixes.append(
            Fix(
                "unhealthy-gpus",
                f"{len(unhealthy_rows)} node(s) have GPUs the device plugin reports unhealthy (capacity > "
                f"allocatable), hiding capacity. {lead}Check the node for XID errors (kubegpu doctor on "
                "the node) and restart or replace the GPU; kubegpu's plugin re-advertises a recovered GPU "
                "by itself.",
                unhealthy_rows,
            )
        )
    for name in gpu_names:
        want = reqs.get(name, 0)
        offering = [s for s in eligible if s.allocatable.get(name, 0) > 0]
        free_eligible = [max(0, s.free(name)) for s in offering]
        if want > 1 and sum(free_eligible) >= want and max(free_eligible, default=0) < want:
            fixes.append(
                Fix(
                    "fragmentation",
                    f"{sum(free_eligible)} {name} are free across the {len(offering)} node(s) that offer it "
                    f"and the pod may use, but no single node has {want}: the free GPUs are fragmented "
                    f"(largest free block {max(free_eligible)}). Pack smaller pods together (drain or "
                    "reschedule the pods on the node with the fewest GPUs to free), "
                    "or split the job across pods.",
                )
            )

    # Nodes blocked by something other than resources that would fit once that is changed.
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
    for (key, value, effect), names in sorted(by_taint.items(), key=lambda kv: -len(kv[1])):
        tol = (
            f'{{key: {key}, operator: Equal, value: "{value}", effect: {effect}}}'
            if value
            else f"{{key: {key}, operator: Exists, effect: {effect}}}"
        )
        fixes.append(
            Fix(
                "toleration",
                f"{len(names)} node(s) ({_few(names)}) would take the pod if it tolerated "
                f"{key}={value}:{effect}; if the pod belongs there, add to its tolerations: {tol}",
                [{"node": n} for n in names],
            )
        )
    if by_selector:
        fixes.append(
            Fix(
                "selector",
                f"{len(by_selector)} node(s) ({_few(by_selector)}) have room but do not match the pod's "
                "nodeSelector/affinity "
                f"({_selector_text(query.pod)}); relax it if those nodes would do.",
                [{"node": n, "pool": pool_of(states[n].node)} for n in by_selector],
            )
        )
    if cordoned:
        fixes.append(
            Fix(
                "uncordon",
                f"{len(cordoned)} cordoned node(s) would take the pod: kubectl uncordon {' '.join(cordoned)} "
                "(if the maintenance is over).",
                [{"node": n} for n in cordoned],
            )
        )
    return fixes


def _few(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _selector_text(pod: Pod) -> str:
    parts = [f"{k}={v}" for k, v in (pod.spec.node_selector or {}).items()]
    if pod.spec.affinity and pod.spec.affinity.node_affinity and pod.spec.affinity.node_affinity.required:
        parts.append("required node affinity")
    return ", ".join(parts) or "none"


def _verdicts(states: dict[str, NodeState], outcome: Outcome, gpu_names: list[str]) -> list[NodeVerdict]:
    verdicts = []
    for node_name, state in states.items():
        rejection = outcome.rejections.get(node_name)
        verdicts.append(
            NodeVerdict(
                node_name,
                pool_of(state.node),
                rejection is None,
                rejection.plugin if rejection else None,
                list(rejection.reasons) if rejection else [],
                _gpu_counts(state, gpu_names),
            )
        )
    order = {None: 0, NODE_RESOURCES_FIT: 1}
    verdicts.sort(key=lambda v: (order.get(v.plugin, 2), v.plugin or "", v.node))
    return verdicts


def _last_failed_scheduling(snapshot: Snapshot, pod: Pod) -> str | None:
    meta = pod.metadata
    messages = [
        e.message
        for e in snapshot.events
        if e.reason == "FailedScheduling"
        and e.involved_object.name == meta.name
        and e.involved_object.namespace == meta.namespace
    ]
    return messages[-1] if messages else None


def explain(snapshot: Snapshot, pod: Pod) -> Explanation:
    meta = pod.metadata
    states = node_states(snapshot.nodes, snapshot.pods, skip=pod)
    query = PodQuery.of(pod)
    gpu_names = res.gpu_names(query.requests)
    outcome = run_filters(query, states)
    recorded = condition(pod, "PodScheduled")
    recorded_message = recorded.message if recorded and recorded.status == "False" else None
    if recorded_message is None:  # older snapshots, or one with `events` added to the kubectl command
        recorded_message = _last_failed_scheduling(snapshot, pod)
    notes: list[str] = []
    phase = pod.status.phase or "Pending"
    if pod.status.reason == "UnexpectedAdmissionError":
        status = "admission-rejected"
        notes.append(
            f"the kubelet on {pod.spec.node_name} rejected the pod at admission: {pod.status.message}. "
            "This happens when a pod arrives right after a kubelet restart, before the device plugin has "
            "re-registered; delete the pod so its controller recreates it, and check the plugin's "
            "registration on that node (kubegpu doctor)."
        )
    elif phase in ("Succeeded", "Failed"):
        status = "finished"
        notes.append(f"the pod has finished ({phase}); it holds no resources.")
    elif pod.spec.node_name:
        status = "bound"
        notes.append(
            f"the pod is already bound to {pod.spec.node_name} ({phase}); the scheduler is done with it. "
            "The filters below show how the cluster looks for a pod like it now."
        )
    else:
        status = "pending-unschedulable" if not outcome.feasible else "would-fit"
        if outcome.feasible:
            notes.append(
                f"the pod fits {len(outcome.feasible)} node(s) now (e.g. {', '.join(outcome.feasible[:3])}); "
                "if it is still Pending the cluster changed since the last attempt, or something outside "
                "these filters (volumes, pod affinity, topology spread, quota) holds it."
            )
    if pod.spec.scheduling_gates:
        gates = ", ".join(g.name for g in pod.spec.scheduling_gates)
        notes.append(
            f"the pod has schedulingGates ({gates}); the scheduler will not try it until they are removed."
        )
    if pod.spec.scheduler_name and pod.spec.scheduler_name != "default-scheduler":
        notes.append(
            f"the pod uses scheduler {pod.spec.scheduler_name!r}; its filters may differ from the default."
        )
    message = outcome.message
    if recorded_message and message and recorded_message.split(" preemption:")[0].strip() != message:
        notes.append(
            "the scheduler's last recorded message differs from what the snapshot gives now; the cluster "
            "has changed since that attempt."
        )
    return Explanation(
        pod=ref(meta),
        phase=phase,
        node_name=pod.spec.node_name,
        status=status,
        requests={n: res.display(n, v) for n, v in sorted(query.requests.items()) if v},
        gpu_resources=gpu_names,
        message=message,
        recorded_message=recorded_message,
        feasible_nodes=list(outcome.feasible),
        nodes=_verdicts(states, outcome, gpu_names),
        fixes=_fixes(query, states, outcome, gpu_names) if not outcome.feasible else [],
        fragmentation={n: fragmentation(states, n) for n in gpu_names},
        notes=notes,
    )
