"""ResourceSlices and claims for partitionable devices and consumable capacity, in the v1 shape, written the
way the scheduler's allocator test vectors build them (driver-a, pool-1, device-1, counter-set-1...)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DRIVER_A = "driver-a"
DRIVER_B = "driver-b"
NODE_1 = "node-1"


def counted(name: str, **sets: Mapping[str, str]) -> dict[str, Any]:
    """A device consuming counters: counter set -> {counter: amount}."""
    return {
        "name": name,
        "consumesCounters": [
            {"counterSet": cs, "counters": {c: {"value": v} for c, v in counters.items()}}
            for cs, counters in sets.items()
        ],
    }


def shared(name: str, capacity: Mapping[str, Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    """A device allowing multiple allocations with the given capacities."""
    return {"name": name, "allowMultipleAllocations": True, "capacity": dict(capacity), **extra}


def _selection(node: str | None, per_device: bool) -> dict[str, Any]:
    if per_device:
        return {"perDeviceNodeSelection": True}
    return {"nodeName": node or NODE_1}


def _slice(name: str, content: dict[str, Any], **where: Any) -> dict[str, Any]:
    pool = {
        "name": where["pool"],
        "generation": where["generation"],
        "resourceSliceCount": where["slice_count"],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": where["driver"],
            "pool": pool,
            **_selection(where["node"], where["per_device"]),
            **content,
        },
    }


def device_slice(
    name: str,
    devices: Sequence[Mapping[str, Any]],
    *,
    pool: str = "pool-1",
    slice_count: int = 1,
    driver: str = DRIVER_A,
    node: str | None = NODE_1,
    per_device: bool = False,
    generation: int = 1,
) -> dict[str, Any]:
    where = locals().copy()
    del where["name"], where["devices"]
    return _slice(name, {"devices": [dict(d) for d in devices]}, **where)


def counter_slice(
    name: str,
    sets: Mapping[str, Mapping[str, str]],
    *,
    pool: str = "pool-1",
    slice_count: int = 2,
    driver: str = DRIVER_A,
    node: str | None = NODE_1,
    per_device: bool = False,
    generation: int = 1,
) -> dict[str, Any]:
    """A counters-only slice (the 1.35+ "split" shape)."""
    where = locals().copy()
    del where["name"], where["sets"]
    counter_sets = [
        {"name": cs, "counters": {c: {"value": v} for c, v in counters.items()}}
        for cs, counters in sets.items()
    ]
    return _slice(name, {"sharedCounters": counter_sets}, **where)


def device_class(name: str = "class-a", driver: str = DRIVER_A) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def exact(
    name: str = "req-0",
    count: int = 1,
    *,
    device_class_name: str = "class-a",
    capacity: Mapping[str, str] | None = None,
    selectors: Sequence[str] = (),
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "deviceClassName": device_class_name,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if capacity is not None:
        body["capacity"] = {"requests": dict(capacity)}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subs]}


def claim(name: str, *requests: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [dict(r) for r in (requests or (exact(),))]}},
    }


def allocated(claim_obj: dict[str, Any], *results: Mapping[str, Any]) -> dict[str, Any]:
    """The claim with status.allocation holding `results` (request, driver, pool, device, ...)."""
    return {**claim_obj, "status": {"allocation": {"devices": {"results": [dict(r) for r in results]}}}}


def result(device: str, request: str = "req-0", pool: str = "pool-1", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER_A, "pool": pool, "device": device, **extra}
