"""The API server's validation, for the rules a DRA driver or a claim author trips over.

Objects are checked in the stored (v1) shape, so field paths read as in v1 (`spec.devices[0].attributes`,
`spec.devices.requests[0].exactly.count`). Modelled (apimachinery / `pkg/apis/resource/validation`):
metadata names and labels; ResourceSlice driver, pool, node selection (exactly one), device count limits
(128, or 64 with taints or counters), device names, attribute and capacity count (32), names, value types
and limits, taint effects, immutable driver and nodeName; ResourceClaim request names, exactly-or-
firstAvailable, class names, allocation modes and counts, CEL selectors that must compile, constraints,
immutable spec; claim status: reservedFor (at most 256, unique, needs an allocation) and an allocation that
cannot change once set; DeviceClass selectors and config; a pod's `status.extendedResourceClaimStatus`
(`pod_status`). Partitionable devices and consumable capacity
(sharedCounters, consumesCounters, request policies, capacity requests, shareID) are in `partitionable`,
a driver's `status.devices` in `device_status`,
the name rules (DNS labels and subdomains, driver names, qualified IDs) and their texts in `names`.
Not modelled: everything else (e.g. opaque config
size, node selectors' syntax, admin access namespaces).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import semver

from kubegpu.common import quantity
from kubegpu.common.k8s_names import is_dns1123_subdomain, is_qualified_name

from .deployments import deployment_errors
from .device_status import device_statuses
from .errors import FieldError
from .kinds import (
    DEPLOYMENTS,
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceKind,
)
from .names import DNS_LABEL, DNS_LABEL_MSG, DNS_SUBDOMAIN_MSG, driver_name, qualified_id
from .partitionable import allocation_results, capacity_requests, device_fields, shared_counters
from .pod_status import validate_pod_status

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_STRING = 64
MAX_RESERVED_FOR = 256
MAX_REQUESTS = 32
MAX_CEL_LENGTH = 10 * 1024
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_NODE_SELECTION_TEXT = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)
TAINT_EFFECTS = ("NoExecute", "NoSchedule")
ALLOCATION_MODES = ("All", "ExactCount")

CelChecker = Callable[[str], str | None]  # an expression -> its compile error, None when it compiles


def validate(
    kind: ResourceKind, obj: Mapping[str, Any], old: Mapping[str, Any] | None, check_cel: CelChecker
) -> list[FieldError]:
    """Every error in `obj` (the new state) given `old` (None on create)."""
    errors = _metadata(kind, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    if kind is RESOURCE_SLICES:
        errors += _slice_spec(spec, (old or {}).get("spec"))
    elif kind is RESOURCE_CLAIMS:
        errors += _claim_spec(spec, "spec", check_cel)
        if old is not None and old.get("spec") != obj.get("spec"):
            errors.append(FieldError.invalid("spec", spec, "field is immutable"))
        errors += _claim_status(obj.get("status") or {}, (old or {}).get("status") or {})
    elif kind is RESOURCE_CLAIM_TEMPLATES:
        errors += _claim_spec(spec.get("spec") or {}, "spec.spec", check_cel)
    elif kind is PODS:
        errors += validate_pod_status(obj)
    elif kind is DEPLOYMENTS:
        errors += deployment_errors(obj, old)
    elif kind is DEVICE_CLASSES:
        errors += _selectors(spec.get("selectors"), "spec.selectors", check_cel)
        for i, config in enumerate(spec.get("config") or []):
            errors += _opaque(config, f"spec.config[{i}]")
    return errors


def _metadata(kind: ResourceKind, meta: Mapping[str, Any]) -> list[FieldError]:
    errors = []
    name = meta.get("name") or ""
    if not name:
        errors.append(FieldError.required("metadata.name", "name or generateName is required"))
    elif not is_dns1123_subdomain(name):
        errors.append(FieldError.invalid("metadata.name", name, DNS_SUBDOMAIN_MSG))
    if kind.namespaced and meta.get("namespace") and not DNS_LABEL.fullmatch(meta["namespace"]):
        errors.append(FieldError.invalid("metadata.namespace", meta["namespace"], DNS_LABEL_MSG))
    for key, value in (meta.get("labels") or {}).items():
        if not is_qualified_name(key):
            errors.append(
                FieldError.invalid(
                    "metadata.labels",
                    key,
                    "name part must consist of alphanumeric characters, '-', '_' or '.'",
                )
            )
        if (
            not isinstance(value, str)
            or len(value) > 63
            or not re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value)
        ):
            errors.append(
                FieldError.invalid(
                    "metadata.labels",
                    value,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                    "or '.', and must start and end with an alphanumeric character",
                )
            )
    return errors


def _slice_spec(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    errors = driver_name(spec.get("driver"), "spec.driver")
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append(FieldError.required("spec.pool.name"))
    count = pool.get("resourceSliceCount", 0)
    if not isinstance(count, int) or count <= 0:
        errors.append(FieldError.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or generation < 0:
        errors.append(
            FieldError.invalid("spec.pool.generation", generation, "must be greater than or equal to 0")
        )
    chosen = [f for f in _NODE_SELECTION if spec.get(f) not in (None, "", False)]
    if not chosen:
        errors.append(FieldError.required("spec", _NODE_SELECTION_TEXT))
    elif len(chosen) > 1:
        errors.append(
            FieldError.invalid(
                "spec", {f: spec[f] for f in chosen}, _NODE_SELECTION_TEXT + ", but multiple fields are set"
            )
        )
    devices = spec.get("devices") or []
    if spec.get("sharedCounters") and devices:
        errors.append(FieldError.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    errors += shared_counters(spec)
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices if isinstance(d, dict))
    maximum = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES_PER_SLICE
    if len(devices) > maximum:
        errors.append(FieldError.too_many("spec.devices", len(devices), maximum))
    seen: set[str] = set()
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        name = device.get("name") or ""
        if not name:
            errors.append(FieldError.required(f"{path}.name"))
        elif not DNS_LABEL.fullmatch(name) or len(name) > 63:
            errors.append(FieldError.invalid(f"{path}.name", name, DNS_LABEL_MSG))
        elif name in seen:
            errors.append(FieldError.duplicate(f"{path}.name", name))
        seen.add(name)
        errors += _device(device, path)
    if old:
        for immutable in ("driver", "nodeName"):
            if old.get(immutable) != spec.get(immutable):
                errors.append(
                    FieldError.invalid(f"spec.{immutable}", spec.get(immutable), "field is immutable")
                )
    return errors


def _device(device: Mapping[str, Any], path: str) -> list[FieldError]:
    errors = []
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            FieldError.too_many(path, len(attributes) + len(capacity), MAX_ATTRIBUTES_AND_CAPACITIES)
        )
    for name, value in attributes.items():
        apath = f"{path}.attributes[{name}]"
        errors += qualified_id(name, apath)
        given = [k for k in ("int", "bool", "string", "version") if isinstance(value, dict) and k in value]
        if len(given) != 1:
            errors.append(FieldError.invalid(apath, value, "exactly one value must be specified"))
            continue
        if "string" in value and len(str(value["string"])) > MAX_ATTRIBUTE_STRING:
            errors.append(FieldError.too_long(f"{apath}.string", MAX_ATTRIBUTE_STRING))
        if "version" in value:
            text = str(value["version"])
            if len(text) > MAX_ATTRIBUTE_STRING:
                errors.append(FieldError.too_long(f"{apath}.version", MAX_ATTRIBUTE_STRING))
            elif not semver.Version.is_valid(text):
                errors.append(
                    FieldError.invalid(
                        f"{apath}.version", text, "must be a string compatible with semver.org spec 2.0.0"
                    )
                )
    for name, value in capacity.items():
        cpath = f"{path}.capacity[{name}]"
        errors += qualified_id(name, cpath)
        raw = value.get("value") if isinstance(value, dict) else None
        if raw is None:
            errors.append(FieldError.required(f"{cpath}.value"))
            continue
        try:
            quantity.parse(raw)
        except quantity.QuantityError as err:
            errors.append(FieldError.invalid(f"{cpath}.value", raw, str(err)))
    for i, taint in enumerate(device.get("taints") or []):
        tpath = f"{path}.taints[{i}]"
        key = taint.get("key") or ""
        if not key:
            errors.append(FieldError.required(f"{tpath}.key"))
        elif not is_qualified_name(key):
            errors.append(
                FieldError.invalid(
                    f"{tpath}.key", key, "name part must consist of alphanumeric characters, '-', '_' or '.'"
                )
            )
        effect = taint.get("effect") or ""
        if not effect:
            errors.append(FieldError.required(f"{tpath}.effect"))
        elif effect not in TAINT_EFFECTS:
            errors.append(FieldError.not_supported(f"{tpath}.effect", effect, TAINT_EFFECTS))
    return errors + device_fields(device, path)


def _selectors(selectors: Any, path: str, check_cel: CelChecker) -> list[FieldError]:
    errors = []
    for i, selector in enumerate(selectors or []):
        expr_path = f"{path}[{i}].cel.expression"
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if not expression:
            errors.append(
                FieldError.required(f"{path}[{i}].cel" if not (selector or {}).get("cel") else expr_path)
            )
            continue
        if len(expression) > MAX_CEL_LENGTH:
            errors.append(FieldError.too_long(expr_path, MAX_CEL_LENGTH))
            continue
        problem = check_cel(expression)
        if problem:
            errors.append(FieldError.invalid(expr_path, expression, problem))
    return errors


def _opaque(config: Mapping[str, Any], path: str) -> list[FieldError]:
    opaque = config.get("opaque")
    if not isinstance(opaque, dict):
        return [FieldError.required(f"{path}.opaque")]
    errors = driver_name(opaque.get("driver"), f"{path}.opaque.driver")
    if "parameters" not in opaque:
        errors.append(FieldError.required(f"{path}.opaque.parameters"))
    return errors


def _exact_request(exact: Mapping[str, Any], path: str, check_cel: CelChecker) -> list[FieldError]:
    errors = []
    class_name = exact.get("deviceClassName") or ""
    if not class_name:
        errors.append(FieldError.required(f"{path}.deviceClassName"))
    elif not is_dns1123_subdomain(class_name):
        errors.append(FieldError.invalid(f"{path}.deviceClassName", class_name, DNS_SUBDOMAIN_MSG))
    errors += _selectors(exact.get("selectors"), f"{path}.selectors", check_cel)
    errors += capacity_requests(exact, path)
    mode = exact.get("allocationMode") or "ExactCount"
    if mode not in ALLOCATION_MODES:
        errors.append(FieldError.not_supported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    elif mode == "ExactCount":
        count = exact.get("count", 1)
        if not isinstance(count, int) or count <= 0:
            errors.append(FieldError.invalid(f"{path}.count", count, "must be greater than zero"))
    elif exact.get("count"):
        errors.append(
            FieldError.invalid(
                f"{path}.count", exact["count"], "must not be specified when allocationMode is 'All'"
            )
        )
    return errors


def _claim_spec(spec: Mapping[str, Any], path: str, check_cel: CelChecker) -> list[FieldError]:
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or []
    errors = []
    if len(requests) > MAX_REQUESTS:
        errors.append(FieldError.too_many(f"{path}.devices.requests", len(requests), MAX_REQUESTS))
    names: set[str] = set()
    for i, request in enumerate(requests):
        rpath = f"{path}.devices.requests[{i}]"
        name = request.get("name") or ""
        if not name:
            errors.append(FieldError.required(f"{rpath}.name"))
        elif not DNS_LABEL.fullmatch(name):
            errors.append(FieldError.invalid(f"{rpath}.name", name, DNS_LABEL_MSG))
        elif name in names:
            errors.append(FieldError.duplicate(f"{rpath}.name", name))
        names.add(name)
        exact, alternatives = request.get("exactly"), request.get("firstAvailable")
        if (exact is None) == (not alternatives):
            errors.append(
                FieldError.required(rpath, "exactly one of `exactly` or `firstAvailable` is required")
            )
        elif exact is not None:
            errors += _exact_request(exact, f"{rpath}.exactly", check_cel)
        else:
            for j, sub in enumerate(alternatives):
                spath = f"{rpath}.firstAvailable[{j}]"
                if not DNS_LABEL.fullmatch(sub.get("name") or ""):
                    errors.append(FieldError.invalid(f"{spath}.name", sub.get("name") or "", DNS_LABEL_MSG))
                errors += _exact_request(sub, spath, check_cel)
    for i, constraint in enumerate(devices.get("constraints") or []):
        cpath = f"{path}.devices.constraints[{i}]"
        for j, request in enumerate(constraint.get("requests") or []):
            if request.split("/")[0] not in names:
                errors.append(
                    FieldError.invalid(
                        f"{cpath}.requests[{j}]",
                        request,
                        "must be the name of a request in the claim or the name of a request and a "
                        "subrequest separated by '/'",
                    )
                )
        given = [k for k in ("matchAttribute", "distinctAttribute") if constraint.get(k)]
        if len(given) != 1:
            errors.append(
                FieldError.required(
                    cpath, "exactly one of `matchAttribute` or `distinctAttribute` is required"
                )
            )
            continue
        attribute = constraint[given[0]]
        if "/" not in attribute:
            errors.append(
                FieldError.invalid(
                    f"{cpath}.{given[0]}",
                    attribute,
                    "a fully qualified name must be a domain and a name separated by a slash",
                )
            )
        else:
            errors += qualified_id(attribute, f"{cpath}.{given[0]}")
    for i, config in enumerate(devices.get("config") or []):
        errors += _opaque(config, f"{path}.devices.config[{i}]")
    return errors


def _claim_status(status: Mapping[str, Any], old: Mapping[str, Any]) -> list[FieldError]:
    errors = []
    reserved = status.get("reservedFor") or []
    if len(reserved) > MAX_RESERVED_FOR:
        errors.append(FieldError.too_many("status.reservedFor", len(reserved), MAX_RESERVED_FOR))
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        uid = ref.get("uid") or ""
        if uid in uids:
            errors.append(FieldError.duplicate(f"status.reservedFor[{i}].uid", uid))
        uids.add(uid)
        for required in ("resource", "name", "uid"):
            if not ref.get(required):
                errors.append(FieldError.required(f"status.reservedFor[{i}].{required}"))
    if reserved and not status.get("allocation"):
        errors.append(
            FieldError.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
        )
    before, after = old.get("allocation"), status.get("allocation")
    if before and after and before != after:
        errors.append(FieldError.invalid("status.allocation", after, "field is immutable"))
    elif after and not before:
        errors += allocation_results(status)
    return errors + device_statuses(status)
