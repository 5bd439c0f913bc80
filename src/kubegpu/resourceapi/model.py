"""resource.k8s.io objects as the allocator reads them, parsed from API JSON in the v1 (and v1beta2) shape
or the v1beta1 shape (device fields under `basic:`, request fields on the request instead of `exactly:`).

Parsing keeps what allocation needs and refuses what it cannot read with a `ModelError` naming the object
and the field. Attribute values stay in their API form ({"int": 1}, {"version": "1.2.3"}); capacities
as {"value": "80Gi", "requestPolicy": {...}}. Counters (partitionable devices: a slice's `sharedCounters`,
a device's `consumesCounters`) are parsed to exact nano-unit integers, as the allocator sums them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.common import quantity

V1BETA1 = "resource.k8s.io/v1beta1"
ALLOCATION_RESULTS_MAX = 32  # resourceapi.AllocationResultsMaxSize
# ExactDeviceRequest's fields: inline on a v1beta1 DeviceRequest, under `exactly` in v1.
EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


class ModelError(ValueError):
    """An object the allocator cannot read; the message names the object and the field."""


@dataclass(frozen=True, slots=True, order=True)
class DeviceID:
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: DeviceTaint) -> bool:
        """resourceclaim.ToleratesTaint (the core toleration rule, for device taints)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True, slots=True)
class CounterSet:
    """A slice's `sharedCounters[]` entry: counter name -> amount in nano-units."""

    name: str
    counters: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """A device's `consumesCounters[]` entry: what it takes from one counter set while allocated."""

    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    capacity: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    taints: tuple[DeviceTaint, ...] = ()
    node_name: str = ""
    node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False
    consumes_counters: tuple[CounterConsumption, ...] = ()
    allow_multiple_allocations: bool = False

    def attribute(self, qualified: str, driver: str) -> Mapping[str, Any] | None:
        """The attribute `domain/name`, also found unqualified when the domain is the driver's
        (lookupAttribute in the structured allocator)."""
        if qualified in self.attributes:
            return self.attributes[qualified]
        domain, _, ident = qualified.partition("/")
        if domain == driver:
            return self.attributes.get(ident)
        return None


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str = ""
    node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()

    @property
    def shared_counters(self) -> bool:
        return bool(self.counter_sets)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()  # DeviceClassConfiguration, as given


@dataclass(frozen=True, slots=True)
class ExactRequest:
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: str = "ExactCount"
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity_requests: Mapping[str, str] | None = None  # capacity.requests, quantities as given


@dataclass(frozen=True, slots=True)
class SubRequest:
    name: str
    exactly: ExactRequest


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[SubRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...] = ()
    match_attribute: str = ""
    distinct_attribute: str = ""


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    name: str
    namespace: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()  # DeviceClaimConfiguration, as given
    allocation: Mapping[str, Any] | None = None
    reserved_for: tuple[Mapping[str, Any], ...] = ()

    @property
    def ref(self) -> str:
        """namespace/name, as klog.KObj prints a claim in the allocator's errors."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def exact_requests(self) -> list[tuple[str, ExactRequest]]:
        """(request, or request/subrequest; its exact request) for every request and subrequest."""
        out: list[tuple[str, ExactRequest]] = []
        for request in self.requests:
            if request.first_available:
                out += [(f"{request.name}/{s.name}", s.exactly) for s in request.first_available]
            elif request.exactly is not None:
                out.append((request.name, request.exactly))
        return out

    def allocated_devices(self) -> list[tuple[DeviceID, bool]]:
        """(device, admin access) of every result in status.allocation."""
        return [(r.device, r.admin_access) for r in self.allocated_results()]

    def allocated_results(self) -> list[AllocatedResult]:
        """Every result in status.allocation, with its share of a device allowing multiple allocations."""
        results = ((self.allocation or {}).get("devices") or {}).get("results") or []
        return [
            AllocatedResult(
                DeviceID(r.get("driver", ""), r.get("pool", ""), r.get("device", "")),
                bool(r.get("adminAccess")),
                str(r.get("shareID") or ""),
                dict(r.get("consumedCapacity") or {}),
            )
            for r in results
            if isinstance(r, Mapping)
        ]


@dataclass(frozen=True, slots=True)
class AllocatedResult:
    device: DeviceID
    admin_access: bool = False
    share_id: str = ""  # set when the device allows multiple allocations
    consumed_capacity: Mapping[str, Any] = field(default_factory=dict)  # capacity name -> quantity


# ---- parsing -------------------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise ModelError(f"{what} without metadata.name: every object needs a name")
    return meta


def _dict(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ModelError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ModelError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _selectors(value: Any, where: str) -> tuple[str, ...]:
    out = []
    for i, selector in enumerate(_list(value, where)):
        expression = _dict(_dict(selector, f"{where}[{i}]").get("cel"), f"{where}[{i}].cel").get("expression")
        if not isinstance(expression, str) or not expression:
            raise ModelError(f"{where}[{i}].cel.expression is missing: a selector needs a CEL expression")
        out.append(expression)
    return tuple(out)


def _tolerations(value: Any, where: str) -> tuple[DeviceToleration, ...]:
    return tuple(
        DeviceToleration(
            key=t.get("key", ""),
            operator=t.get("operator") or "Equal",
            value=t.get("value", ""),
            effect=t.get("effect", ""),
        )
        for t in (_dict(t, where) for t in _list(value, where))
    )


def _nanos(value: Any, where: str) -> int:
    raw = _dict(value, where).get("value")
    if raw is None:
        raise ModelError(f"{where}.value is missing: a counter needs an amount")
    try:
        return quantity.parse_nanos(raw)
    except quantity.QuantityError as err:
        raise ModelError(f"{where}.value: {err}") from None


def _counters(value: Any, where: str) -> dict[str, int]:
    return {str(name): _nanos(c, f"{where}[{name}]") for name, c in _dict(value, where).items()}


def parse_device(raw: Mapping[str, Any], where: str, v1beta1: bool) -> Device:
    body = _dict(raw.get("basic"), f"{where}.basic") if v1beta1 else raw
    taints = tuple(
        DeviceTaint(t.get("key", ""), t.get("value", ""), t.get("effect", ""))
        for t in (_dict(t, f"{where}.taints") for t in _list(body.get("taints"), f"{where}.taints"))
    )
    return Device(
        name=str(raw.get("name") or ""),
        attributes=dict(_dict(body.get("attributes"), f"{where}.attributes")),
        capacity=dict(_dict(body.get("capacity"), f"{where}.capacity")),
        taints=taints,
        node_name=body.get("nodeName") or "",
        node_selector=body.get("nodeSelector"),
        all_nodes=bool(body.get("allNodes")),
        consumes_counters=tuple(
            CounterConsumption(
                str(c.get("counterSet") or ""), _counters(c.get("counters"), f"{where}.consumesCounters[{i}]")
            )
            for i, c in enumerate(
                _dict(c, f"{where}.consumesCounters")
                for c in _list(body.get("consumesCounters"), f"{where}.consumesCounters")
            )
        ),
        allow_multiple_allocations=bool(body.get("allowMultipleAllocations")),
    )


def parse_slice(obj: Mapping[str, Any]) -> ResourceSlice:
    name = _meta(obj, "ResourceSlice")["name"]
    where = f"ResourceSlice {name}"
    spec = _dict(obj.get("spec"), f"{where} spec")
    pool = _dict(spec.get("pool"), f"{where} spec.pool")
    v1beta1 = obj.get("apiVersion") == V1BETA1
    devices = tuple(
        parse_device(_dict(d, f"{where} spec.devices[{i}]"), f"{where} spec.devices[{i}]", v1beta1)
        for i, d in enumerate(_list(spec.get("devices"), f"{where} spec.devices"))
    )
    return ResourceSlice(
        name=name,
        driver=str(spec.get("driver") or ""),
        pool=str(pool.get("name") or ""),
        generation=int(pool.get("generation") or 0),
        slice_count=int(pool.get("resourceSliceCount") or 0),
        node_name=spec.get("nodeName") or "",
        node_selector=spec.get("nodeSelector"),
        all_nodes=bool(spec.get("allNodes")),
        per_device_node_selection=bool(spec.get("perDeviceNodeSelection")),
        devices=devices,
        counter_sets=tuple(
            CounterSet(
                str(c.get("name") or ""), _counters(c.get("counters"), f"{where} spec.sharedCounters[{i}]")
            )
            for i, c in enumerate(
                _dict(c, f"{where} spec.sharedCounters")
                for c in _list(spec.get("sharedCounters"), f"{where} spec.sharedCounters")
            )
        ),
    )


def parse_class(obj: Mapping[str, Any]) -> DeviceClass:
    name = _meta(obj, "DeviceClass")["name"]
    spec = _dict(obj.get("spec"), f"DeviceClass {name} spec")
    return DeviceClass(
        name=name,
        selectors=_selectors(spec.get("selectors"), f"DeviceClass {name} spec.selectors"),
        config=tuple(
            _dict(c, f"DeviceClass {name} spec.config") for c in _list(spec.get("config"), "spec.config")
        ),
    )


def _exact(raw: Mapping[str, Any], where: str) -> ExactRequest:
    class_name = raw.get("deviceClassName")
    if not class_name:
        raise ModelError(f"{where}.deviceClassName is missing: a request names its DeviceClass")
    mode = raw.get("allocationMode") or "ExactCount"
    count = raw.get("count")
    capacity = raw.get("capacity")
    requests = None
    if capacity is not None:
        requests = {
            str(k): v for k, v in _dict(_dict(capacity, f"{where}.capacity").get("requests"), where).items()
        }
    return ExactRequest(
        device_class_name=str(class_name),
        selectors=_selectors(raw.get("selectors"), f"{where}.selectors"),
        allocation_mode=str(mode),
        count=int(count) if count is not None else (1 if mode == "ExactCount" else 0),
        admin_access=bool(raw.get("adminAccess")),
        tolerations=_tolerations(raw.get("tolerations"), f"{where}.tolerations"),
        capacity_requests=requests,
    )


def parse_claim_spec(
    spec: Mapping[str, Any], where: str, v1beta1: bool
) -> tuple[tuple[DeviceRequest, ...], tuple[Constraint, ...], tuple[Mapping[str, Any], ...]]:
    devices = _dict(spec.get("devices"), f"{where}.devices")
    requests = []
    for i, raw in enumerate(_list(devices.get("requests"), f"{where}.devices.requests")):
        raw = _dict(raw, f"{where}.devices.requests[{i}]")
        rwhere = f"{where}.devices.requests[{i}]"
        name = str(raw.get("name") or "")
        alternatives = tuple(
            SubRequest(str(s.get("name") or ""), _exact(s, f"{rwhere}.firstAvailable[{j}]"))
            for j, s in enumerate(
                _dict(s, rwhere) for s in _list(raw.get("firstAvailable"), f"{rwhere}.firstAvailable")
            )
        )
        if alternatives:
            requests.append(DeviceRequest(name, None, alternatives))
        elif v1beta1 or "exactly" not in raw:
            inline = {k: raw[k] for k in EXACT_FIELDS if k in raw}
            requests.append(
                DeviceRequest(name, _exact(inline if v1beta1 else _dict(raw.get("exactly"), rwhere), rwhere))
            )
        else:
            requests.append(
                DeviceRequest(
                    name, _exact(_dict(raw.get("exactly"), f"{rwhere}.exactly"), f"{rwhere}.exactly")
                )
            )
    constraints = tuple(
        Constraint(
            tuple(c.get("requests") or ()), c.get("matchAttribute") or "", c.get("distinctAttribute") or ""
        )
        for c in (
            _dict(c, f"{where}.devices.constraints")
            for c in _list(devices.get("constraints"), f"{where}.devices.constraints")
        )
    )
    config = tuple(
        _dict(c, f"{where}.devices.config") for c in _list(devices.get("config"), f"{where}.devices.config")
    )
    return tuple(requests), constraints, config


def parse_claim(obj: Mapping[str, Any]) -> ResourceClaim:
    meta = _meta(obj, "ResourceClaim")
    where = f"ResourceClaim {meta.get('namespace', '')}/{meta['name']}"
    v1beta1 = obj.get("apiVersion") == V1BETA1
    requests, constraints, config = parse_claim_spec(
        _dict(obj.get("spec"), f"{where} spec"), f"{where} spec", v1beta1
    )
    status = _dict(obj.get("status"), f"{where} status")
    return ResourceClaim(
        name=meta["name"],
        namespace=meta.get("namespace") or "",
        uid=meta.get("uid") or "",
        requests=requests,
        constraints=constraints,
        config=config,
        allocation=status.get("allocation") or None,
        reserved_for=tuple(_list(status.get("reservedFor"), f"{where} status.reservedFor")),
    )
