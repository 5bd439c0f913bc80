"""The kube-scheduler filters that decide where a GPU pod can go, with the scheduler's exact wording.

Filters run per node in the default profile's order (NodeUnschedulable, NodeName, TaintToleration,
NodeAffinity, then NodeResourcesFit) and a node stops at the first plugin that rejects it, as the
framework does. The summary is `FitError.Error()` of kube-scheduler 1.31+: reasons counted per node,
rendered "<count> <reason>", sorted as strings, joined by ", ". The post-filter part (preemption's verdict,
and since 1.34 the DynamicResources plugin's) is not produced; `filter_summary` cuts it from a recorded
message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from kubegpu.toolkit import pod_requests as res
from kubegpu.toolkit.model import (
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodLite,
    PodSpec,
    PodSpecLite,
    ResourceRequirements,
    Taint,
    Toleration,
    allocatable,
    capacity,
    taints,
)

# Reason strings, byte for byte as kube-scheduler writes them.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_PREFILTER_AFFINITY = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
REASON_AFFINITY_CONFLICT = "pod affinity terms conflict"
REASON_TOO_MANY_PODS = "Too many pods"
NO_NODES = "no nodes available to schedule pods"

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
DO_NOT_SCHEDULE = ("NoSchedule", "NoExecute")

# Plugin names, in the order the default profile runs them.
NODE_UNSCHEDULABLE = "NodeUnschedulable"
NODE_NAME = "NodeName"
TAINT_TOLERATION = "TaintToleration"
NODE_AFFINITY = "NodeAffinity"
NODE_RESOURCES_FIT = "NodeResourcesFit"


def filter_summary(message: str) -> str:
    """The filter summary of a FailedScheduling message the scheduler recorded, without its post-filter part.

    FitError.Error() (kube-scheduler 1.29 to 1.36) is "0/<n> nodes are available: <reasons>." followed, when
    PostFilter plugins ran, by " <their messages, joined by ', '>.": " preemption: 0/<n> nodes are available:
    ... for incoming pod.." up to 1.33; since 1.34, where DynamicResources is on by default, its message comes
    first (" no new claims to deallocate, preemption: ..."). Everything after the summary's first ". " is the
    post-filter part, whatever its plugins (no scheduler reason holds ". "); "no nodes available to schedule
    pods" has none.
    """
    head, separator, _ = message.strip().partition(". ")
    return head + "." if separator else message.strip()


def same_summary(recorded: str, summary: str) -> bool:
    """Whether a recorded FailedScheduling message is `summary` (as `run_filters` words it) plus a post-filter
    part, or `summary` itself."""
    recorded = recorded.strip()
    return recorded == summary or recorded.startswith(summary + " ")


def untolerated_taint_reason(taint: Taint) -> str:
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value or ''}}}"


# --- taints and tolerations --------------------------------------------------------------------------


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """`Toleration.ToleratesTaint`: empty effect/key match any; operator "" means Equal."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    operator = toleration.operator or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.value or "") == (taint.value or "")
    return False


def untolerated(
    node_taints: Iterable[Taint],
    pod_tolerations: Sequence[Toleration],
    effects: Sequence[str] = DO_NOT_SCHEDULE,
) -> Taint | None:
    """The first taint (in node order) with a blocking effect that no toleration tolerates."""
    for taint in node_taints:
        if taint.effect in effects and not any(tolerates(t, taint) for t in pod_tolerations):
            return taint
    return None


# --- node selector and required node affinity --------------------------------------------------------


def _int(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


def _label_requirement(req: NodeSelectorRequirement, node_labels: dict[str, str]) -> bool | None:
    """Whether the labels satisfy one matchExpressions entry; None when the entry is invalid."""
    values = req.values or []
    op = req.operator
    if op in ("In", "NotIn"):
        if not values:
            return None
        has = req.key in node_labels
        if op == "In":
            return has and node_labels[req.key] in values
        return not has or node_labels[req.key] not in values
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        return (req.key in node_labels) == (op == "Exists")
    if op in ("Gt", "Lt"):
        if len(values) != 1 or _int(values[0]) is None:
            return None
        if req.key not in node_labels:
            return False
        have = _int(node_labels[req.key])
        if have is None:
            return False
        want = _int(values[0])
        assert want is not None
        return have > want if op == "Gt" else have < want
    return None


def _field_requirement(req: NodeSelectorRequirement, node_name: str) -> bool | None:
    values = req.values or []
    if req.key != "metadata.name" or req.operator not in ("In", "NotIn") or len(values) != 1:
        return None
    return (node_name == values[0]) == (req.operator == "In")


def term_matches(term: NodeSelectorTerm, node: Node) -> bool:
    """A nodeSelectorTerm ANDs its requirements; an empty or invalid term matches nothing."""
    exprs, fields = term.match_expressions or [], term.match_fields or []
    if not exprs and not fields:
        return False
    node_labels = node.metadata.labels or {}
    for req in exprs:
        if not _label_requirement(req, node_labels):
            return False
    return all(_field_requirement(req, node.metadata.name) for req in fields)


def required_terms(spec: PodSpec) -> list[NodeSelectorTerm] | None:
    affinity = spec.affinity.node_affinity if spec.affinity else None
    if affinity is None or affinity.required is None:
        return None
    return affinity.required.node_selector_terms or []


def selector_matches(spec: PodSpec, node: Node) -> bool:
    """nodeSelector (every label equal) and required node affinity (any term)."""
    node_labels = node.metadata.labels or {}
    for key, val in (spec.node_selector or {}).items():
        if node_labels.get(key) != val:
            return False
    terms = required_terms(spec)
    if terms is None:
        return True
    return any(term_matches(term, node) for term in terms)


def prefilter_node_names(spec: PodSpec) -> set[str] | None:
    """NodeAffinity's PreFilter: when every term pins `metadata.name`, only those nodes are tried
    (DaemonSet pods look like this). None means all nodes."""
    terms = required_terms(spec)
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        term_names: set[str] | None = None
        for req in term.match_fields or []:
            if req.key == "metadata.name" and req.operator == "In":
                values = set(req.values or [])
                term_names = values if term_names is None else term_names & values
        if term_names is None:
            return None
        names |= term_names
    return names


# --- node state --------------------------------------------------------------------------------------


@dataclass(slots=True)
class NodeState:
    """A node as the scheduler sees it: allocatable, capacity, and what bound pods already request."""

    node: Node
    allocatable: dict[str, int]
    capacity: dict[str, int]
    requested: dict[str, int] = field(default_factory=dict)
    pod_count: int = 0
    gpu_pods: list[tuple[PodLite, dict[str, int]]] = field(default_factory=list)  # pods holding GPU resources

    @property
    def name(self) -> str:
        return self.node.metadata.name

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


def node_states(
    nodes: Iterable[Node], pods: Iterable[PodLite], skip: PodLite | None = None
) -> dict[str, NodeState]:
    """Every node's state; requests are summed over the non-terminated pods bound to it."""
    states = {
        n.metadata.name: NodeState(n, res.node_amounts(allocatable(n)), res.node_amounts(capacity(n)))
        for n in nodes
    }
    # Most pods repeat a handful of request shapes; compute each shape once.
    shapes: dict[tuple[object, ...], dict[str, int]] = {}
    for pod in pods:
        spec = pod.spec
        node_name = spec.node_name
        if not node_name or pod is skip or pod.status.phase in ("Succeeded", "Failed"):
            continue
        state = states.get(node_name)
        if state is None:
            continue
        state.pod_count += 1
        reqs = _cached_requests(spec, shapes)
        if not reqs:
            continue
        requested = state.requested
        holds_gpu = False
        for name, amount in reqs.items():
            requested[name] = requested.get(name, 0) + amount
            if amount and res.is_gpu(name):
                holds_gpu = True
        if holds_gpu:
            state.gpu_pods.append((pod, reqs))
    return states


def _cached_requests(spec: PodSpecLite, shapes: dict[tuple[object, ...], dict[str, int]]) -> dict[str, int]:
    if spec.init_containers or spec.overhead or spec.resources:
        return res.pod_requests(spec)
    key = tuple(_shape(c.resources) for c in spec.containers or ())
    reqs = shapes.get(key)
    if reqs is None:
        reqs = shapes[key] = res.pod_requests(spec)
    return reqs


def _shape(resources: msgspec.Raw | ResourceRequirements | None) -> object:
    """A hashable stand-in for a container's resources: the raw JSON of a lite container, else the items."""
    if resources is None:
        return None
    if isinstance(resources, ResourceRequirements):
        return (
            tuple(resources.requests.items()) if resources.requests else None,
            tuple(resources.limits.items()) if resources.limits else None,
        )
    return bytes(resources)


# --- the filters -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rejection:
    plugin: str
    reasons: tuple[str, ...]
    resolvable: bool = False  # Unschedulable (preemption may help) vs UnschedulableAndUnresolvable


@dataclass
class PodQuery:
    """What the filters need from the pod, computed once."""

    pod: Pod
    requests: dict[str, int]
    tolerations: list[Toleration]
    prefilter_names: set[str] | None

    @classmethod
    def of(cls, pod: Pod) -> PodQuery:
        return cls(
            pod, res.pod_requests(pod.spec), list(pod.spec.tolerations or []), prefilter_node_names(pod.spec)
        )


def insufficient(query: PodQuery, state: NodeState) -> list[str]:
    """NodeResourcesFit's reasons (fitsRequest), in its order: pods, cpu, memory, ephemeral, scalars."""
    reasons: list[str] = []
    if state.pod_count + 1 > state.allocatable.get(res.PODS, 0):
        reasons.append(REASON_TOO_MANY_PODS)
    reqs = query.requests
    if not reqs:
        return reasons
    for name in (res.CPU, res.MEMORY, res.EPHEMERAL):
        want = reqs.get(name, 0)
        if want > 0 and want > state.free(name):
            reasons.append(f"Insufficient {name}")
    for name, want in reqs.items():
        if name in (res.CPU, res.MEMORY, res.EPHEMERAL) or want == 0:
            continue
        if want > state.free(name):
            reasons.append(f"Insufficient {name}")
    return reasons


def filter_node(query: PodQuery, state: NodeState, skip: frozenset[str] = frozenset()) -> Rejection | None:
    """Run the filters on one node; None when the pod fits. `skip` names plugins to leave out, which
    answers "would it fit if ..." questions."""
    node, spec = state.node, query.pod.spec
    if (
        NODE_UNSCHEDULABLE not in skip
        and node.spec.unschedulable
        and not any(
            tolerates(t, Taint(key=UNSCHEDULABLE_TAINT, effect="NoSchedule")) for t in query.tolerations
        )
    ):
        return Rejection(NODE_UNSCHEDULABLE, (REASON_UNSCHEDULABLE,))
    if NODE_NAME not in skip and spec.node_name and spec.node_name != state.name:
        return Rejection(NODE_NAME, (REASON_NODE_NAME,))
    if TAINT_TOLERATION not in skip:
        taint = untolerated(taints(node), query.tolerations)
        if taint is not None:
            return Rejection(TAINT_TOLERATION, (untolerated_taint_reason(taint),))
    if NODE_AFFINITY not in skip and not selector_matches(spec, node):
        return Rejection(NODE_AFFINITY, (REASON_AFFINITY,))
    if NODE_RESOURCES_FIT not in skip:
        reasons = insufficient(query, state)
        if reasons:
            return Rejection(NODE_RESOURCES_FIT, tuple(reasons), resolvable=True)
    return None


@dataclass
class Outcome:
    """The filters' verdict over the whole cluster."""

    total: int
    feasible: list[str]
    rejections: dict[str, Rejection]  # node name -> why
    prefilter_message: str | None = None

    @property
    def message(self) -> str | None:
        """kube-scheduler's FailedScheduling summary; None when some node fits."""
        if self.feasible:
            return None
        if self.total == 0:
            return NO_NODES
        head = f"0/{self.total} nodes are available:"
        if self.prefilter_message:
            return f"{head} {self.prefilter_message}."
        return f"{head} {', '.join(histogram(self.rejections.values()))}."


def histogram(rejections: Iterable[Rejection]) -> list[str]:
    counts: dict[str, int] = {}
    for rejection in rejections:
        for reason in rejection.reasons:
            counts[reason] = counts.get(reason, 0) + 1
    # Go's sort.Strings: byte order of "<count> <reason>", so "10 ..." sorts before "2 ...".
    return sorted((f"{count} {reason}" for reason, count in counts.items()), key=lambda s: s.encode())


def run_filters(query: PodQuery, states: dict[str, NodeState]) -> Outcome:
    outcome = Outcome(total=len(states), feasible=[], rejections={})
    names = query.prefilter_names
    if names is not None and not names:
        outcome.prefilter_message = REASON_AFFINITY_CONFLICT
        for name in states:
            outcome.rejections[name] = Rejection(NODE_AFFINITY, (REASON_AFFINITY_CONFLICT,))
        return outcome
    for name, state in states.items():
        if names is not None and name not in names:
            outcome.rejections[name] = Rejection(NODE_AFFINITY, (REASON_PREFILTER_AFFINITY,))
            continue
        rejection = filter_node(query, state)
        if rejection is None:
            outcome.feasible.append(name)
        else:
            outcome.rejections[name] = rejection
    return outcome
