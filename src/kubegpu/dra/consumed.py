"""What one allocation result consumed of a shared device (ConsumableShares), and where kubegpu shows it.

The scheduler writes each shared allocation's `shareID` and `consumedCapacity` (KEP-5075) into the claim's
allocation results; NVIDIA's driver reads neither. kubegpu reads them at Prepare and hands them on:

- to the workload, in its CDI device's env (`env`): `KUBEGPU_SHARE_ID`, `KUBEGPU_CONSUMED_MEMORY_BYTES` and
  `KUBEGPU_DEVICE_MEMORY_BYTES` (the device's shareable memory), `KUBEGPU_CONSUMED_SHARES` and
  `KUBEGPU_DEVICE_SHARES` (integer mode). Nothing enforces them: a workload that wants to keep to its
  share reads them (e.g. PyTorch's `set_per_process_memory_fraction`);
- to the operator, in the claim's `status.devices[]` (`status_entry`, written by `dra.claim_status`);
- to an MPS client, as CUDA's per-client limits (`mps_client_limits`): the consumed memory as
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, the share as `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.common.quantity import QuantityError, value
from kubegpu.dra.consumable_shares import MEMORY, MIB, SHARES
from kubegpu.dra.devices import binary_si

if TYPE_CHECKING:
    from kubegpu.dra.claims import Result
    from kubegpu.dra.devices import DraDevice

log = logging.getLogger(__name__)

ENV_SHARE_ID = "KUBEGPU_SHARE_ID"
ENV_CONSUMED_MEMORY = "KUBEGPU_CONSUMED_MEMORY_BYTES"
ENV_DEVICE_MEMORY = "KUBEGPU_DEVICE_MEMORY_BYTES"
ENV_CONSUMED_SHARES = "KUBEGPU_CONSUMED_SHARES"
ENV_DEVICE_SHARES = "KUBEGPU_DEVICE_SHARES"


@dataclass(frozen=True, slots=True)
class Consumed:
    """One shared allocation of a device: what it consumed, and what the device has in all."""

    share_id: str
    memory: int | None = None  # bytes consumed; None when the device publishes no memory capacity
    device_memory: int | None = None  # the device's shareable memory (its published capacity), bytes
    shares: int | None = None  # integer mode: shares consumed
    device_shares: int | None = None  # integer mode: the device's shares

    def env(self) -> list[str]:
        """The workload's env (CDI `KEY=value` entries)."""
        out = [f"{ENV_SHARE_ID}={self.share_id}"]
        for key, amount in (
            (ENV_CONSUMED_MEMORY, self.memory),
            (ENV_DEVICE_MEMORY, self.device_memory),
            (ENV_CONSUMED_SHARES, self.shares),
            (ENV_DEVICE_SHARES, self.device_shares),
        ):
            if amount is not None:
                out.append(f"{key}={amount}")
        return out

    def fraction(self) -> float | None:
        """The part of the device this allocation holds: its shares of the device's, else its memory of
        the device's; None when it consumed nothing countable (unlimited mode's default of 0 memory)."""
        if self.shares is not None and self.device_shares:
            return self.shares / self.device_shares
        if self.memory and self.device_memory:
            return self.memory / self.device_memory
        return None


def amounts(consumed_capacity: Mapping[str, Any] | None) -> dict[str, int]:
    """`consumedCapacity` (Quantity texts) as integers, rounded up as `Quantity.Value()` rounds; a value
    that is no quantity is left out (logged): the API server validated it, so it is not ours."""
    out = {}
    for name, raw in (consumed_capacity or {}).items():
        try:
            out[str(name)] = value(raw)
        except (QuantityError, TypeError) as err:
            log.warning("consumedCapacity[%s] %r is not a quantity: %s", name, raw, err)
    return out


def consumed_of(
    share_id: str | None,
    consumed_capacity: Mapping[str, Any] | None,
    device_memory: int | None,
    mode: str | int | None,
) -> Consumed | None:
    """A result's share of its device (`device_memory`: the device's memory in bytes, before NVIDIA's
    rounding down to 1Mi), or None when the result holds the device whole (no shareID)."""
    if not share_id:
        return None
    got = amounts(consumed_capacity)
    total = None if device_memory is None else device_memory - device_memory % MIB
    return Consumed(
        share_id=share_id,
        memory=got.get(MEMORY),
        device_memory=total if MEMORY in got else None,
        shares=got.get(SHARES),
        device_shares=mode if isinstance(mode, int) and SHARES in got else None,
    )


def mps_client_limits(consumed: Consumed, uuid: str) -> dict[str, str]:
    """CUDA's MPS client limits that keep a client to what its allocation consumed: the consumed memory,
    in whole MiB (at least 1), pinned on `uuid`, and its part of the device as a whole percentage (1-100).
    Empty for an allocation that consumed nothing countable."""
    out = {}
    if consumed.memory:
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{uuid}={max(1, consumed.memory // MIB)}M"
    part = consumed.fraction()
    if part is not None:
        out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, max(1, int(part * 100))))
    return out


def status_entry(driver: str, pool: str, device: str, consumed: Consumed) -> dict[str, Any]:
    """The claim's `status.devices[]` entry (AllocatedDeviceStatus) for a shared allocation: the device and
    share, with what it consumed and what the device has in `data`."""
    used: dict[str, str] = {}
    total: dict[str, str] = {}
    if consumed.memory is not None:
        used[MEMORY] = binary_si(consumed.memory)
    if consumed.device_memory is not None:
        total[MEMORY] = binary_si(consumed.device_memory)
    if consumed.shares is not None:
        used[SHARES] = str(consumed.shares)
    if consumed.device_shares is not None:
        total[SHARES] = str(consumed.device_shares)
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "shareID": consumed.share_id,
        "data": {"consumedCapacity": used, "deviceCapacity": total},
    }


def consumed_by(
    results: Sequence[Result], devices: Mapping[str, DraDevice], mode: str | int | None
) -> list[tuple[Result, Consumed]]:
    """A claim's shared allocations (results with a shareID) with what each consumed; `devices` by name,
    as prepared (a DynamicMIG partition's MIG device created: its memory is the partition's)."""
    out = []
    for result in results:
        device = devices.get(result.device)
        if device is None:
            continue
        memory = device.mig.memory_bytes if device.mig else device.gpu.memory_bytes
        consumed = consumed_of(result.share_id, dict(result.consumed), memory, mode)
        if consumed is not None:
            out.append((result, consumed))
    return out


def per_device(consumed: Sequence[tuple[Result, Consumed]]) -> dict[str, Consumed]:
    """What a claim consumed of each device, by device name: a claim whose requests hold several shares of
    one device consumed their sum, and its share IDs are listed with commas."""
    out: dict[str, Consumed] = {}
    for result, share in consumed:
        before = out.get(result.device)
        if before is not None:
            share = Consumed(
                share_id=f"{before.share_id},{share.share_id}",
                memory=_sum(before.memory, share.memory),
                device_memory=share.device_memory,
                shares=_sum(before.shares, share.shares),
                device_shares=share.device_shares,
            )
        out[result.device] = share
    return out


def _sum(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b
