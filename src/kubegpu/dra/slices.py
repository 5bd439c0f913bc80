"""ResourceSlices as plain data: which version to speak, the device shapes, the split into slices, the bodies.

The pure half of the publisher (`dra.publisher` does the I/O). Devices come in as resource.k8s.io/v1
`Device` dicts (`{"name", "attributes", "capacity", "taints"?}`); the API server may serve only an older
version, whose shape differs:
- v1 (1.34+) and v1beta2 (1.33+): the device fields sit on the device itself;
- v1beta1 (1.32+): they are wrapped in `basic: {...}`, the name stays outside.

A node with partitionable devices (DynamicMIG) also publishes counter sets. From Kubernetes 1.35 on a slice
holds either devices or `sharedCounters`, so the counter sets travel through the same pipeline as one
pseudo-device `{"sharedCounters": [...]}` (`counters_entry`) that always gets a slice of its own.

The API limits a slice to 128 devices, or 64 when any device in it has taints or consumes counters
(`ResourceSliceMaxDevices`, `ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`); a pool larger than that
spans several slices, each carrying the pool's generation and slice count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

GROUP = "resource.k8s.io"
PLURAL = "resourceslices"
KIND = "ResourceSlice"
# Preferred first: what the kubelet helper's version negotiation picks on each release.
VERSIONS = ("v1", "v1beta2", "v1beta1")
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64

Device = dict[str, Any]


COUNTERS = "sharedCounters"


def counters_entry(counter_sets: Sequence[Mapping[str, Any]]) -> Device:
    """The pseudo-device that stands for a counters-only slice (at most 8 sets: the API's limit)."""
    return {COUNTERS: [dict(s) for s in counter_sets]}


def is_counters(device: Mapping[str, Any]) -> bool:
    return COUNTERS in device


def pick_version(served: Sequence[str]) -> str | None:
    """The newest resource.k8s.io version we speak that the server serves, or None."""
    return next((v for v in VERSIONS if v in served), None)


def to_served(device: Mapping[str, Any], version: str) -> Device:
    """A v1 device dict in `version`'s shape (a new dict; nested values are shared, never changed)."""
    out = dict(device)
    if version != "v1beta1" or is_counters(out):
        return out
    name = out.pop("name", "")
    return {"name": name, "basic": out}


def from_served(device: Mapping[str, Any], version: str) -> Device:
    """A device as `version` serves it, in the v1 shape (a new dict; nested values are shared)."""
    out = dict(device)
    if version != "v1beta1" or is_counters(out):
        return out
    basic = out.pop("basic", None) or {}
    out.update(basic)
    return out


def limited(device: Mapping[str, Any]) -> bool:
    """Whether the device puts its slice under the lower device limit."""
    return bool(device.get("taints") or device.get("consumesCounters"))


def split(devices: Sequence[Device], max_per_slice: int = MAX_DEVICES_PER_SLICE) -> list[list[Device]]:
    """The devices in order, cut into as few slices as the limits allow; at least one (maybe empty) slice.

    A slice holding a tainted device takes at most 64 (or `max_per_slice` when lower); a counters entry
    is a slice of its own.
    """
    if max_per_slice < 1:
        raise ValueError(f"max devices per slice must be at least 1, got {max_per_slice}")
    low = min(max_per_slice, MAX_DEVICES_WITH_TAINTS_OR_COUNTERS)
    high = min(max_per_slice, MAX_DEVICES_PER_SLICE)
    out: list[list[Device]] = [[]]
    has_limited = False
    for device in devices:
        current = out[-1]
        if is_counters(device) or (current and is_counters(current[0])):
            if current:
                out.append([device])
            else:
                current.append(device)
            has_limited = limited(device)
            continue
        with_it = has_limited or limited(device)
        if len(current) + 1 > (low if with_it else high):
            out.append([device])
            has_limited = limited(device)
        else:
            current.append(device)
            has_limited = with_it
    return out


def without_taints(devices: Sequence[Device]) -> tuple[list[Device], list[str]]:
    """For a server that does not serve device taints: the untainted devices, and the names left out.

    A tainted device published without its taint would look healthy, so it leaves the slice instead.
    """
    kept = [d for d in devices if not d.get("taints")]
    return kept, [str(d.get("name", "")) for d in devices if d.get("taints")]


def carry_taint_times(devices: Sequence[Device], known: Sequence[Device]) -> list[Device]:
    """`devices` with each taint's `timeAdded` taken from the same taint on the same device in `known`.

    The API server stamps a taint without `timeAdded` with the time of the write; re-stamping it on every
    generation bump would restart the clock a NoExecute toleration's `tolerationSeconds` counts from.
    """
    times = {
        (d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t["timeAdded"]
        for d in known
        for t in d.get("taints") or []
        if isinstance(t, dict) and t.get("timeAdded")
    }
    if not times:
        return list(devices)
    out = []
    for device in devices:
        taints = device.get("taints")
        if taints:
            device = {**device, "taints": [_stamped(device.get("name"), t, times) for t in taints]}
        out.append(device)
    return out


def _stamped(name: Any, taint: dict[str, Any], times: Mapping[tuple[Any, ...], Any]) -> dict[str, Any]:
    when = times.get((name, taint.get("key"), taint.get("value"), taint.get("effect")))
    return {**taint, "timeAdded": when} if when and not taint.get("timeAdded") else taint


def owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    """The Node as the slices' controlling owner: they go when the Node goes (garbage collection)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}


def spec(
    *, driver: str, node_name: str, generation: int, count: int, devices: Sequence[Device], version: str
) -> dict[str, Any]:
    """One slice's spec in `version`'s shape: the node's pool (named after the node) and its devices, or
    its counter sets when `devices` is a counters entry."""
    out = {
        "driver": driver,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
        "nodeName": node_name,
    }
    if len(devices) == 1 and is_counters(devices[0]):
        return {**out, COUNTERS: devices[0][COUNTERS]}
    return {**out, "devices": [to_served(d, version) for d in devices]}


def new_slice(
    *, driver: str, node_name: str, node_uid: str, version: str, slice_spec: Mapping[str, Any]
) -> dict[str, Any]:
    """A ResourceSlice to create: named by the server from `<node>-<driver>-`, owned by the Node."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": KIND,
        "metadata": {
            "generateName": f"{node_name}-{driver}-",
            "ownerReferences": [owner_reference(node_name, node_uid)],
        },
        "spec": dict(slice_spec),
    }


def devices_of(obj: Mapping[str, Any], version: str) -> list[Device]:
    """A slice's devices (as `version` serves them) in the v1 shape; a counters-only slice's counter sets as
    its counters entry."""
    counters = (obj.get("spec") or {}).get(COUNTERS)
    if counters:
        return [counters_entry(counters)]
    devices = (obj.get("spec") or {}).get("devices") or []
    return [from_served(d, version) for d in devices if isinstance(d, dict)]


def dropped_taints(sent: Sequence[Device], got: Sequence[Device]) -> bool:
    """Whether the server dropped device taints we sent (it does not serve them: DRADeviceTaints off)."""
    got_by_name = {d.get("name"): d for d in got}
    return any(d.get("taints") and not (got_by_name.get(d.get("name")) or {}).get("taints") for d in sent)


def content_key(devices: Sequence[Device]) -> str:
    """One slice's devices as comparable text; the server's `timeAdded` on a taint does not count."""
    return json.dumps([_untimed(d) for d in devices], sort_keys=True)


def _untimed(device: Mapping[str, Any]) -> dict[str, Any]:
    taints = device.get("taints")
    if not taints:
        return {k: v for k, v in device.items() if k != "taints"}
    return {**device, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]}


def generation_of(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) else 0


def slice_count_of(obj: Mapping[str, Any]) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 0)
    return value if isinstance(value, int) else 0


def pool_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def resource_version_of(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (the real server's are etcd revisions); -1 when not one."""
    text = str((obj.get("metadata") or {}).get("resourceVersion", ""))
    return int(text) if text.isdigit() else -1
