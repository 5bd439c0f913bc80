"""KG022: a DRA request's `capacity.requests` against the request policy the cluster's devices publish
(consumable capacity, KEP-5075; NVIDIA's `--consumable-shares`).

For each request that asks for capacity, the devices that pass its class's and its own selectors are
checked one by one, each as if nothing else used it: the amount is rounded as the scheduler rounds it
(validRange step from min, validValues), then held against the policy (max, steps, values) and the
capacity's value. No such device taking it is an error: the claim can never be allocated. Devices that take
it only after rounding it up get a warning with the amount the claim will consume.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.resourceapi import Node as DraNode
from kubegpu.resourceapi import ResourceClaim, explain
from kubegpu.resourceapi.capacity import (
    CapacityError,
    consumed_amount,
    demand,
    fmt,
    nanos,
    resolve_name,
    shortfall,
)
from kubegpu.resourceapi.explain import CLASS_SELECTOR, REQUEST_SELECTOR, SELECTOR_ERROR
from kubegpu.resourceapi.model import DeviceClass, DeviceID, ResourceSlice
from kubegpu.toolkit.dra_facts import slices_per_node

_NOT_SELECTED = (CLASS_SELECTOR, REQUEST_SELECTOR, SELECTOR_ERROR)
_SHOWN = 3


@dataclass(frozen=True)
class CapacityProblem:
    request: str  # request, or request/subrequest
    message: str
    fix: str
    rounded_only: bool  # a warning: it fits, rounded up


def _unit(name: str) -> str:
    return "bytes" if name.rpartition("/")[2] == "memory" else ""


def capacity_problems(
    claim: ResourceClaim,
    classes: Sequence[DeviceClass],
    slices: Sequence[ResourceSlice],
    nodes: Iterable[DraNode],
) -> list[CapacityProblem]:
    asks = {label: exact for label, exact in claim.exact_requests() if exact.capacity_requests}
    if not asks:
        return []
    devices = {DeviceID(s.driver, s.pool, d.name): d for s in slices for d in s.devices if not s.counter_sets}
    selected: dict[str, dict[DeviceID, None]] = {label: {} for label in asks}
    for node, reachable in slices_per_node(slices, list(nodes)):
        if not reachable:
            continue
        for account in explain([claim], classes, reachable, [node]):
            for req in account.requests:
                if req.request in selected:
                    selected[req.request].update(
                        {v.device: None for v in req.verdicts if v.verdict not in _NOT_SELECTED}
                    )
    problems = []
    for label, exact in asks.items():
        problem = _check(
            label, exact.capacity_requests or {}, exact.device_class_name, selected[label], devices
        )
        if problem is not None:
            problems.append(problem)
    return problems


def _check(
    label: str,
    asked: Mapping[str, Any],
    class_name: str,
    candidates: Iterable[DeviceID],
    devices: Mapping[DeviceID, Any],
) -> CapacityProblem | None:
    refusals: list[str] = []
    rounded: list[str] = []
    takes = False
    for device_id in candidates:
        device = devices.get(device_id)
        if device is None:
            continue
        where = f"{device_id.pool}/{device_id.device}"
        try:
            wanted = demand(asked, device, device_id.driver, label)
            if not isinstance(wanted, dict):
                refusals.append(f"{where}: {wanted.describe()}")
                continue
            short = shortfall(wanted, device)
        except CapacityError as err:
            refusals.append(f"{where}: {err}")
            continue
        if short is not None:
            refusals.append(f"{where}: {short.describe(_unit(short.name))}")
            continue
        takes = True
        for name, raw in asked.items():
            key = resolve_name(name, device_id.driver, device.capacity)
            if key is None:
                continue
            amount = nanos(raw, label)
            consumed = consumed_amount(amount, device.capacity[key], label)
            if consumed != amount:
                unit = _unit(key)
                rounded.append(f"{where}: {name} {fmt(amount, unit)} is consumed as {fmt(consumed, unit)}")
    asked_text = ", ".join(f"{k}: {v}" for k, v in sorted(asked.items()))
    if not takes and refusals:
        shown = "; ".join(refusals[:_SHOWN]) + (
            f"; and {len(refusals) - _SHOWN} more" if len(refusals) > _SHOWN else ""
        )
        return CapacityProblem(
            label,
            f"request {label!r} asks for capacity {asked_text}, which no device of class {class_name!r} that "
            f"passes its selectors takes ({shown}); the claim can never be allocated",
            "ask for what the devices' capacity and requestPolicy allow (kubectl get resourceslices -o yaml: "
            "capacity.<name>.value and .requestPolicy), or pick devices that publish that capacity",
            False,
        )
    if rounded:
        return CapacityProblem(
            label,
            f"request {label!r} asks for capacity {asked_text}, which the devices' request policy rounds up: "
            + "; ".join(rounded[:_SHOWN]),
            "ask for the rounded amount so the claim says what it gets (the scheduler records the rounded "
            "amount in the claim's status.allocation consumedCapacity)",
            True,
        )
    return None
