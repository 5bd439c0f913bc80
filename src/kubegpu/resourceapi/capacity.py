"""Consumable capacity (KEP-5075, DRAConsumableCapacity) as the scheduler's structured allocator does it.

A claim's request may ask for an amount of a device's capacities (`exactly.capacity.requests`). For every
capacity the device publishes, the amount the allocation consumes is:
- nothing asked: the capacity's `requestPolicy.default`, else the whole capacity value;
- asked, no request policy: what was asked;
- asked, `validRange` with `min`: below min -> min; with `step` rounded up to min + a multiple of step;
- asked, `validValues`: the smallest valid value >= what was asked (else what was asked, which then fails).
The rounded amount must then keep to the policy (the default is always fine; at most `max`; a multiple
of `step` from `min`; one of `validValues`), and what the device's earlier allocations consumed plus this
one may not exceed the capacity's value. A request naming a capacity the device does not publish rules
the device out. Names match with or without the driver's domain (`memory` == `<driver>/memory`).

All amounts are exact integers of nano-units (kubegpu.common.quantity), so nothing rounds on the way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.common import quantity

from .model import Device


class CapacityError(ValueError):
    """A quantity in a claim or a slice that the allocator cannot read."""


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a device's capacity does not take a request: `name` is the device's capacity name."""

    name: str
    reason: str  # "missing", "policy" or "exhausted"
    wanted: int = 0  # nano-units after rounding
    left: int = 0  # nano-units still free before this request

    def describe(self, unit: str = "") -> str:
        if self.reason == "missing":
            return f"the device publishes no capacity {self.name}"
        if self.reason == "policy":
            return f"{self.name}: {fmt(self.wanted, unit)} is not allowed by the device's request policy"
        return f"{self.name}: {fmt(self.wanted, unit)} wanted, {fmt(self.left, unit)} left"


def nanos(raw: Any, where: str) -> int:
    try:
        return quantity.parse_nanos(raw)
    except quantity.QuantityError as err:
        raise CapacityError(f"{where}: {err}") from None


def fmt(amount: int, unit: str = "") -> str:
    """An amount for people: bytes as 10Gi, anything else as its canonical quantity."""
    if unit == "bytes" and amount % quantity.NANO == 0:
        return quantity.format_bytes(amount // quantity.NANO)
    whole, rest = divmod(amount, quantity.NANO)
    return quantity.canonical(str(whole) if not rest else f"{amount}n")


def resolve_name(requested: str, driver: str, capacity: Mapping[str, Any]) -> str | None:
    """The device's capacity key a request names (resolveCapacityName), or None."""
    if requested in capacity:
        return requested
    domain, slash, ident = requested.partition("/")
    if slash:
        return ident if domain == driver and ident in capacity else None
    qualified = f"{driver}/{requested}"
    return qualified if qualified in capacity else None


def _policy_amount(policy: Mapping[str, Any] | None, key: str, where: str) -> int | None:
    if not policy or policy.get(key) is None:
        return None
    return nanos(policy[key], f"{where}.{key}")


def consumed_amount(requested: int | None, cap: Mapping[str, Any], where: str) -> int:
    """calculateConsumedCapacity: what one allocation takes of one capacity."""
    value = nanos(cap.get("value"), f"{where}.value")
    policy = cap.get("requestPolicy") or None
    if requested is None:
        default = _policy_amount(policy, "default", f"{where}.requestPolicy")
        return value if default is None else default
    if policy is None:
        return requested
    valid_range = policy.get("validRange")
    if valid_range is not None and valid_range.get("min") is not None:
        minimum = nanos(valid_range["min"], f"{where}.requestPolicy.validRange.min")
        if requested < minimum:
            return minimum
        if valid_range.get("step") is None:
            return requested
        step = nanos(valid_range["step"], f"{where}.requestPolicy.validRange.step")
        return minimum + quantity.ceil_div(requested - minimum, step) * step
    if policy.get("validValues") is not None:
        for i, option in enumerate(policy["validValues"]):
            amount = nanos(option, f"{where}.requestPolicy.validValues[{i}]")
            if requested <= amount:
                return amount
    return requested


def violates_policy(amount: int, cap: Mapping[str, Any], where: str) -> bool:
    """violatesPolicy: the (rounded) amount against the capacity's request policy."""
    policy = cap.get("requestPolicy") or None
    if policy is None:
        return False
    if _policy_amount(policy, "default", f"{where}.requestPolicy") == amount:
        return False
    valid_range = policy.get("validRange")
    if valid_range is not None:
        maximum = _policy_amount(valid_range, "max", f"{where}.requestPolicy.validRange")
        if maximum is not None and amount > maximum:
            return True
        step = _policy_amount(valid_range, "step", f"{where}.requestPolicy.validRange")
        if step:
            # The scheduler compares whole units (Quantity.Value(), rounded up).
            minimum = _policy_amount(valid_range, "min", f"{where}.requestPolicy.validRange") or 0
            units = [quantity.ceil_div(x, quantity.NANO) for x in (amount, minimum, step)]
            return (units[0] - units[1]) % units[2] != 0 if units[2] else False
        return False
    options = policy.get("validValues") or []
    if options:
        return all(
            nanos(o, f"{where}.requestPolicy.validValues[{i}]") != amount for i, o in enumerate(options)
        )
    return False


def demand(
    requests: Mapping[str, Any] | None, device: Device, driver: str, where: str
) -> dict[str, int] | Shortfall:
    """What an allocation of `device` for a request consumes of each of its capacities, keyed by the
    device's capacity names; or the Shortfall of a capacity the device does not publish."""
    resolved: dict[str, int] = {}
    for name, raw in (requests or {}).items():
        key = resolve_name(name, driver, device.capacity)
        if key is None:
            return Shortfall(name, "missing")
        if key in resolved:
            raise CapacityError(
                f"{where}: capacity {key!r} is requested twice (as {name!r} and by its other name)"
            )
        resolved[key] = nanos(raw, f"{where}.capacity.requests[{name}]")
    out = {}
    for name, cap in device.capacity.items():
        cwhere = f"device {device.name} capacity[{name}]"
        amount = consumed_amount(resolved.get(name), cap, cwhere)
        if amount < 0:
            raise CapacityError(f"{cwhere}: capacity value is negative")
        out[name] = amount
    return out


def shortfall(wanted: Mapping[str, int], device: Device, *consumed: Mapping[str, int]) -> Shortfall | None:
    """cmpRequestOverCapacity's soft checks: the request policy, then the sum of what `consumed` (earlier
    allocations of the device) and `wanted` take against each capacity's value. None when it fits."""
    for name, cap in device.capacity.items():
        cwhere = f"device {device.name} capacity[{name}]"
        amount = wanted.get(name, 0)
        if violates_policy(amount, cap, cwhere):
            return Shortfall(name, "policy", amount)
        total = nanos(cap.get("value"), f"{cwhere}.value")
        used = sum(c.get(name, 0) for c in consumed)
        if used + amount > total:
            return Shortfall(name, "exhausted", amount, total - used)
    return None


def status_quantity(amount: int, cap: Mapping[str, Any]) -> str:
    """An amount as the claim's status prints it: in the binary format when the capacity uses one."""
    whole, rest = divmod(amount, quantity.NANO)
    if rest:
        return quantity.canonical(f"{amount}n")
    raw = str(cap.get("value", ""))
    if any(raw.endswith(s) for s in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")) and whole % 1024 == 0 and whole:
        return quantity.canonical(f"{whole // 1024}Ki")
    return quantity.canonical(str(whole))
