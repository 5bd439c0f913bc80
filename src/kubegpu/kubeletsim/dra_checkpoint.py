"""The kubelet DRA manager's claim-info cache and its checkpoint, `<kubelet root>/dra_manager_state`.

One entry per claim the kubelet has seen for a pod on this node: claim UID, name, namespace, the pods
using it, and per driver the devices the driver prepared (pool, device, request names, CDI IDs). The
kubelet writes it before calling a driver (so a half-done Prepare is remembered) and after. Whether a
claim is *prepared* is not in the file: after a restart every claim is prepared again (drivers must be
idempotent), and a claim the file does not know is never unprepared by the kubelet.

The JSON shape is the kubelet's (`{"Data": "<DRACheckpoint JSON>", "Checksum": N}`, v1.32 state package).
The kubelet's checksum is FNV-1a over a Go deep-print of its structs that Python cannot reproduce; ours is
FNV-1a over the Data string, and a file whose checksum does not match is refused as corrupt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.common.files import write_atomic

CHECKPOINT_FILE = "dra_manager_state"
_KIND = "DRACheckpoint"
_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()


@dataclass(slots=True)
class ClaimInfo:
    claim_uid: str
    claim_name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    drivers: dict[str, list[PreparedDevice]] = field(default_factory=dict)  # driver -> devices
    prepared: bool = False  # not checkpointed, as in the kubelet

    def cdi_devices(self, request: str) -> list[str]:
        """The CDI IDs a container referencing `request` ("" = the whole claim) gets."""
        ids: list[str] = []
        for driver in sorted(self.drivers):
            for device in self.drivers[driver]:
                if not request or not device.request_names or request in device.request_names:
                    ids.extend(device.cdi_device_ids)
        return ids


def fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) % 2**32
    return value


def to_json(claims: Iterable[ClaimInfo]) -> str:
    states = [
        {
            "ClaimUID": c.claim_uid,
            "ClaimName": c.claim_name,
            "Namespace": c.namespace,
            "PodUIDs": {uid: {} for uid in sorted(c.pod_uids)},  # Go's sets.Set marshals as a map
            "DriverState": {
                driver: {
                    "Devices": [
                        {
                            "PoolName": d.pool_name,
                            "DeviceName": d.device_name,
                            "RequestNames": list(d.request_names) or None,
                            "CDIDeviceIDs": list(d.cdi_device_ids) or None,
                        }
                        for d in devices
                    ]
                    or None
                }
                for driver, devices in sorted(c.drivers.items())
            },
        }
        for c in claims
    ]
    data = json.dumps(
        {"kind": _KIND, "apiVersion": _API_VERSION, "ClaimInfoStateList": states or None},
        separators=(",", ":"),
    )
    return json.dumps({"Data": data, "Checksum": fnv32a(data.encode())}, separators=(",", ":"))


def from_json(text: str) -> list[ClaimInfo]:
    try:
        outer: Mapping[str, Any] = json.loads(text)
        data = outer["Data"]
        if fnv32a(data.encode()) != outer["Checksum"]:
            raise ValueError("checksum mismatch")
        inner = json.loads(data)
        if inner.get("kind") != _KIND or inner.get("apiVersion") != _API_VERSION:
            raise ValueError(f"unexpected kind/apiVersion {inner.get('kind')}/{inner.get('apiVersion')}")
        claims = []
        for state in inner.get("ClaimInfoStateList") or ():
            drivers = {
                driver: [
                    PreparedDevice(
                        d["PoolName"],
                        d["DeviceName"],
                        tuple(d.get("RequestNames") or ()),
                        tuple(d.get("CDIDeviceIDs") or ()),
                    )
                    for d in (driver_state.get("Devices") or ())
                ]
                for driver, driver_state in (state.get("DriverState") or {}).items()
            }
            claims.append(
                ClaimInfo(
                    state["ClaimUID"],
                    state["ClaimName"],
                    state["Namespace"],
                    set(state.get("PodUIDs") or {}),
                    drivers,
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"corrupt DRA manager checkpoint: {exc}") from exc
    return claims


def write_checkpoint(root: Path, claims: Iterable[ClaimInfo]) -> None:
    write_atomic(root / CHECKPOINT_FILE, to_json(claims).encode(), mode=0o600, durable=False)


def read_checkpoint(root: Path) -> list[ClaimInfo] | None:
    try:
        text = (root / CHECKPOINT_FILE).read_text()
    except FileNotFoundError:
        return None
    return from_json(text)
