"""Why a pod's claims do (not) fit a node: per node, per request, what happened to every device.

For each node the account lists the pools the node reaches (generation, completeness), and for each
request of each claim every device of those pools with one verdict, checked in this order so the most
useful reason wins: the class's selectors, the request's selectors (the first that is false, or the CEL
error), untolerated taints, and finally whether another claim (or an earlier request of these claims)
already holds it. Then the allocator runs for real (constraints and counts are only decided there), and
the node's summary uses the scheduler's words: "cannot allocate all claims" when nothing fits, the
allocator's error when the input is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .allocator import AllocationError, Allocator, Features, all_taints_tolerated, evaluate_selector
from .cel import CelError, device_activation
from .model import DeviceClass, DeviceID, ExactRequest, ResourceClaim, ResourceSlice
from .nodes import Node
from .pools import gather_pools

CANNOT_ALLOCATE = "cannot allocate all claims"  # the DynamicResources plugin's Unschedulable reason

AVAILABLE = "available"
CLASS_SELECTOR = "class selector"
REQUEST_SELECTOR = "request selector"
SELECTOR_ERROR = "selector error"
TAINTED = "tainted"
IN_USE = "in use"


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    device: DeviceID
    verdict: str  # one of the constants above
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.device}: {self.verdict}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True, slots=True)
class RequestAccount:
    claim: str  # namespace/name
    request: str  # request, or request/subrequest
    device_class: str
    wanted: str  # a count, or "all"
    verdicts: tuple[DeviceVerdict, ...]

    @property
    def matching(self) -> int:
        return sum(v.verdict == AVAILABLE for v in self.verdicts)

    def count(self, verdict: str) -> int:
        return sum(v.verdict == verdict for v in self.verdicts)


@dataclass(frozen=True, slots=True)
class PoolSummary:
    id: str
    generation: int
    devices: int
    incomplete: bool
    invalid_reason: str


@dataclass(frozen=True, slots=True)
class NodeAccount:
    node: str
    pools: tuple[PoolSummary, ...]
    requests: tuple[RequestAccount, ...]
    allocation: list[dict[str, Any]] | None
    error: str = ""

    @property
    def fits(self) -> bool:
        return self.allocation is not None

    @property
    def summary(self) -> str:
        if self.error:
            return self.error
        return "" if self.fits else CANNOT_ALLOCATE


def explain(
    claims: Sequence[ResourceClaim],
    classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
    slices: Iterable[ResourceSlice],
    nodes: Iterable[Node | Mapping[str, Any] | str],
    held_by: Mapping[DeviceID, str] | None = None,
    features: Features | None = None,
) -> list[NodeAccount]:
    """`claims`: the pod's claims still to allocate. `held_by`: device -> the claim (ns/name) holding it."""
    features = features or Features()
    class_map = dict(classes) if isinstance(classes, Mapping) else {c.name: c for c in classes}
    slice_list = list(slices)
    held = dict(held_by or {})
    accounts = []
    for raw_node in nodes:
        node = raw_node if isinstance(raw_node, Node) else Node.from_object(raw_node)
        pools = gather_pools(slice_list, node, partitionable_devices=features.partitionable_devices)
        summaries = tuple(
            PoolSummary(p.id, p.generation, sum(1 for _ in p.devices()), p.incomplete, p.invalid_reason)
            for p in pools
        )
        devices = [d for p in pools for d in p.devices()]
        requests = []
        for claim in claims:
            for request in claim.requests:
                alternatives = (
                    [(f"{request.name}/{s.name}", s.exactly) for s in request.first_available]
                    if request.first_available
                    else [(request.name, request.exactly)]
                )
                for name, exact in alternatives:
                    assert exact is not None
                    requests.append(_account(claim, name, exact, class_map, devices, held))
        error = ""
        allocation = None
        try:
            allocation = Allocator(claims, class_map, slice_list, held.keys(), features).allocate(node)
        except AllocationError as err:
            error = str(err)
        accounts.append(NodeAccount(node.name, summaries, tuple(requests), allocation, error))
    return accounts


def _account(
    claim: ResourceClaim,
    name: str,
    exact: ExactRequest,
    classes: Mapping[str, DeviceClass],
    devices: Sequence[tuple[DeviceID, Any, ResourceSlice]],
    held: Mapping[DeviceID, str],
) -> RequestAccount:
    device_class = classes.get(exact.device_class_name)
    wanted = "all" if exact.allocation_mode == "All" else str(exact.count)
    if device_class is None:
        return RequestAccount(claim.ref, name, exact.device_class_name, wanted, ())
    verdicts = []
    for device_id, device, _ in devices:
        verdicts.append(_verdict(claim, exact, device_class, device_id, device, held))
    return RequestAccount(claim.ref, name, device_class.name, wanted, tuple(verdicts))


def _verdict(
    claim: ResourceClaim,
    exact: ExactRequest,
    device_class: DeviceClass,
    device_id: DeviceID,
    device: Any,
    held: Mapping[DeviceID, str],
) -> DeviceVerdict:
    try:
        activation = device_activation(device_id.driver, device.attributes, device.capacity)
    except CelError as err:
        return DeviceVerdict(device_id, SELECTOR_ERROR, str(err))
    for verdict, source, selectors in (
        (CLASS_SELECTOR, f"class {device_class.name}", device_class.selectors),
        (REQUEST_SELECTOR, f"claim {claim.ref}", exact.selectors),
    ):
        for i, expression in enumerate(selectors):
            try:
                if not evaluate_selector(source, i, expression, activation):
                    return DeviceVerdict(device_id, verdict, f"{source} selector #{i} is false: {expression}")
            except AllocationError as err:
                return DeviceVerdict(device_id, SELECTOR_ERROR, str(err))
    if not all_taints_tolerated(device, exact):
        untolerated = [str(t) for t in device.taints if not any(x.tolerates(t) for x in exact.tolerations)]
        return DeviceVerdict(device_id, TAINTED, "not tolerated: " + ", ".join(untolerated))
    if device_id in held and not exact.admin_access:
        return DeviceVerdict(device_id, IN_USE, f"allocated to claim {held[device_id]}")
    return DeviceVerdict(device_id, AVAILABLE)


def holders(claims: Iterable[ResourceClaim]) -> dict[DeviceID, str]:
    """Which claim holds each allocated device (admin access holds none)."""
    return {device: claim.ref for claim in claims for device, admin in claim.allocated_devices() if not admin}
