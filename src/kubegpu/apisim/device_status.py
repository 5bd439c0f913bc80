"""A claim's `status.devices[]` (AllocatedDeviceStatus: what a driver reports per allocated device) as the
API server validates it (`validateDeviceStatus`, `validateRawExtension` in pkg/apis/resource/validation):

- `driver` a driver name, `pool` a pool name (DNS subdomains, `/`-separated), `device` a DNS label;
- the entry names an allocated device of the claim, with its share (`driver/pool/device[/shareID]`):
  otherwise `must be an allocated device in the claim`; each such key at most once (Duplicate);
- `shareID` a normalized UUID; at most 8 `conditions`;
- `data`, when set, a JSON object of at most 10 KiB (`must be a valid JSON object`).
Not modelled: the conditions' own fields and `networkData`'s (interface name, IPs, hardware address).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubegpu.common.k8s_names import is_dns1123_subdomain

from .errors import FieldError
from .names import DNS_LABEL, DNS_LABEL_MSG, DNS_SUBDOMAIN_MSG, driver_name
from .partitionable import share_id

MAX_CONDITIONS = 8
MAX_DATA_BYTES = 10 * 1024


def _allocated(status: Mapping[str, Any]) -> set[str]:
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    return {_key(r) for r in results if isinstance(r, Mapping)}


def _key(entry: Mapping[str, Any]) -> str:
    key = f"{entry.get('driver')}/{entry.get('pool')}/{entry.get('device')}"
    return f"{key}/{entry['shareID']}" if entry.get("shareID") else key


def _pool(name: Any, path: str) -> list[FieldError]:
    if not name:
        return [FieldError.required(path)]
    parts = str(name).split("/")
    if any(not is_dns1123_subdomain(p) for p in parts):
        return [FieldError.invalid(path, name, DNS_SUBDOMAIN_MSG)]
    return []


def _data(data: Any, path: str) -> list[FieldError]:
    if data is None:
        return []
    if len(json.dumps(data, separators=(",", ":"))) > MAX_DATA_BYTES:
        return [FieldError.too_long(path, MAX_DATA_BYTES)]
    if not isinstance(data, Mapping):
        return [FieldError.invalid(path, "<value omitted>", "must be a valid JSON object")]
    return []


def device_statuses(status: Mapping[str, Any]) -> list[FieldError]:
    """Every error in a claim status' `devices`."""
    entries = status.get("devices") or []
    allocated = _allocated(status)
    seen: set[str] = set()
    errors: list[FieldError] = []
    for i, entry in enumerate(entries):
        path = f"status.devices[{i}]"
        if not isinstance(entry, Mapping):
            errors.append(FieldError.invalid(path, entry, "must be an object"))
            continue
        errors += driver_name(entry.get("driver"), f"{path}.driver")
        errors += _pool(entry.get("pool"), f"{path}.pool")
        device = entry.get("device")
        if not device:
            errors.append(FieldError.required(f"{path}.device"))
        elif not DNS_LABEL.fullmatch(str(device)) or len(str(device)) > 63:
            errors.append(FieldError.invalid(f"{path}.device", device, DNS_LABEL_MSG))
        key = _key(entry)
        if key not in allocated:
            errors.append(FieldError.invalid(path, key, "must be an allocated device in the claim"))
        if key in seen:
            errors.append(FieldError.duplicate(path, key))
        seen.add(key)
        conditions = entry.get("conditions") or []
        if len(conditions) > MAX_CONDITIONS:
            errors.append(FieldError.too_many(f"{path}.conditions", len(conditions), MAX_CONDITIONS))
        errors += _data(entry.get("data"), f"{path}.data")
        if entry.get("shareID") is not None:
            errors += share_id(entry["shareID"], f"{path}.shareID")
    return errors
