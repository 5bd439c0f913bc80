"""`kubegpu explain` for a pod asking an extended resource (`nvidia.com/gpu: N`) in a cluster with DRA nodes:
whether the extended-resource bridge (KEP-5004, DRAExtendedResource, beta and on in 1.36) applies, and where
it does, why the special claim the scheduler would make cannot be allocated.

As the v1.36 scheduler decides it (resourceapi.extended): a resource that a DeviceClass serves
(`extendedResourceName`, or `deviceclass.resource.kubernetes.io/<class>`) and that a node does not
advertise (no allocatable, or 0) is not NodeResourcesFit's to count on that node; DynamicResources
allocates it there through a claim with one request per container. A node whose device plugin advertises
it keeps it with the device plugin.
"""

from __future__ import annotations

from typing import Any

from kubegpu.common.k8s_names import is_extended_resource_name
from kubegpu.resourceapi import (
    ModelError,
    ResourceRoute,
    class_mapping,
    explain,
    extended_claim,
    holders,
    parse_claim,
    parse_slice,
    requests_and_mappings,
    routes,
)
from kubegpu.resourceapi import Node as DraNode
from kubegpu.resourceapi.extended import CLAIM_NAME_SUFFIX
from kubegpu.toolkit.dra_facts import slices_per_node
from kubegpu.toolkit.explain.dra import (
    DYNAMIC_RESOURCES,
    DraExplanation,
    device_classes,
    node_row,
    parse_all,
)
from kubegpu.toolkit.model import Container, Pod, limits, requests
from kubegpu.toolkit.scheduling import (
    NODE_RESOURCES_FIT,
    NodeState,
    Outcome,
    PodQuery,
    Rejection,
    filter_node,
)
from kubegpu.toolkit.snapshot import Snapshot


def pod_json(pod: Pod) -> dict[str, Any]:
    """The little of the pod's API object the bridge reads: its name and each container's resources."""

    def container(c: Container) -> dict[str, Any]:
        resources = {
            "limits": {k: str(v) for k, v in limits(c).items()},
            "requests": {k: str(v) for k, v in requests(c).items()},
        }
        return {"name": c.name, "restartPolicy": c.restart_policy, "resources": resources}

    meta = pod.metadata
    return {
        "metadata": {"name": meta.name, "namespace": meta.namespace},
        "spec": {
            "initContainers": [container(c) for c in pod.spec.init_containers or []],
            "containers": [container(c) for c in pod.spec.containers or []],
        },
    }


def _allocatable(state: NodeState) -> dict[str, Any]:
    return {str(k): str(v) for k, v in (state.node.status.allocatable or {}).items()}


def bridge_filter(
    snapshot: Snapshot, pod: Pod, query: PodQuery, states: dict[str, NodeState], outcome: Outcome
) -> DraExplanation | None:
    """None when the pod asks no extended resource or the cluster has no DRA objects. Otherwise: nodes that
    NodeResourcesFit rejected only for resources the bridge serves there are judged by DynamicResources on
    the special claim (fit, or rejected with the allocator's account), and notes say what applies."""
    wanted = sorted(n for n, v in query.requests.items() if v > 0 and is_extended_resource_name(n))
    if not wanted or not snapshot.dra:
        return None
    result = DraExplanation(claims=[])
    notes = result.notes
    mapping = class_mapping(snapshot.dra_objects("DeviceClass"))
    obj = pod_json(pod)
    unbridged = [n for n in wanted if n not in mapping]
    for name in unbridged:
        notes.append(
            f"extended-resource bridge: no DeviceClass has extendedResourceName: {name}, so {name} is served "
            "only by nodes whose device plugin advertises it; nodes that publish their GPUs through DRA "
            f"cannot serve it (set extendedResourceName: {name} on one DeviceClass, e.g. gpu.nvidia.com, "
            "or ask for the device with a ResourceClaim)"
        )
    if len(unbridged) == len(wanted):
        return result
    node_routes = {name: routes(obj, _allocatable(state), mapping) for name, state in states.items()}
    for name in wanted:
        if name in mapping:
            plugin_nodes = sorted(
                n
                for n, rs in node_routes.items()
                if any(r.resource == name and not r.through_dra for r in rs)
            )
            notes.append(
                f"extended-resource bridge: DeviceClass {mapping[name]} serves {name} (DRAExtendedResource); "
                f"nodes that do not advertise {name} get it through a claim the scheduler makes "
                f"({obj['metadata']['name']}{CLAIM_NAME_SUFFIX}*)"
                + (
                    f"; {len(plugin_nodes)} node(s) advertise it through a device plugin, which serves it "
                    f"there: {', '.join(plugin_nodes[:5])}"
                    if plugin_nodes
                    else ""
                )
            )
    if pod.status.extended_resource_claim_status is not None:
        notes.append("the pod's special claim is made already (status.extendedResourceClaimStatus)")
        return result
    _judge_bridged_nodes(snapshot, query, states, outcome, node_routes, mapping, obj, result)
    return result


def _judge_bridged_nodes(
    snapshot: Snapshot,
    query: PodQuery,
    states: dict[str, NodeState],
    outcome: Outcome,
    node_routes: dict[str, list[ResourceRoute]],
    mapping: dict[str, str],
    obj: dict[str, Any],
    result: DraExplanation,
) -> None:
    candidates: dict[str, list[str]] = {}  # node -> the resources DRA serves there
    for name, rejection in list(outcome.rejections.items()):
        bridged = [r.resource for r in node_routes[name] if r.through_dra]
        if rejection.plugin != NODE_RESOURCES_FIT or not bridged:
            continue
        rest = PodQuery(
            query.pod,
            {k: v for k, v in query.requests.items() if k not in bridged},
            query.tolerations,
            query.prefilter_names,
        )
        again = filter_node(rest, states[name])
        if again is None:
            candidates[name] = bridged
        else:
            outcome.rejections[name] = again
    if not candidates:
        return
    notes = result.notes
    slices = parse_all(snapshot.dra_objects("ResourceSlice"), parse_slice, notes, "ResourceSlice")
    classes = device_classes(snapshot, notes)
    held = holders(parse_all(snapshot.dra_objects("ResourceClaim"), parse_claim, notes, "ResourceClaim"))
    nodes = [DraNode(n, dict(states[n].node.metadata.labels or {})) for n in sorted(candidates)]
    for node, reachable in slices_per_node(slices, nodes):
        reqs, _ = requests_and_mappings(obj, candidates[node.name], mapping)
        raw = extended_claim(obj, reqs)
        raw["metadata"]["name"] = f"{obj['metadata']['name']}{CLAIM_NAME_SUFFIX.rstrip('-')}"  # not made yet
        try:
            claim = parse_claim(raw)
        except ModelError as err:
            notes.append(f"the special claim for {node.name} cannot be built: {err}")
            continue
        for account in explain([claim], classes, reachable, [node], held):
            result.nodes.append(node_row(account, [claim]))
            if account.fits:
                outcome.rejections.pop(node.name, None)
                outcome.feasible.append(node.name)
            else:
                outcome.rejections[node.name] = Rejection(
                    DYNAMIC_RESOURCES, (account.summary,), resolvable=True
                )
