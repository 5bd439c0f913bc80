"""Conversion between the served versions of resource.k8s.io and the stored (hub) shape, which is v1.

As the real API server does, an object is stored once and read or written in any served version:
- v1 and v1beta2 have the same shape;
- v1beta1 (1.32/1.33) wraps a device's fields in `basic:` (`devices[].basic.attributes`), and a claim
  request's fields sit on the request itself instead of under `exactly:`.
Other groups have one version each and pass through unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from kubegpu.resourceapi.model import EXACT_FIELDS

from .kinds import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES, ResourceKind


def to_hub(kind: ResourceKind, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A request body in `version` as the stored (v1) shape; `obj` is not changed."""
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        if kind is RESOURCE_SLICES:
            for device in _list(out.get("spec"), "devices"):
                basic = device.pop("basic", None) or {}
                device.update(basic)
        elif kind is RESOURCE_CLAIMS:
            _requests_to_hub(out.get("spec"))
        elif kind is RESOURCE_CLAIM_TEMPLATES:
            _requests_to_hub((out.get("spec") or {}).get("spec"))
    out["apiVersion"] = kind.api_version(kind.versions[0])
    out["kind"] = kind.kind
    return out


def from_hub(kind: ResourceKind, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A stored object as `version` shows it, with that version's apiVersion."""
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        if kind is RESOURCE_SLICES:
            spec = out.get("spec")
            devices = _list(spec, "devices")
            if devices and isinstance(spec, dict):
                spec["devices"] = [
                    {"name": d.get("name", ""), "basic": {k: v for k, v in d.items() if k != "name"}}
                    for d in devices
                ]
        elif kind is RESOURCE_CLAIMS:
            _requests_from_hub(out.get("spec"))
        elif kind is RESOURCE_CLAIM_TEMPLATES:
            _requests_from_hub((out.get("spec") or {}).get("spec"))
    out["apiVersion"] = kind.api_version(version)
    out["kind"] = kind.kind
    return out


def _list(parent: Any, key: str) -> list[dict[str, Any]]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _requests(claim_spec: Any) -> list[dict[str, Any]]:
    devices = claim_spec.get("devices") if isinstance(claim_spec, dict) else None
    return _list(devices, "requests")


def _requests_to_hub(claim_spec: Any) -> None:
    for request in _requests(claim_spec):
        if "firstAvailable" in request or "exactly" in request:
            continue
        exactly = {f: request.pop(f) for f in EXACT_FIELDS if f in request}
        request["exactly"] = exactly


def _requests_from_hub(claim_spec: Any) -> None:
    for request in _requests(claim_spec):
        exactly = request.pop("exactly", None)
        if isinstance(exactly, dict):
            request.update(exactly)
