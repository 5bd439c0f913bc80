"""What the structured allocator (allocator.py) searches with and hands back: its error and feature gates,
candidate devices, requests and their results, claim constraints (matchAttribute, distinctAttribute),
what a request consumes of a device's capacity, selector evaluation with the scheduler's error words, and
a claim's `status.allocation` JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import semver

from .capacity import CapacityError, demand, status_quantity
from .cel import CelError, compile_selector
from .model import Device, DeviceClass, DeviceID, DeviceRequest, ExactRequest, ResourceClaim, ResourceSlice
from .pools import Pool


class AllocationError(Exception):
    """Allocation cannot be attempted: the claims, classes or slices are wrong, not the node."""


@dataclass(frozen=True, slots=True)
class Features:
    """The scheduler's DRA feature gates that change allocation (1.36 defaults)."""

    admin_access: bool = True  # beta in 1.34
    prioritized_list: bool = True  # beta in 1.34 (firstAvailable)
    device_taints: bool = True  # alpha in 1.34; when off, taints are not even stored
    partitionable_devices: bool = True  # beta (on) in 1.36; off: slices with counters are skipped
    consumable_capacity: bool = True  # beta (on) in 1.36; off: capacity requests are an error


@dataclass(frozen=True, slots=True)
class Candidate:
    id: DeviceID
    device: Device
    slice: ResourceSlice
    pool: Pool | None = None


@dataclass(slots=True)
class Request:
    name: str  # the request's, or the subrequest's
    parent: str | None  # the request holding this subrequest
    exact: ExactRequest
    device_class: DeviceClass
    num_devices: int
    all_devices: list[Candidate] | None = None

    @property
    def result_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent else self.name


@dataclass(slots=True)
class Result:
    request: Request
    candidate: Candidate
    share_id: str = ""
    consumed: Mapping[str, int] | None = None  # for a share: capacity name -> nano-units


def check_features(claim: ResourceClaim, request: DeviceRequest, features: Features) -> None:
    """AllocationError when the request uses a field whose feature gate is off."""
    if not features.consumable_capacity:
        if request.exactly is not None and request.exactly.capacity_requests is not None:
            raise AllocationError(
                f"claim {claim.ref}, request {request.name}: has capacity requests, but the "
                "DRAConsumableCapacity feature is disabled"
            )
        for sub in request.first_available:
            if sub.exactly.capacity_requests is not None:
                raise AllocationError(
                    f"claim {claim.ref}, subrequest {sub.name}: has capacity requests, but the "
                    "DRAConsumableCapacity feature is disabled"
                )
    if request.first_available and not features.prioritized_list:
        raise AllocationError(
            f"claim {claim.ref}, request {request.name}: has subrequests, but the "
            "DRAPrioritizedList feature is disabled"
        )


def all_taints_tolerated(device: Device, exact: ExactRequest) -> bool:
    return all(any(t.tolerates(taint) for t in exact.tolerations) for taint in device.taints)


def _attribute_key(value: Mapping[str, Any]) -> tuple[str, Any] | None:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return kind, value[kind]
    return None


class AttributeConstraint:
    """matchAttribute / distinctAttribute over the devices of the named requests (all when none named)."""

    def __init__(self, requests: Sequence[str], attribute: str, distinct: bool) -> None:
        self.requests = set(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.values: list[tuple[str, Any]] = []

    def _applies(self, base: str, sub: str) -> bool:
        if not self.requests:
            return True
        return base in self.requests or (bool(sub) and f"{base}/{sub}" in self.requests)

    def add(self, base: str, sub: str, candidate: Candidate) -> bool:
        if not self._applies(base, sub):
            return True
        raw = candidate.device.attribute(self.attribute, candidate.id.driver)
        value = _attribute_key(raw) if raw is not None else None
        if value is None:
            return False
        if self.distinct:
            if any(_same(value, v) for v in self.values):
                return False
        elif self.values and not _same(value, self.values[0]):
            return False
        self.values.append(value)
        return True

    def remove(self, base: str, sub: str) -> None:
        if self._applies(base, sub):
            self.values.pop()


def claim_constraints(claim: ResourceClaim) -> list[AttributeConstraint]:
    """The claim's constraints; AllocationError for one of a type this allocator does not know."""
    constraints = []
    for i, c in enumerate(claim.constraints):
        if c.match_attribute:
            constraints.append(AttributeConstraint(c.requests, c.match_attribute, distinct=False))
        elif c.distinct_attribute:
            constraints.append(AttributeConstraint(c.requests, c.distinct_attribute, distinct=True))
        else:
            raise AllocationError(
                f"claim {claim.ref}, constraint #{i}: empty constraint (unsupported constraint type?)"
            )
    return constraints


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "version" and b[1] != a[1]:
        try:
            return semver.Version.parse(str(a[1])).compare(str(b[1])) == 0
        except ValueError:
            return False
    return bool(a[1] == b[1])


def allocation_json(
    claim: ResourceClaim, results: Sequence[Result], chosen: Sequence[Request], *, device_taints: bool
) -> dict[str, Any]:
    """A claim's status.allocation (v1 JSON): its results, the config of its classes and its own, and the
    node selector its devices pin it to. `chosen`: per request, the (sub)request that got its devices."""
    entries = []
    for result in results:
        entry: dict[str, Any] = {
            "request": result.request.result_name,
            "driver": result.candidate.id.driver,
            "pool": result.candidate.id.pool,
            "device": result.candidate.id.device,
        }
        if result.request.exact.admin_access:
            entry["adminAccess"] = True
        if result.share_id:
            entry["shareID"] = result.share_id
            capacity = result.candidate.device.capacity
            if result.consumed:
                entry["consumedCapacity"] = {
                    name: status_quantity(amount, capacity[name]) for name, amount in result.consumed.items()
                }
        if result.request.exact.tolerations and device_taints:
            entry["tolerations"] = [_toleration_json(t) for t in result.request.exact.tolerations]
        entries.append(entry)
    config: list[dict[str, Any]] = []
    for request in chosen:
        for class_config in request.device_class.config:
            config.append({"source": "FromClass", **{k: v for k, v in class_config.items()}})
    for claim_config in claim.config:
        names = list(claim_config.get("requests") or [])
        applies = not names or any(
            r.name in names or (chosen[ri].parent is not None and chosen[ri].result_name in names)
            for ri, r in enumerate(claim.requests)
        )
        if applies:
            config.append({"source": "FromClaim", **{k: v for k, v in claim_config.items()}})
    allocation: dict[str, Any] = {"devices": {"results": entries}}
    if config:
        allocation["devices"]["config"] = config
    selector = _node_selector([r.candidate for r in results])
    if selector is not None:
        allocation["nodeSelector"] = selector
    return allocation


def request_demand(data: Request, candidate: Candidate) -> dict[str, int] | None:
    """What allocating the candidate for the request consumes of its capacities; None when the
    device cannot take the request (a capacity it lacks, or a quantity that cannot be read)."""
    try:
        wanted = demand(data.exact.capacity_requests, candidate.device, candidate.id.driver, data.result_name)
    except CapacityError:
        return None  # the scheduler skips the device (and logs the error at V(7))
    return None if not isinstance(wanted, dict) else wanted


def evaluate_selector(source: str, index: int, expression: str, activation: Mapping[str, Any]) -> bool:
    """One selector on one device; AllocationError with the scheduler's words when CEL fails."""
    try:
        return compile_selector(expression).matches(activation)
    except CelError as err:
        phase = "compile" if str(err).startswith("compilation failed") else "runtime"
        raise AllocationError(f"{source}: selector #{index}: CEL {phase} error: {err}") from None


def _toleration_json(t: Any) -> dict[str, Any]:
    out = {"operator": t.operator}
    for name in ("key", "value", "effect"):
        if getattr(t, name):
            out[name] = getattr(t, name)
    return out


def _node_selector(candidates: Sequence[Candidate]) -> dict[str, Any] | None:
    """createNodeSelector: a node-local device pins the claim to its node; selectors are combined."""
    expressions: list[Any] = []
    fields: list[Any] = []
    for c in candidates:
        per_device = c.slice.per_device_node_selection
        node_name = c.device.node_name if per_device else c.slice.node_name
        selector = c.device.node_selector if per_device else c.slice.node_selector
        if node_name:
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            }
        if selector:
            terms = selector.get("nodeSelectorTerms") or []
            if len(terms) != 1:
                return dict(selector)
            expressions += [e for e in terms[0].get("matchExpressions") or [] if e not in expressions]
            fields += [f for f in terms[0].get("matchFields") or [] if f not in fields]
    if not expressions and not fields:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}
