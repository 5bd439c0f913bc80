"""The slice of the Kubernetes API the toolkit reads: nodes, pods, DaemonSets, RuntimeClasses, events.

msgspec structs decode JSON straight into these types and skip every field not declared here, which
is what keeps a 100,000-pod snapshot fast and small. Field names follow the API (camelCase on the
wire). Collections the API may leave out or set to null are `X | None`; read them through the
helpers at the bottom so callers never test for None.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import msgspec

# On the wire a string; a hand-written manifest may hold a bare number, or a `true` that lint reports as
# the API server does (quantity.parse_nanos refuses it).
Quantity = str | int | float | bool


class _Obj(msgspec.Struct, rename="camel", gc=False, omit_defaults=True):
    """Base: camelCase on the wire; no GC tracking (these trees never form cycles)."""


class OwnerReference(_Obj):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class ObjectMetaLite(_Obj):
    name: str = ""
    namespace: str = ""
    owner_references: list[OwnerReference] | None = None


class ObjectMeta(ObjectMetaLite):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    deletion_timestamp: str | None = None


class EnvVar(_Obj):
    name: str = ""
    value: str | None = None


class ContainerClaim(_Obj):
    """resources.claims[]: a pod claim (by its name in spec.resourceClaims) and one of its requests."""

    name: str = ""
    request: str | None = None


class ResourceRequirements(_Obj):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None
    claims: list[ContainerClaim] | None = None


class ContainerLite(_Obj):
    # Left undecoded: bulk pods repeat a few resource blocks, decoded once each (see `resources_of`).
    resources: msgspec.Raw | ResourceRequirements | None = None
    restart_policy: str | None = None  # "Always" on an init container makes it a sidecar


class Container(ContainerLite):
    resources: ResourceRequirements | None = None
    name: str = ""
    image: str = ""
    command: list[str] | None = None
    env: list[EnvVar] | None = None


class Toleration(_Obj):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class Taint(_Obj):
    key: str = ""
    value: str | None = None
    effect: str = ""


class NodeSelectorRequirement(_Obj):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class NodeSelectorTerm(_Obj):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(_Obj):
    node_selector_terms: list[NodeSelectorTerm] | None = None


class NodeAffinity(_Obj, rename={"required": "requiredDuringSchedulingIgnoredDuringExecution"}):
    required: NodeSelector | None = None


class Affinity(_Obj):
    node_affinity: NodeAffinity | None = None


class PodResourceClaim(_Obj):
    name: str = ""
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodResourceClaimStatus(_Obj):
    """The claim the resourceclaim controller made from a template for one pod claim."""

    name: str = ""
    resource_claim_name: str | None = None


class SchedulingGate(_Obj):
    name: str = ""


class PodSpecLite(_Obj):
    """What every bound pod must keep: enough to count its requests against its node."""

    # Sequence, not list: PodSpec narrows these to full Containers (a list would be invariant).
    containers: Sequence[ContainerLite] | None = None
    init_containers: Sequence[ContainerLite] | None = None
    node_name: str | None = None
    runtime_class_name: str | None = None
    overhead: dict[str, Quantity] | None = None
    priority: int | None = None
    resources: ResourceRequirements | None = None  # pod-level resources (PodLevelResources)


class PodSpec(PodSpecLite):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: list[Toleration] | None = None
    priority_class_name: str | None = None
    preemption_policy: str | None = None
    scheduling_gates: list[SchedulingGate] | None = None
    scheduler_name: str | None = None
    resource_claims: list[PodResourceClaim] | None = None


class PodCondition(_Obj):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None


class StateDetail(_Obj):
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None


class ContainerState(_Obj):
    waiting: StateDetail | None = None
    terminated: StateDetail | None = None
    running: dict[str, str] | None = None


class ContainerStatus(_Obj):
    name: str = ""
    restart_count: int = 0
    ready: bool = False
    state: ContainerState | None = None
    last_state: ContainerState | None = None


class PodStatusLite(_Obj):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None


class PodStatus(PodStatusLite):
    nominated_node_name: str | None = None
    conditions: list[PodCondition] | None = None
    container_statuses: list[ContainerStatus] | None = None
    init_container_statuses: list[ContainerStatus] | None = None
    resource_claim_statuses: list[PodResourceClaimStatus] | None = None
    # The extended-resource bridge's claim (KEP-5004): {resourceClaimName, requestMappings}, as given.
    extended_resource_claim_status: dict[str, Any] | None = None


class PodLite(_Obj, tag_field="kind", tag="Pod"):
    """A pod as the bulk of a snapshot holds it: decoding skips everything else at C speed."""

    metadata: ObjectMetaLite = msgspec.field(default_factory=ObjectMetaLite)
    spec: PodSpecLite = msgspec.field(default_factory=PodSpecLite)
    status: PodStatusLite = msgspec.field(default_factory=PodStatusLite)


class Pod(PodLite, tag_field="kind", tag="Pod"):
    """A pod in full: the one `explain` looks at, pending pods, DaemonSet pods, manifests."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class NodeSpec(_Obj):
    unschedulable: bool = False
    taints: list[Taint] | None = None


class NodeCondition(_Obj):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None


class NodeSystemInfo(_Obj):
    kubelet_version: str = ""
    container_runtime_version: str = ""


class NodeStatus(_Obj):
    capacity: dict[str, Quantity] | None = None
    allocatable: dict[str, Quantity] | None = None
    conditions: list[NodeCondition] | None = None
    node_info: NodeSystemInfo | None = None


class Node(_Obj, tag_field="kind", tag="Node"):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class PodTemplateSpec(_Obj):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


class DaemonSetSpec(_Obj):
    template: PodTemplateSpec = msgspec.field(default_factory=PodTemplateSpec)


class DaemonSetStatus(_Obj):
    desired_number_scheduled: int = 0
    current_number_scheduled: int = 0
    number_ready: int = 0
    number_unavailable: int = 0


class DaemonSet(_Obj, tag_field="kind", tag="DaemonSet"):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: DaemonSetSpec = msgspec.field(default_factory=DaemonSetSpec)
    status: DaemonSetStatus = msgspec.field(default_factory=DaemonSetStatus)


class RuntimeClassScheduling(_Obj):
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None


class RuntimeClassOverhead(_Obj):
    pod_fixed: dict[str, Quantity] | None = None


class RuntimeClass(_Obj, tag_field="kind", tag="RuntimeClass"):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    handler: str = ""
    overhead: RuntimeClassOverhead | None = None
    scheduling: RuntimeClassScheduling | None = None


class ObjectReference(_Obj):
    kind: str = ""
    name: str = ""
    namespace: str = ""


class Event(_Obj, tag_field="kind", tag="Event"):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    involved_object: ObjectReference = msgspec.field(default_factory=ObjectReference)
    reason: str = ""
    message: str = ""
    type: str = ""
    count: int | None = None


class ListMeta(_Obj, rename={"continue_": "continue"}):
    continue_: str | None = None


# --- read helpers: the API's optional collections as plain empty ones -------------------------------


def labels(meta: ObjectMeta) -> dict[str, str]:
    return meta.labels or {}


_RESOURCES = msgspec.json.Decoder(ResourceRequirements)


@lru_cache(maxsize=4096)
def _resources_from(raw: bytes) -> ResourceRequirements:
    return _RESOURCES.decode(raw)


def resources_of(container: ContainerLite) -> ResourceRequirements | None:
    """The container's resources, decoding a lite container's raw block (shared: do not mutate)."""
    r = container.resources
    if r is None or isinstance(r, ResourceRequirements):
        return r
    return _resources_from(bytes(r))


def requests(container: ContainerLite) -> dict[str, Quantity]:
    r = resources_of(container)
    return (r.requests if r else None) or {}


def limits(container: ContainerLite) -> dict[str, Quantity]:
    r = resources_of(container)
    return (r.limits if r else None) or {}


def containers(spec: PodSpecLite) -> list[ContainerLite]:
    return list(spec.containers or [])


def init_containers(spec: PodSpecLite) -> list[ContainerLite]:
    return list(spec.init_containers or [])


def tolerations(spec: PodSpec) -> list[Toleration]:
    return spec.tolerations or []


def taints(node: Node) -> list[Taint]:
    return node.spec.taints or []


def capacity(node: Node) -> dict[str, Quantity]:
    return node.status.capacity or {}


def allocatable(node: Node) -> dict[str, Quantity]:
    return node.status.allocatable or {}


def condition(pod: Pod, kind: str) -> PodCondition | None:
    for cond in pod.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


def node_ready(node: Node) -> bool | None:
    """True/False from the Ready condition; None when the node reports none."""
    for cond in node.status.conditions or []:
        if cond.type == "Ready":
            return cond.status == "True"
    return None


def ref(meta: ObjectMetaLite) -> str:
    """namespace/name, or just name for cluster-scoped objects."""
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


def is_terminated(pod: PodLite) -> bool:
    """Succeeded/Failed pods hold no resources: the scheduler's informer filters them out."""
    return pod.status.phase in ("Succeeded", "Failed")
