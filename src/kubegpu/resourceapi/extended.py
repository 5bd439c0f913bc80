"""The extended-resource bridge (KEP-5004, `DRAExtendedResource`: alpha 1.34, beta and on in 1.36) as the
v1.36 scheduler's DynamicResources plugin runs it (`extendeddynamicresources.go`, `extended/`):

- which DeviceClass serves an extended resource: the class whose `spec.extendedResourceName` names it, and
  every class under its implicit name `deviceclass.resource.kubernetes.io/<class>`; when several classes
  name one resource, the newest (`creationTimestamp`) wins, then the name that sorts first;
- per node, which of a pod's extended resources go through DRA: those a class serves that the node's
  allocatable does not carry (or carries as 0); a resource the node advertises (a device plugin) stays
  with the device plugin; one neither advertised nor served does not fit (`cannot fit resource`);
- the special ResourceClaim the scheduler creates for the pod: `generateName: <pod>-extended-resources-`,
  the annotation `resource.kubernetes.io/extended-resource-claim: "true"`, the pod as its controller, and
  one request per container and resource, `container-<i>-request-<j>` (i: the container's index among
  init containers then containers; j: the resource's index among the container's sorted request names),
  `exactly: {deviceClassName, allocationMode: ExactCount, count}`, with the pod status'
  `extendedResourceClaimStatus.requestMappings` (containerName, resourceName, requestName) beside it.
  Init containers that are not sidecars reuse the requests of the containers after them and share the
  largest of their own, as the scheduler's `createRequestsAndMappings` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kubegpu.common import quantity
from kubegpu.common.k8s_names import is_extended_resource_name

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
CLAIM_NAME_SUFFIX = "-extended-resources-"


def is_dra_extended_resource_name(name: str) -> bool:
    """An extended resource name, or a class's implicit name (`IsDRAExtendedResourceName`)."""
    return is_extended_resource_name(name) or name.startswith(DEVICE_CLASS_PREFIX)


def class_mapping(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass serving it, from DeviceClass objects (`DeviceClassMapping`).

    A class with `extendedResourceName` serves that name; a class without it serves its implicit name.
    Ties: the newest creationTimestamp (RFC 3339 in UTC, so it sorts as text), then the lowest name."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for c in classes:
        meta = c.get("metadata") or {}
        name = str(meta.get("name") or "")
        explicit = (c.get("spec") or {}).get("extendedResourceName")
        resource = explicit if explicit else DEVICE_CLASS_PREFIX + name
        by_name.setdefault(str(resource), []).append((str(meta.get("creationTimestamp") or ""), name))
    out = {}
    for resource, found in by_name.items():
        newest = max(created for created, _ in found)
        out[resource] = min(name for created, name in found if created == newest)
    return out


def container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """A container's `resources.requests` as the API server stores them: a limit without a request is the
    request too (defaulting)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {str(name): quantity.parse(raw) for name, raw in merged.items()}


def _all_containers(pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], int]:
    spec = pod.get("spec") or {}
    init = list(spec.get("initContainers") or [])
    return init + list(spec.get("containers") or []), len(init)


def pod_extended_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's non-zero whole-number requests of extended resources (and implicit class names), as the
    scheduler sums them (`PodRequests`): regular containers and sidecars add up, a plain init container
    counts alone (the largest need wins)."""
    containers, init_count = _all_containers(pod)
    total: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for i, c in enumerate(containers):
        asked = {n: int(q) for n, q in container_requests(c).items() if is_dra_extended_resource_name(n)}
        if i < init_count and c.get("restartPolicy") != "Always":
            for n, q in asked.items():  # a plain init container runs with the sidecars started before it
                init_peak[n] = max(init_peak.get(n, 0), q + sidecars.get(n, 0))
            continue
        for n, q in asked.items():
            total[n] = total.get(n, 0) + q
            if i < init_count:
                sidecars[n] = sidecars.get(n, 0) + q
    for n, q in init_peak.items():
        total[n] = max(total.get(n, 0), q)
    return {n: q for n, q in total.items() if q > 0}


@dataclass(frozen=True, slots=True)
class ResourceRoute:
    """How one extended resource of a pod is served on one node."""

    resource: str
    amount: int
    device_class: str | None  # the class bridging it, None when no class does
    allocatable: int | None  # the node's allocatable of it, None when the node does not list it

    @property
    def through_dra(self) -> bool:
        return self.device_class is not None and not self.allocatable

    @property
    def fits_nowhere(self) -> bool:
        """Neither advertised by the node nor bridged: the scheduler's `cannot fit resource`."""
        return not self.through_dra and self.allocatable is None


def routes(
    pod: Mapping[str, Any], allocatable: Mapping[str, Any], mapping: Mapping[str, str]
) -> list[ResourceRoute]:
    """Each extended resource the pod asks for, with how `allocatable` (a node's) and the classes serve it
    (`filterExtendedResources`), in name order."""
    out = []
    for resource, amount in sorted(pod_extended_requests(pod).items()):
        raw = allocatable.get(resource)
        out.append(
            ResourceRoute(
                resource, amount, mapping.get(resource), None if raw is None else quantity.value(raw)
            )
        )
    return out


def _request(
    index: int,
    container: Mapping[str, Any],
    resource: str,
    device_class: str,
    reusable: Sequence[dict[str, Any] | None] = (),
) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """The request `container` needs of `resource` and its mappings (`createResourceRequestAndMappings`):
    None when it asks for none, or when the `reusable` requests already cover it."""
    asked = container_requests(container)
    amount = asked.get(resource)
    if amount is None or amount.denominator != 1 or amount == 0:
        return None, []
    wanted = int(amount)
    name = str(container.get("name") or "")
    mappings: list[dict[str, str]] = []
    covered = 0
    for r in reusable:
        if r is None:
            continue
        covered += r["exactly"]["count"]
        mappings.append({"containerName": name, "resourceName": resource, "requestName": r["name"]})
        if covered >= wanted:
            return None, mappings
    request_name = f"container-{index}-request-{sorted(asked).index(resource)}"
    request = {
        "name": request_name,
        "exactly": {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": wanted - covered,
        },
    }
    mappings.append({"containerName": name, "resourceName": resource, "requestName": request_name})
    return request, mappings


def requests_and_mappings(
    pod: Mapping[str, Any], resources: Iterable[str], mapping: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The special claim's device requests (sorted by name) and the pod's request mappings for `resources`
    (those served through DRA on the chosen node), as `createRequestsAndMappings` builds them."""
    containers, init_count = _all_containers(pod)
    long_lived = [
        i for i, c in enumerate(containers) if i >= init_count or c.get("restartPolicy") == "Always"
    ]
    short_lived = [i for i in range(init_count) if i not in long_lived]
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    for resource in sorted(resources):
        device_class = mapping.get(resource)
        if device_class is None:
            continue
        own: list[dict[str, Any] | None] = [None] * len(containers)
        long_mappings: list[dict[str, str]] = []
        for i in long_lived:
            own[i], found = _request(i, containers[i], resource, device_class)
            long_mappings += found
        largest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_mappings: list[dict[str, str]] = []
        for i in short_lived:
            request, found = _request(i, containers[i], resource, device_class, own[i:])
            if request is not None:
                short_names.add(request["name"])
                if largest is None or largest["exactly"]["count"] < request["exactly"]["count"]:
                    largest = request
            short_mappings += found
        if largest is not None and len(short_names) > 1:  # every init container uses the largest request
            short_names.discard(largest["name"])
            for m in short_mappings:
                if m["requestName"] in short_names:
                    m["requestName"] = largest["name"]
        if largest is not None:
            requests.append(largest)
        requests += [r for r in own if r is not None]
        mappings += long_mappings + short_mappings
    requests.sort(key=lambda r: str(r["name"]))
    return requests, mappings


def extended_claim(pod: Mapping[str, Any], requests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The special ResourceClaim the scheduler writes for `pod` (resource.k8s.io/v1), before the API server
    names it from `generateName`."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta.get('name', '')}{CLAIM_NAME_SUFFIX}",
            "namespace": meta.get("namespace") or "default",
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta.get("name", ""),
                    "uid": meta.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": [dict(r) for r in requests]}},
    }


def is_extended_claim_of(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether `claim` is `pod`'s special claim (`findExtendedResourceClaim`): the annotation "true" and the
    pod as its controller (name and UID)."""
    meta = claim.get("metadata") or {}
    if (meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
        return False
    owner = pod.get("metadata") or {}
    return any(
        ref.get("controller") and (ref.get("name"), ref.get("uid")) == (owner.get("name"), owner.get("uid"))
        for ref in meta.get("ownerReferences") or []
    )
