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
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import semver

from .capacity import CapacityError, demand, shortfall, status_quantity
from .cel import CelError, compile_selector, device_activation
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
class _Request:
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
class _Result:
    request: _Request
    candidate: Candidate
    share_id: str = ""
    consumed: Mapping[str, int] | None = None  # for a share: capacity name -> nano-units


def all_taints_tolerated(device: Device, exact: ExactRequest) -> bool:
    return all(any(t.tolerates(taint) for t in exact.tolerations) for taint in device.taints)


def _attribute_key(value: Mapping[str, Any]) -> tuple[str, Any] | None:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return kind, value[kind]
    return None


class _Constraint:
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


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "version" and b[1] != a[1]:
        try:
            return semver.Version.parse(str(a[1])).compare(str(b[1])) == 0
        except ValueError:
            return False
    return bool(a[1] == b[1])


class Allocator:
    def __init__(
        self,
        claims: Sequence[ResourceClaim],
        classes: Mapping[str, DeviceClass] | Iterable[DeviceClass],
        slices: Iterable[ResourceSlice],
        allocated: Iterable[DeviceID] | Holdings = (),
        features: Features = Features(),
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
        self.requests: dict[tuple[int, int, int], _Request] = {}
        self.constraints: list[list[_Constraint]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.results: list[list[_Result]] = [[] for _ in allocator.claims]
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
                if not a.features.consumable_capacity:
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
                if request.first_available:
                    if not a.features.prioritized_list:
                        raise AllocationError(
                            f"claim {claim.ref}, request {request.name}: has subrequests, but the "
                            "DRAPrioritizedList feature is disabled"
                        )
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
            constraints = []
            for i, c in enumerate(claim.constraints):
                if c.match_attribute:
                    constraints.append(_Constraint(c.requests, c.match_attribute, distinct=False))
                elif c.distinct_attribute:
                    constraints.append(_Constraint(c.requests, c.distinct_attribute, distinct=True))
                else:
                    raise AllocationError(
                        f"claim {claim.ref}, constraint #{i}: empty constraint (unsupported constraint type?)"
                    )
            self.constraints.append(constraints)
        if not self._allocate_one(0, 0, 0, 0, False):
            return None
        return [self._allocation(ci) for ci in range(len(a.claims))]

    # ---- requests ---------------------------------------------------------------------------------

    def _validate(
        self, key: tuple[int, int, int], name: str, parent: str | None, exact: ExactRequest
    ) -> _Request:
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
        data = _Request(name, parent, exact, device_class, 0)
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
        self, ci: int, data: _Request, candidate: Candidate, *, must: bool
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
        result = _Result(data, candidate)
        if shared:
            wanted = self._demand(data, candidate)
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

    def _demand(self, data: _Request, candidate: Candidate) -> dict[str, int] | None:
        """What allocating the candidate for the request consumes of its capacities; None when the
        device cannot take the request (a capacity it lacks, or a quantity that cannot be read)."""
        try:
            wanted = demand(
                data.exact.capacity_requests, candidate.device, candidate.id.driver, data.result_name
            )
        except CapacityError:
            return None  # the scheduler skips the device (and logs the error at V(7))
        return None if not isinstance(wanted, dict) else wanted

    def _capacity_fits(self, data: _Request, candidate: Candidate) -> bool:
        """CmpRequestOverCapacity: the request policy and what earlier allocations consumed."""
        if not self.a.features.consumable_capacity:
            return True
        wanted = self._demand(data, candidate)
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
        data: _Request,
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
        results = []
        for result in self.results[ci]:
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
                        name: status_quantity(amount, capacity[name])
                        for name, amount in result.consumed.items()
                    }
            if result.request.exact.tolerations and self.a.features.device_taints:
                entry["tolerations"] = [_toleration_json(t) for t in result.request.exact.tolerations]
            results.append(entry)
        config: list[dict[str, Any]] = []
        chosen: dict[int, _Request] = {}
        for ri, _ in enumerate(claim.requests):
            chosen[ri] = self.requests[(ci, ri, self.selected_sub.get((ci, ri), 0))]
            for class_config in chosen[ri].device_class.config:
                config.append({"source": "FromClass", **{k: v for k, v in class_config.items()}})
        for claim_config in claim.config:
            names = list(claim_config.get("requests") or [])
            applies = not names or any(
                r.name in names or (chosen[ri].parent is not None and chosen[ri].result_name in names)
                for ri, r in enumerate(claim.requests)
            )
            if applies:
                config.append({"source": "FromClaim", **{k: v for k, v in claim_config.items()}})
        allocation: dict[str, Any] = {"devices": {"results": results}}
        if config:
            allocation["devices"]["config"] = config
        selector = _node_selector([r.candidate for r in self.results[ci]])
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation


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
