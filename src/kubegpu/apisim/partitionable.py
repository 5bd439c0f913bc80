"""The API server's validation of partitionable devices (KEP-4815) and consumable capacity (KEP-5075),
with `pkg/apis/resource/validation`'s words:

- a slice's `sharedCounters` (at most 8 counter sets, unique DNS-label names, 1 to 32 counters each),
- a device's `consumesCounters` (at most 2 entries, unique counter sets, 1 to 32 counters each),
- a capacity's `requestPolicy` (only with `allowMultipleAllocations: true`; `validValues` or `validRange`,
  not both; a default required with either, inside the range or among the values; min <= max <= the
  capacity; a positive step with the default and max whole steps from min; values sorted, unique,
  within the capacity, at most 10),
- a claim request's `capacity.requests` (qualified names, quantities),
- an allocation result's `shareID` (a lowercase RFC 4122 UUID) and `consumedCapacity` (quantities).
Whether a consumed counter set exists is not the API server's business: the scheduler finds that out (the
set may be in another slice of the pool) and calls the pool invalid.

With the DRAPartitionableDevices or DRAConsumableCapacity gate set off (`ApiServerSim(feature_gates=...)`),
their fields are dropped on write as the real server drops disabled fields. Both gates are beta and on in
1.36; the simulator has them on unless a test turns them off, whatever `kubernetes_version` says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubegpu.common import quantity

from .errors import FieldError
from .kinds import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES, ResourceKind
from .names import DNS_LABEL, DNS_LABEL_MSG

MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_CONSUMPTIONS_PER_DEVICE = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_COUNTERS_PER_CONSUMPTION = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NORMALIZED_UID = (
    "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase "
    "hexadecimal characters"
)


def _label(name: str, path: str) -> list[FieldError]:
    if len(name) > 63:
        return [FieldError.invalid(path, name, "must be no more than 63 characters")]
    if not DNS_LABEL.fullmatch(name):
        return [FieldError.invalid(path, name, DNS_LABEL_MSG)]
    return []


def _counters(counters: Any, path: str, maximum: int) -> list[FieldError]:
    if not counters:
        return [FieldError.required(path)]
    if not isinstance(counters, Mapping):
        return [FieldError.invalid(path, counters, "must be a map of counter names to counters")]
    if len(counters) > maximum:
        return [FieldError.too_many(path, len(counters), maximum)]
    errors = []
    for name in sorted(counters):
        errors += _label(str(name), path)  # the key's errors name the map, as validateMap does
        value = (counters[name] or {}).get("value") if isinstance(counters[name], Mapping) else None
        if value is None:
            errors.append(FieldError.required(f"{path}[{name}].value"))
    return errors


def shared_counters(spec: Mapping[str, Any]) -> list[FieldError]:
    sets = spec.get("sharedCounters")
    if sets is None:
        return []
    path = "spec.sharedCounters"
    if len(sets) > MAX_COUNTER_SETS:
        return [FieldError.too_many(path, len(sets), MAX_COUNTER_SETS)]
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        spath = f"{path}[{i}]"
        name = str((counter_set or {}).get("name") or "")
        if not name:
            errors.append(FieldError.required(f"{spath}.name"))
        else:
            errors += _label(name, f"{spath}.name")
        errors += _counters((counter_set or {}).get("counters"), f"{spath}.counters", MAX_COUNTERS_PER_SET)
    for i, counter_set in enumerate(sets):
        name = str((counter_set or {}).get("name") or "")
        if name in seen:
            errors.append(FieldError.duplicate(f"{path}[{i}]", name))
        seen.add(name)
    return errors


def device_fields(device: Mapping[str, Any], path: str) -> list[FieldError]:
    """consumesCounters, and the capacities' request policies against allowMultipleAllocations."""
    errors: list[FieldError] = []
    consumptions = device.get("consumesCounters") or []
    cpath = f"{path}.consumesCounters"
    if len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
        errors.append(FieldError.too_many(cpath, len(consumptions), MAX_CONSUMPTIONS_PER_DEVICE))
    else:
        seen: set[str] = set()
        for i, consumption in enumerate(consumptions):
            counter_set = str((consumption or {}).get("counterSet") or "")
            if not counter_set:
                errors.append(FieldError.required(f"{cpath}[{i}].counterSet"))
            else:
                errors += _label(counter_set, f"{cpath}[{i}].counterSet")
            errors += _counters(
                (consumption or {}).get("counters"), f"{cpath}[{i}].counters", MAX_COUNTERS_PER_CONSUMPTION
            )
        for i, consumption in enumerate(consumptions):
            counter_set = str((consumption or {}).get("counterSet") or "")
            if counter_set in seen:
                errors.append(FieldError.duplicate(f"{cpath}[{i}]", counter_set))
            seen.add(counter_set)
    multiple = device.get("allowMultipleAllocations") is True
    for name, capacity in sorted((device.get("capacity") or {}).items()):
        policy = capacity.get("requestPolicy") if isinstance(capacity, Mapping) else None
        if policy is None:
            continue
        ppath = f"{path}.capacity[{name}].requestPolicy"
        if not multiple:
            errors.append(FieldError.forbidden(ppath, "allowMultipleAllocations must be true"))
            continue
        errors += request_policy(capacity.get("value"), policy, ppath)
    return errors


def _q(raw: Any) -> int | None:
    try:
        return quantity.parse_nanos(raw)
    except quantity.QuantityError:
        return None


def _text(raw: Any) -> str:
    try:
        return quantity.canonical(raw)
    except quantity.QuantityError:
        return str(raw)


def _like(amount: int, raw: Any) -> str:
    """An amount printed in the format of the quantity it was computed from (binary stays binary)."""
    whole, rest = divmod(amount, quantity.NANO)
    if not rest and whole and whole % 1024 == 0 and str(raw).endswith(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")):
        return quantity.canonical(f"{whole // 1024}Ki")
    return quantity.canonical(f"{amount}n") if rest else quantity.canonical(str(whole))


def request_policy(value: Any, policy: Mapping[str, Any], path: str) -> list[FieldError]:
    """validateRequestPolicy, in the scheduler's order (integer ranges: DRAFractionalCapacityRange off)."""
    capacity = _q(value)
    if capacity is None:
        return []  # the value's own error is reported with the capacity
    values, valid_range = policy.get("validValues") or [], policy.get("validRange")
    if values and valid_range is not None:
        return [
            FieldError.forbidden(
                path,
                'exactly one policy can be specified, cannot specify "validValues" and "validRange" '
                "at the same time",
            )
        ]
    default = policy.get("default")
    if values:
        if default is None:
            return [FieldError.required(f"{path}.default", "required when validValues is defined")]
        return _valid_values(default, value, values, f"{path}.validValues")
    if valid_range is not None:
        if default is None:
            return [FieldError.required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(default, value, valid_range, f"{path}.validRange")
    return []


def _valid_values(default: Any, value: Any, values: list[Any], path: str) -> list[FieldError]:
    errors = []
    amounts = [_q(v) for v in values]
    for i in range(len(values) - 1):
        a, b = amounts[i], amounts[i + 1]
        if a is not None and b is not None and a > b:
            errors.append(
                FieldError.invalid(
                    f"{path}[{i + 1}]", _text(values[i + 1]), "values must be sorted in ascending order"
                )
            )
    if len(values) > MAX_VALID_VALUES:
        errors.append(FieldError.too_many(path, len(values), MAX_VALID_VALUES))
        return errors
    capacity, wanted = _q(value), _q(default)
    found = False
    keys: set[int] = set()
    for i, (raw, amount) in enumerate(zip(values, amounts, strict=True)):
        if amount is None:
            continue
        if capacity is not None and amount > capacity:
            errors.append(
                FieldError.invalid(
                    f"{path}[{i}]", _text(raw), f"option is larger than capacity value: {_text(value)}"
                )
            )
        if amount == wanted:
            found = True
    for i, amount in enumerate(amounts):
        key = None if amount is None else quantity.ceil_div(amount, quantity.NANO)  # quantityKeyInt
        if key is not None and key in keys:
            errors.append(FieldError.duplicate(f"{path}[{i}]", str(key)))
        if key is not None:
            keys.add(key)
    if not found:
        errors.append(
            FieldError.invalid(
                path, _text(default), "default value is not valid according to the requestPolicy"
            )
        )
    return errors


def _valid_range(default: Any, value: Any, valid_range: Mapping[str, Any], path: str) -> list[FieldError]:
    minimum_raw = valid_range.get("min")
    if minimum_raw is None:
        return [FieldError.required(f"{path}.min", "required when validRange is defined")]
    capacity, minimum, wanted = _q(value), _q(minimum_raw), _q(default)
    if capacity is None or minimum is None or wanted is None:
        return []
    errors = []
    cap_text, min_text = _text(value), _text(minimum_raw)
    if minimum > capacity:
        errors.append(
            FieldError.invalid(f"{path}.min", min_text, f"min is larger than capacity value: {cap_text}")
        )
    if wanted < minimum:
        errors.append(
            FieldError.invalid(f"{path}.default", _text(default), f"default is less than min: {min_text}")
        )
    maximum_raw = valid_range.get("max")
    maximum = _q(maximum_raw) if maximum_raw is not None else None
    if maximum is not None:
        max_text = _text(maximum_raw)
        if minimum > maximum:
            errors.append(FieldError.invalid(f"{path}.max", min_text, f"min is larger than max: {max_text}"))
        if maximum > capacity:
            errors.append(
                FieldError.invalid(f"{path}.max", max_text, f"max is larger than capacity value: {cap_text}")
            )
        if wanted > maximum:
            errors.append(
                FieldError.invalid(f"{path}.default", _text(default), f"default is more than max: {max_text}")
            )
    step_raw = valid_range.get("step")
    step = _q(step_raw) if step_raw is not None else None
    if step is None:
        return errors
    step_text = _text(step_raw)
    if step <= 0:
        errors.append(FieldError.invalid(f"{path}.step", step_text, "must be greater than zero"))
        return errors
    if minimum + step > capacity:
        errors.append(
            FieldError.invalid(
                f"{path}.step",
                step_text,
                f"one step {_like(minimum + step, minimum_raw)} is larger than capacity value: {cap_text}",
            )
        )
    whole = [quantity.ceil_div(x, quantity.NANO) for x in (minimum, step)]
    for raw, amount in ((default, wanted), (maximum_raw, maximum)):
        if amount is None or not whole[1]:
            continue
        if (quantity.ceil_div(amount, quantity.NANO) - whole[0]) % whole[1]:
            errors.append(
                FieldError.invalid(
                    f"{path}.step",
                    _text(raw),
                    f"value is not a multiple of a given step ({step_text}) from ({min_text})",
                )
            )
    return errors


def capacity_requests(exact: Mapping[str, Any], path: str) -> list[FieldError]:
    """A request's `capacity.requests`: qualified capacity names and quantities."""
    capacity = exact.get("capacity")
    if capacity is None:
        return []
    errors = []
    for name, raw in sorted(((capacity or {}).get("requests") or {}).items()):
        if _q(raw) is None:
            errors.append(
                FieldError.invalid(f"{path}.capacity.requests[{name}]", raw, quantity.ERR_FORMAT_WRONG)
            )
    return errors


def share_id(value: Any, path: str) -> list[FieldError]:
    """validateUID, as the API server checks an allocation result's shareID."""
    text = str(value)
    if len(text) not in (32, 36, 38, 45):
        return [FieldError.invalid(path, text, f"error validating uid: invalid UUID length: {len(text)}")]
    core = text
    if len(text) == 45:
        core = text[9:] if text[:9].lower() == "urn:uuid:" else ""
    elif len(text) == 38:
        core = text[1:-1] if text[0] == "{" and text[-1] == "}" else ""
    elif len(text) == 32:
        core = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}" if text.isalnum() else ""
    if not _UUID.fullmatch(core):
        return [FieldError.invalid(path, text, "error validating uid: invalid UUID format")]
    if len(text) != 36 or text != text.lower():
        return [FieldError.invalid(path, text, _NORMALIZED_UID)]
    return []


def allocation_results(status: Mapping[str, Any]) -> list[FieldError]:
    """shareID and consumedCapacity of each result of a new allocation."""
    errors = []
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    for i, result in enumerate(results):
        rpath = f"status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            continue
        if result.get("shareID") is not None:
            errors += share_id(result["shareID"], f"{rpath}.shareID")
        for name, raw in sorted((result.get("consumedCapacity") or {}).items()):
            if _q(raw) is None:
                errors.append(
                    FieldError.invalid(f"{rpath}.consumedCapacity[{name}]", raw, quantity.ERR_FORMAT_WRONG)
                )
    return errors


def drop_disabled_sharing_fields(kind: ResourceKind, obj: dict[str, Any], gates: Mapping[str, bool]) -> None:
    """The fields of a gate set off, dropped from an object being written (dropDisabledFields)."""
    partitionable = gates.get("DRAPartitionableDevices", True)
    consumable = gates.get("DRAConsumableCapacity", True)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind is RESOURCE_SLICES:
        if not partitionable:
            spec.pop("sharedCounters", None)
            spec.pop("perDeviceNodeSelection", None)
        for device in spec.get("devices") or []:
            if not isinstance(device, dict):
                continue
            if not partitionable:
                for name in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
                    device.pop(name, None)
            if not consumable:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    if isinstance(capacity, dict):
                        capacity.pop("requestPolicy", None)
    elif kind in (RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES) and not consumable:
        claim_spec = spec.get("spec") if kind is RESOURCE_CLAIM_TEMPLATES else spec
        for request in ((claim_spec or {}).get("devices") or {}).get("requests") or []:
            if isinstance(request, dict):
                (request.get("exactly") or {}).pop("capacity", None)
                for sub in request.get("firstAvailable") or []:
                    if isinstance(sub, dict):
                        sub.pop("capacity", None)
