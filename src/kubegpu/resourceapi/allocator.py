"""The scheduler's structured allocator (k8s.io/dynamic-resource-allocation/structured), for one node.

For the claims of one pod it searches, claim by claim and request by request, for devices that are
reachable from the node, not allocated already (to other claims, or earlier in this search), selected by
the request's DeviceClass selectors and its own selectors (CEL), whose taints the request tolerates, and
that keep the claim's constraints (matchAttribute: all the same value; distinctAttribute: all different),
whose pool still has the counters they consume (partitionable devices, `counters`), and whose capacity
takes what the request asks (consumable capacity, `capacity`): a device with `allowMultipleAllocations`
is never "in use", it takes further claims while the sum of what they consume fits, and each such
allocation gets a `shareID` and its `consumedCapacity` in the result.
ExactCount takes `count` devices, All takes every matching device (and fails on an incomplete pool);
firstAvailable tries its subrequests in order. The first complete solution wins (first fit in pool and
slice order, backtracking when a later request cannot be met).

`allocate()` returns one `status.allocation` (v1 JSON) per claim, or None when the claims do not fit on
this node. Problems in the input (a missing class, a CEL error, an invalid pool) raise `AllocationError`
with the scheduler's words: the scheduler stops trying other nodes then and reports it.
Not modelled: binding conditions, extended-resource requests, and scoring.
The search is here; its requests, results, constraints, feature gates and JSON output are in allocator_parts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .allocator_parts import (
    AllocationError,
    AttributeConstraint,
    Candidate,
    Features,
    Request,
    Result,
    all_taints_tolerated,
    allocation_json,
    check_features,
    claim_constraints,
    evaluate_selector,
    request_demand,
)
from .capacity import CapacityError, shortfall
from .cel import CelError, device_activation
from .counters import CounterLedger
from .holdings import Holdings
from .model import (
    ALLOCATION_RESULTS_MAX,
    Device,
    DeviceClass,
    DeviceID,
    ExactRequest,
    ResourceClaim,
    ResourceSlice,
)
from .nodes import Node, reachable
from .pools import Pool, gather_pools

__all__ = [
    "AllocationError",
    "Allocator",
    "Candidate",
    "Features",
    "all_taints_tolerated",
    "allocated_devices",
    "evaluate_selector",
]

_DEFAULT_FEATURES = Features()  # frozen: one instance serves every default


class Allocator:
    def __init__(
        self,
        claims: Sequence[ResourceClaim],
        classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
        slices: Iterable[ResourceSlice],
        allocated: Iterable[DeviceID] | Holdings = (),
        features: Features = _DEFAULT_FEATURES,
        share_ids: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        """`claims`: the pod's claims that need an allocation. `allocated`: what claims already hold
        (`Holdings.of_claims`, or just the devices they hold whole, see `allocated_devices`).
        `share_ids` makes the shareID of each new share of a device (a lowercase UUID, as the API wants)."""
        self.claims = list(claims)
        self.classes = dict(classes) if isinstance(classes, Mapping) else {c.name: c for c in classes}
        self.slices = list(slices)
        self.holdings = allocated if isinstance(allocated, Holdings) else Holdings.of_devices(allocated)
        self.allocated = set(self.holdings.exclusive)
        self.features = features
        self.share_ids = share_ids

    def allocate(self, node: Node | Mapping[str, Any] | str) -> list[dict[str, Any]] | None:
        return _Search(self, node if isinstance(node, Node) else Node.from_object(node)).run()


def allocated_devices(claims: Iterable[ResourceClaim]) -> set[DeviceID]:
    """Devices held whole by allocated claims (admin access and shares do not hold a device)."""
    return set(Holdings.of_claims(claims).exclusive)


class _Search:
    def __init__(self, allocator: Allocator, node: Node) -> None:
        self.a = allocator
        self.node = node
        self.pools: list[Pool] = []
        self.requests: dict[tuple[int, int, int], Request] = {}
        self.constraints: list[list[AttributeConstraint]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.results: list[list[Result]] = [[] for _ in allocator.claims]
        self.selected_sub: dict[tuple[int, int], int] = {}
        self._matches: dict[tuple[Any, ...], bool] = {}
        self._activations: dict[DeviceID, Mapping[str, Any]] = {}
        self.counters = CounterLedger(allocator.holdings.is_allocated)
        self.allocating_capacity: dict[DeviceID, list[Mapping[str, int]]] = {}

    def run(self) -> list[dict[str, Any]] | None:
        a = self.a
        self.pools = gather_pools(a.slices, self.node, partitionable_devices=a.features.partitionable_devices)
        # Every device in pool and slice order; an invalid pool is one entry without a device, so the
        # search stops there (with the scheduler's error) only when it gets that far.
        self.positions: list[tuple[Pool, Candidate | None]] = [
            entry
            for pool in self.pools
            for entry in (
                [(pool, Candidate(*d, pool)) for d in pool.devices()]
                if not pool.invalid_reason
                else [(pool, None)]
            )
        ]
        for ci, claim in enumerate(a.claims):
            minimum = 0
            for ri, request in enumerate(claim.requests):
                check_features(claim, request, a.features)
                if request.first_available:
                    fewest = None
                    for si, sub in enumerate(request.first_available):
                        data = self._validate((ci, ri, si), sub.name, request.name, sub.exactly)
                        self.requests[(ci, ri, si)] = data
                        fewest = data.num_devices if fewest is None else min(fewest, data.num_devices)
                    minimum += fewest or 0
                else:
                    assert request.exactly is not None
                    data = self._validate((ci, ri, 0), request.name, None, request.exactly)
                    self.requests[(ci, ri, 0)] = data
                    minimum += data.num_devices
            if minimum > ALLOCATION_RESULTS_MAX:
                raise AllocationError(
                    f"claim {claim.ref}: number of requested devices {minimum} exceeds the claim limit of "
                    f"{ALLOCATION_RESULTS_MAX}"
                )
            self.constraints.append(claim_constraints(claim))
        if not self._allocate_one(0, 0, 0, 0, False):
            return None
        return [self._allocation(ci) for ci in range(len(a.claims))]

    # ---- requests ---------------------------------------------------------------------------------

    def _validate(
        self, key: tuple[int, int, int], name: str, parent: str | None, exact: ExactRequest
    ) -> Request:
        claim = self.a.claims[key[0]]
        if exact.admin_access and not self.a.features.admin_access:
            raise AllocationError(
                f"claim {claim.ref}, request {name}: admin access is requested, but the feature is disabled"
            )
        device_class = self.a.classes.get(exact.device_class_name)
        if device_class is None:
            class_name = exact.device_class_name
            raise AllocationError(
                f"claim {claim.ref}, request {name}: could not retrieve device class {class_name}: "
                f'deviceclass.resource.k8s.io "{class_name}" not found'
            )
        data = Request(name, parent, exact, device_class, 0)
        if exact.allocation_mode == "ExactCount":
            data.num_devices = exact.count
        elif exact.allocation_mode == "All":
            data.all_devices = []
            for pool in self.pools:
                why = "being updated" if pool.incomplete else "invalid" if pool.invalid_reason else ""
                if why:
                    raise AllocationError(
                        f"claim {claim.ref}, request {name}: asks for all devices, but resource pool "
                        f"{pool.id} is currently {why}"
                    )
                for device_id, device, slice_ in pool.devices():
                    candidate = Candidate(device_id, device, slice_, pool)
                    if self._selectable(key, data, device_id, device, slice_) and self._capacity_fits(
                        data, candidate
                    ):
                        data.all_devices.append(candidate)
            data.num_devices = len(data.all_devices)
        else:
            raise AllocationError(
                f"claim {claim.ref}, request {name}: unsupported count mode {exact.allocation_mode}"
            )
        return data

    # ---- the search -------------------------------------------------------------------------------

    def _in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.a.holdings.exclusive or bool(self.allocating.get(device_id))

    def _allocate_one(self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: int = 0) -> bool:
        """Allocate device `di` of request (ci, ri, si) and everything after it. `start`: the position in
        pool order after the request's previous device (allocateOne's startLocation): a request's devices
        are combinations, never the same device twice, even one that allows multiple allocations."""
        claims = self.a.claims
        if ci >= len(claims):
            return True
        if ri >= len(claims[ci].requests):
            return self._allocate_one(ci + 1, 0, 0, 0, False)
        data = self.requests[(ci, ri, si)]
        if not in_sub and data.parent is not None:
            sub = 0
            while (ci, ri, sub) in self.requests:
                if self._allocate_one(ci, ri, sub, 0, True):
                    self.selected_sub[(ci, ri)] = sub
                    return True
                sub += 1
            return False
        all_mode = data.exact.allocation_mode == "All"
        if all_mode and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self._allocate_one(ci, ri + 1, 0, 0, False)
        if len(self.results[ci]) + data.num_devices - di > ALLOCATION_RESULTS_MAX:
            return False
        if all_mode:
            assert data.all_devices is not None
            undo = self._allocate_device(ci, data, data.all_devices[di], must=True)
            if undo is None:
                return False
            if self._allocate_one(ci, ri, si, di + 1, in_sub):
                return True
            undo()
            return False
        for position in range(start, len(self.positions)):
            pool, candidate = self.positions[position]
            if candidate is None:
                raise AllocationError(f"pool {pool.name} is invalid: {pool.invalid_reason}")
            device_id = candidate.id
            if data.exact.admin_access:
                if ci in self.allocating.get(device_id, ()):
                    continue
            elif self._in_use(device_id):
                continue
            if not self._selectable((ci, ri, si), data, device_id, candidate.device, candidate.slice):
                continue
            if not self._capacity_fits(data, candidate):
                continue
            undo = self._allocate_device(ci, data, candidate, must=False)
            if undo is None:
                continue
            if self._allocate_one(ci, ri, si, di + 1, in_sub, position + 1):
                return True
            undo()
        return False

    def _allocate_device(
        self, ci: int, data: Request, candidate: Candidate, *, must: bool
    ) -> Callable[[], None] | None:
        device_id = candidate.id
        features = self.a.features
        shared = features.consumable_capacity and candidate.device.allow_multiple_allocations
        if data.exact.admin_access:
            if not shared and ci in self.allocating.get(device_id, ()):
                return None
        elif self._in_use(device_id):
            return None
        device = candidate.device
        if device.consumes_counters and not features.partitionable_devices:
            return None
        # A device shared already (by an allocated claim or earlier in this search) paid its counters.
        pays_counters = bool(device.consumes_counters) and not (shared and self._capacity_in_use(device_id))
        if pays_counters:
            if candidate.pool is None or candidate.pool.incomplete:
                return None  # the counter sets of a pool still being published are not all known
            if self.counters.take(candidate.pool, device) is not None:
                return None
        base, sub = (data.parent, data.name) if data.parent else (data.name, "")
        if features.device_taints and not all_taints_tolerated(device, data.exact):
            if pays_counters:
                self._give_back_counters(candidate)
            return None
        constraints = self.constraints[ci]
        for i, constraint in enumerate(constraints):
            if not constraint.add(base, sub, candidate):
                if pays_counters:
                    self._give_back_counters(candidate)
                if must:
                    raise AllocationError(
                        f"claim {self.a.claims[ci].ref}, request {data.name}: cannot add device {device_id} "
                        "because a claim constraint would not be satisfied"
                    )
                for earlier in constraints[:i]:
                    earlier.remove(base, sub)
                return None
        result = Result(data, candidate)
        if shared:
            wanted = request_demand(data, candidate)
            assert wanted is not None  # _capacity_fits said yes
            result.consumed = wanted
            result.share_id = self.a.share_ids()
            self.allocating_capacity.setdefault(device_id, []).append(wanted)
        else:
            self.allocating.setdefault(device_id, set()).add(ci)
        self.results[ci].append(result)

        def undo() -> None:
            for constraint in constraints:
                constraint.remove(base, sub)
            if shared:
                self.allocating_capacity[device_id].remove(result.consumed or {})
                if not self.allocating_capacity[device_id]:
                    del self.allocating_capacity[device_id]
            else:
                self.allocating[device_id].discard(ci)
            if pays_counters:
                self._give_back_counters(candidate)
            self.results[ci].pop()

        return undo

    # ---- counters and capacity --------------------------------------------------------------------

    def _give_back_counters(self, candidate: Candidate) -> None:
        assert candidate.pool is not None
        self.counters.give_back(candidate.pool, candidate.device)

    def _capacity_in_use(self, device_id: DeviceID) -> bool:
        return self.a.holdings.consumed(device_id) is not None or device_id in self.allocating_capacity

    def _capacity_fits(self, data: Request, candidate: Candidate) -> bool:
        """CmpRequestOverCapacity: the request policy and what earlier allocations consumed."""
        if not self.a.features.consumable_capacity:
            return True
        wanted = request_demand(data, candidate)
        if wanted is None:
            return False
        consumed = [
            self.a.holdings.consumed(candidate.id) or {},
            *self.allocating_capacity.get(candidate.id, ()),
        ]
        try:
            return shortfall(wanted, candidate.device, *consumed) is None
        except CapacityError:
            return False

    # ---- selection --------------------------------------------------------------------------------

    def activation(self, device_id: DeviceID, device: Device) -> Mapping[str, Any]:
        if device_id not in self._activations:
            try:
                self._activations[device_id] = device_activation(
                    device_id.driver, device.attributes, device.capacity
                )
            except CelError as err:
                raise AllocationError(f"device {device_id}: {err}") from None
        return self._activations[device_id]

    def _selectable(
        self,
        key: tuple[int, int, int],
        data: Request,
        device_id: DeviceID,
        device: Device,
        slice_: ResourceSlice,
    ) -> bool:
        cache_key = (device_id, *key)
        if cache_key in self._matches:
            return self._matches[cache_key]
        claim = self.a.claims[key[0]]
        activation = None
        matches = True
        for source, selectors in (
            (f"class {data.device_class.name}", data.device_class.selectors),
            (f"claim {claim.ref}", data.exact.selectors),
        ):
            for i, expression in enumerate(selectors):
                if activation is None:
                    activation = self.activation(device_id, device)
                if not evaluate_selector(source, i, expression, activation):
                    matches = False
                    break
            if not matches:
                break
        if matches and slice_.per_device_node_selection:
            matches = reachable(self.node, device.node_name, device.all_nodes, device.node_selector)
        self._matches[cache_key] = matches
        return matches

    # ---- the result -------------------------------------------------------------------------------

    def _allocation(self, ci: int) -> dict[str, Any]:
        claim = self.a.claims[ci]
        chosen = [
            self.requests[(ci, ri, self.selected_sub.get((ci, ri), 0))] for ri in range(len(claim.requests))
        ]
        return allocation_json(claim, self.results[ci], chosen, device_taints=self.a.features.device_taints)
