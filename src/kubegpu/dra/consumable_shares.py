"""ConsumableShares: devices published for several claims at once, as NVIDIA's DRA driver publishes them.

On when the `ConsumableShares` gate is on and `--consumable-shares` is not `disabled`. Every published
device (full GPU, static MIG device, DynamicMIG partition) then gets `allowMultipleAllocations: true`, and
a device with a `memory` capacity has it rounded down to a whole MiB with NVIDIA's request policy:

- `unlimited`: `memory.requestPolicy` default 0, validRange {min 0, max <memory>, step 1Mi};
- `memory`: default <memory> (the whole device), validRange {min 1Mi, max <memory>, step 1Mi};
- an integer N: as `unlimited`, plus a `shares` capacity of N with default 1, validRange {min 1, max N,
  step 1}.

The scheduler (KEP-5075) does the accounting and writes each allocation's `shareID` and `consumedCapacity`;
the driver's rules for claims that share a device are in `dra.prepare`. Capacities without a request policy
(a MIG device's engines, `memorySlice<i>`) are consumed whole by every allocation, as the scheduler counts
them: NVIDIA's shape lets a MIG device take one claim at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.common.quantity import value
from kubegpu.common.quoting import plain_id
from kubegpu.dra.devices import binary_si
from kubegpu.dra.slices import is_counters
from kubegpu.settings.dra_driver import DISABLED, DriverFlags

MIB = 1024 * 1024
MPS_WITH_SHARES = "MPS sharing is not supported when consumable shares is enabled"  # NVIDIA's refusal
MEMORY = "memory"
SHARES = "shares"


def shares_mode(driver: DriverFlags) -> str | int | None:
    """The mode in effect ("memory", "unlimited" or the number of shares), or None when devices are not
    shared: the one place that asks the gate and the flag."""
    if not driver.gates["ConsumableShares"] or driver.consumable_shares == DISABLED:
        return None
    return driver.consumable_shares


def memory_policy(memory: int, mode: str | int) -> dict[str, Any]:
    """NVIDIA's `memory` capacity for a device of `memory` bytes: the value rounded down to 1Mi, and its
    request policy in `mode`."""
    whole = memory - memory % MIB
    every_byte = mode == MEMORY
    lowest = MIB if every_byte else 0
    return {
        "value": binary_si(whole),
        "requestPolicy": {"default": binary_si(whole if every_byte else 0),
                          "validRange": _valid_range(lowest, whole, MIB, binary_si)},
    }  # fmt: skip


def shares_capacity(count: int) -> dict[str, Any]:
    """The `shares` capacity of integer mode: `count` shares, one by default."""
    policy = {"default": "1", "validRange": _valid_range(1, count, 1, str)}
    return {"value": str(count), "requestPolicy": policy}


def _valid_range(lowest: int, highest: int, step: int, text: Callable[[int], str]) -> dict[str, str]:
    """NVIDIA's validRange, without `step` when only one value is valid: the API server refuses a step that
    goes past the capacity (`one step 2 is larger than capacity value: 1`), which NVIDIA's shape does for
    `--consumable-shares 1` (and a device of 1Mi in memory mode)."""
    out = {"min": text(lowest), "max": text(highest)}
    if lowest + step <= highest:
        out["step"] = text(step)
    return out


def shared_entry(device: Mapping[str, Any], mode: str | int) -> dict[str, Any]:
    """A v1 `Device` as NVIDIA publishes it in `mode` (a new dict; the input is not changed)."""
    out = {**device, "allowMultipleAllocations": True}
    capacity = dict(device.get("capacity") or {})
    if MEMORY in capacity:
        capacity[MEMORY] = memory_policy(_bytes(capacity[MEMORY]), mode)
        if isinstance(mode, int):
            capacity[SHARES] = shares_capacity(mode)
    if capacity:
        out["capacity"] = capacity
    return out


def shared_entries(entries: Sequence[Mapping[str, Any]], mode: str | int | None) -> list[dict[str, Any]]:
    """The slice entries (devices and counters entries) with every device shared in `mode`; unchanged
    when `mode` is None."""
    if mode is None:
        return [dict(e) for e in entries]
    return [dict(e) if is_counters(e) else shared_entry(e, mode) for e in entries]


def _bytes(capacity: Mapping[str, Any]) -> int:
    return value(capacity["value"])


def conflict(uid: str, device: str, other_uid: str) -> str:
    """NVIDIA's refusal of a claim whose config for a shared device differs from a prepared claim's."""
    return (
        f"unable to prepare claim {plain_id(uid)}: requested device {device} has conflicting configuration "
        f"with already prepared claim {plain_id(other_uid)}"
    )
