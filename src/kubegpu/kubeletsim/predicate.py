"""The kubelet's node-fit admission check, for extended resources only (lifecycle/predicate.go).

It runs after the device manager has allocated. It matters for resources the device manager no longer
handles: one dropped after the grace period keeps capacity 0 on the Node, so a pod asking for it is
rejected here with OutOf<resource>. Extended resources the Node never had are ignored (they may be
cluster-level resources), so such a pod is admitted without devices, as on a real node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kubegpu.common.k8s_names import is_extended_resource_name

from .errors import AdmissionError
from .pods import Pod


def _add(into: dict[str, int], values: Mapping[str, int]) -> None:
    for r, v in values.items():
        into[r] = into.get(r, 0) + v


def _max(into: dict[str, int], values: Mapping[str, int]) -> None:
    for r, v in values.items():
        into[r] = max(into.get(r, 0), v)


def pod_requests(pod: Pod) -> dict[str, int]:
    """The pod's effective request: app containers plus sidecars, or the largest init step if bigger."""
    requests: dict[str, int] = {}
    init_steps: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for container, is_init in pod.in_start_order():
        if not is_init:
            _add(requests, container.limits)
        elif container.restartable:
            _add(requests, container.limits)
            _add(sidecars, container.limits)
            _max(init_steps, sidecars)
        else:
            step = dict(sidecars)
            _add(step, container.limits)
            _max(init_steps, step)
    _max(requests, init_steps)
    return requests


def check_node_fit(
    pod: Pod,
    other_pods: Iterable[Pod],
    node_allocatable: Mapping[str, int],
    held_by_pods: Mapping[str, set[str]] | None,
) -> None:
    """Raise AdmissionError(OutOf<resource>) when an extended resource on the Node is short.

    `held_by_pods` is the device manager's allocation when the pod got devices: node allocatable is raised
    to at least that, so running pods keep passing while a plugin is away (sanitizeNodeAllocatable).
    """
    allocatable = dict(node_allocatable)
    for resource, ids in (held_by_pods or {}).items():
        allocatable[resource] = max(allocatable.get(resource, 0), len(ids))
    used: dict[str, int] = {}
    for other in other_pods:
        _add(used, pod_requests(other))
    through_dra = pod.dra_extended_resources()
    for resource, wanted in sorted(pod_requests(pod).items()):
        if wanted == 0 or not is_extended_resource_name(resource) or resource not in allocatable:
            continue
        if resource in through_dra:  # the bridge's claim serves it, not the node's device plugin
            continue
        if wanted > allocatable[resource] - used.get(resource, 0):
            raise AdmissionError(
                f"OutOf{resource}",
                f"Node didn't have enough resource: {resource}, requested: {wanted}, "
                f"used: {used.get(resource, 0)}, capacity: {allocatable[resource]}",
            )
