"""`kubegpu explain`: why a GPU pod is Pending, and what would let it schedule.

Runs the scheduler's filters (see `scheduling.py`) on every node, DynamicResources for a pod with DRA
claims (`explain.dra`) and for extended resources a DeviceClass bridges (`explain.bridge`), then asks
counterfactual questions per node: would it fit with N GPUs freed, with its unhealthy GPUs back, with a
toleration, with a different selector, uncordoned? Fragmentation is measured cluster-wide per request size.

The fixes are worked out in `explain.fixes`; what is reported, in `explain.report`.
"""

from __future__ import annotations

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.explain.bridge import bridge_filter
from kubegpu.toolkit.explain.dra import DraExplanation, dra_filter
from kubegpu.toolkit.explain.fixes import fixes
from kubegpu.toolkit.explain.report import Explanation, Fix, FragmentationRow, GpuCount, NodeVerdict, pool_of
from kubegpu.toolkit.model import Pod, condition, node_ready, ref
from kubegpu.toolkit.scheduling import (
    NODE_RESOURCES_FIT,
    NodeState,
    Outcome,
    PodQuery,
    node_states,
    run_filters,
    same_summary,
)
from kubegpu.toolkit.snapshot import Snapshot

SIZES = (1, 2, 4, 8)


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


def _status(pod: Pod, phase: str, outcome: Outcome) -> tuple[str, list[str]]:
    """Where the pod stands (pending-unschedulable, would-fit, bound, finished, admission-rejected), and
    the notes that say what that means and what else holds it."""
    notes: list[str] = []
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
    return status, notes


def explain(snapshot: Snapshot, pod: Pod) -> Explanation:
    meta = pod.metadata
    states = node_states(snapshot.nodes, snapshot.pods, skip=pod)
    query = PodQuery.of(pod)
    gpu_names = res.gpu_names(query.requests)
    outcome = run_filters(query, states)
    dra = dra_filter(snapshot, pod, outcome, {name: state.node for name, state in states.items()})
    bridged = bridge_filter(snapshot, pod, query, states, outcome)  # nvidia.com/gpu served through DRA
    if bridged is not None:
        dra = bridged if dra is None else dra.merged(bridged)
    recorded = condition(pod, "PodScheduled")
    recorded_message = recorded.message if recorded and recorded.status == "False" else None
    if recorded_message is None:  # older snapshots, or one with `events` added to the kubectl command
        recorded_message = _last_failed_scheduling(snapshot, pod)
    phase = pod.status.phase or "Pending"
    status, notes = _status(pod, phase, outcome)
    message = outcome.message
    if recorded_message and message and not same_summary(recorded_message, message):
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
        fixes=(fixes(query, states, outcome, gpu_names) + dra_fixes(dra)) if not outcome.feasible else [],
        fragmentation={n: fragmentation(states, n) for n in gpu_names},
        notes=notes + (dra.notes if dra else []),
        dra=dra,
    )


def dra_fixes(dra: DraExplanation | None) -> list[Fix]:
    """The DRA analogue of freeing GPUs: nodes where the claims fit once other claims release devices."""
    if dra is None or not dra.free_to_fit:
        return []
    where = ", ".join(f"{r['node']} (held by {', '.join(r['held_by'])})" for r in dra.free_to_fit[:10])
    return [
        Fix(
            "free-devices",
            f"the pod's claims fit on {len(dra.free_to_fit)} node(s) once the claims holding devices there "
            f"are released (their pods finish or are deleted): {where}",
            dra.free_to_fit,
        )
    ]
