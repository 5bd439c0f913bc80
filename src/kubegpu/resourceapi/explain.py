"""Why a pod's claims do (not) fit a node: per node, per request, what happened to every device.

For each node the account lists the pools the node reaches (generation, completeness), and for each
request of each claim every device of those pools with one verdict, checked in this order so the most
useful reason wins: the class's selectors, the request's selectors (the first that is false, or the CEL
error), untolerated taints, whether another claim holds it whole, whether its capacity takes what the
request asks (consumable capacity: what is left on a shared GPU after the claims sharing it), and whether
its pool's counters can still pay for it (partitionable devices: which counter is short and which claims'
devices take it, e.g. a MIG placement taken by a named claim). Then the allocator runs for real
(constraints and counts are only decided there), and the node's summary uses the scheduler's words:
"cannot allocate all claims" when nothing fits, the allocator's error when the input is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .allocator import AllocationError, Allocator, Features, all_taints_tolerated, evaluate_selector
from .capacity import CapacityError, demand, fmt, shortfall
from .cel import CelError, device_activation
from .counters import CounterLedger, consumers
from .holdings import Holdings
from .model import DeviceClass, DeviceID, ExactRequest, ResourceClaim, ResourceSlice
from .nodes import Node
from .pools import Pool, gather_pools

CANNOT_ALLOCATE = "cannot allocate all claims"  # the DynamicResources plugin's Unschedulable reason

AVAILABLE = "available"
CLASS_SELECTOR = "class selector"
REQUEST_SELECTOR = "request selector"
SELECTOR_ERROR = "selector error"
TAINTED = "tainted"
IN_USE = "in use"
COUNTERS = "counters"  # the pool's shared counters cannot pay for the device
CAPACITY = "capacity"  # the device's capacity does not take the request


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    device: DeviceID
    verdict: str  # one of the constants above
    detail: str = ""
    holders: tuple[str, ...] = ()  # the claims (ns/name) standing in the way, for IN_USE/COUNTERS/CAPACITY

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
    held_by: Mapping[DeviceID, str] | Holdings | None = None,
    features: Features | None = None,
) -> list[NodeAccount]:
    """`claims`: the pod's claims still to allocate. `held_by`: what allocated claims hold
    (`Holdings.of_claims`), or just device -> the claim (ns/name) holding it whole."""
    features = features or Features()
    class_map = dict(classes) if isinstance(classes, Mapping) else {c.name: c for c in classes}
    slice_list = list(slices)
    held = held_by if isinstance(held_by, Holdings) else Holdings(dict(held_by or {}))
    accounts = []
    for raw_node in nodes:
        node = raw_node if isinstance(raw_node, Node) else Node.from_object(raw_node)
        pools = gather_pools(slice_list, node, partitionable_devices=features.partitionable_devices)
        summaries = tuple(
            PoolSummary(p.id, p.generation, sum(1 for _ in p.devices()), p.incomplete, p.invalid_reason)
            for p in pools
        )
        devices = [(*d, p) for p in pools for d in p.devices()]
        requests = []
        for claim in claims:
            for name, exact in claim.exact_requests():
                requests.append(_account(claim, name, exact, class_map, devices, held, features))
        error = ""
        allocation = None
        try:
            allocation = Allocator(claims, class_map, slice_list, held, features).allocate(node)
        except AllocationError as err:
            error = str(err)
        accounts.append(NodeAccount(node.name, summaries, tuple(requests), allocation, error))
    return accounts


def _account(
    claim: ResourceClaim,
    name: str,
    exact: ExactRequest,
    classes: Mapping[str, DeviceClass],
    devices: Sequence[tuple[DeviceID, Any, ResourceSlice, Pool]],
    held: Holdings,
    features: Features,
) -> RequestAccount:
    device_class = classes.get(exact.device_class_name)
    wanted = "all" if exact.allocation_mode == "All" else str(exact.count)
    if device_class is None:
        return RequestAccount(claim.ref, name, exact.device_class_name, wanted, ())
    verdicts = []
    ledger = CounterLedger(held.is_allocated)
    for device_id, device, _, pool in devices:
        verdict = _verdict(claim, exact, device_class, device_id, device, held)
        if verdict.verdict == AVAILABLE:
            verdict = _sharing_verdict(name, exact, device_id, device, pool, held, ledger, features)
        verdicts.append(verdict)
    return RequestAccount(claim.ref, name, device_class.name, wanted, tuple(verdicts))


def _verdict(
    claim: ResourceClaim,
    exact: ExactRequest,
    device_class: DeviceClass,
    device_id: DeviceID,
    device: Any,
    held: Holdings,
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
    if device_id in held.exclusive and not exact.admin_access:
        holder = held.exclusive[device_id]
        return DeviceVerdict(device_id, IN_USE, f"allocated to claim {holder}", (holder,))
    return DeviceVerdict(device_id, AVAILABLE)


def _sharing_verdict(
    request: str,
    exact: ExactRequest,
    device_id: DeviceID,
    device: Any,
    pool: Pool,
    held: Holdings,
    ledger: CounterLedger,
    features: Features,
) -> DeviceVerdict:
    """The counters and capacity a device would need for the request, against what claims hold."""
    shared = features.consumable_capacity and device.allow_multiple_allocations
    if features.consumable_capacity:
        try:
            wanted = demand(exact.capacity_requests, device, device_id.driver, request)
            if not isinstance(wanted, dict):
                return DeviceVerdict(device_id, CAPACITY, wanted.describe())
            consumed = held.consumed(device_id) or {}
            short = shortfall(wanted, device, consumed)
        except CapacityError as err:
            return DeviceVerdict(device_id, CAPACITY, str(err))
        if short is not None:
            unit = "bytes" if short.name.rpartition("/")[2] == "memory" else ""
            detail = short.describe(unit)
            sharers = tuple(sorted({s.claim for s in held.shares.get(device_id, ())}))
            if short.reason == "exhausted" and sharers:
                shares = ", ".join(
                    f"{s.claim} {fmt(s.consumed.get(short.name, 0), unit)}" for s in held.shares[device_id]
                )
                detail += f" on the shared device ({shares})"
            return DeviceVerdict(device_id, CAPACITY, detail, sharers if short.reason == "exhausted" else ())
    paid = shared and held.consumed(device_id) is not None
    if device.consumes_counters and features.partitionable_devices and not paid:
        if pool.incomplete:
            return DeviceVerdict(
                device_id,
                COUNTERS,
                f"pool {pool.id} is still being published: its counter sets are not all known",
            )
        deficit = ledger.take(pool, device)
        if deficit is None:
            ledger.give_back(pool, device)
        else:
            takers = consumers(pool, deficit.counter_set, deficit.counter, held.is_allocated)
            who = sorted({c for d in takers for c in held.holders(d)})
            unit = "bytes" if deficit.counter == "memory" else ""  # NVIDIA's memory counter is in bytes
            left = fmt(max(deficit.available, 0), unit)
            detail = (
                f"counter set {deficit.counter_set}: {deficit.counter} "
                f"{fmt(deficit.wanted, unit)} wanted, {left} left"
            )
            if takers:
                named = ", ".join(f"{d.device} ({', '.join(held.holders(d))})" for d in takers)
                detail += f"; taken by {named}"
            return DeviceVerdict(device_id, COUNTERS, detail, tuple(who))
    return DeviceVerdict(device_id, AVAILABLE)


def holders(claims: Iterable[ResourceClaim]) -> Holdings:
    """What each allocated claim holds: devices whole, and shares (admin access holds none)."""
    return Holdings.of_claims(claims)
