"""What allocated claims hold (the scheduler's AllocatedState): devices held whole, and shares of devices
that allow multiple allocations with the capacity each share consumed.

A result with a `shareID` is a share: the device stays open to further shares while its capacity lasts.
A result without one holds the device whole. Admin access holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubegpu.common import quantity

from .model import DeviceID, ModelError, ResourceClaim


@dataclass(frozen=True, slots=True)
class Share:
    claim: str  # namespace/name
    share_id: str
    consumed: Mapping[str, int]  # capacity name -> nano-units


@dataclass(slots=True)
class Holdings:
    exclusive: dict[DeviceID, str] = field(default_factory=dict)  # device -> the claim holding it
    shares: dict[DeviceID, list[Share]] = field(default_factory=dict)

    @classmethod
    def of_devices(cls, devices: Iterable[DeviceID], holder: str = "") -> Holdings:
        return cls({d: holder for d in devices})

    @classmethod
    def of_claims(cls, claims: Iterable[ResourceClaim]) -> Holdings:
        held = cls()
        for claim in claims:
            for result in claim.allocated_results():
                if result.admin_access:
                    continue
                if result.share_id:
                    consumed = {
                        name: _nanos(q, f"claim {claim.ref}: consumedCapacity[{name}]")
                        for name, q in result.consumed_capacity.items()
                    }
                    held.shares.setdefault(result.device, []).append(
                        Share(claim.ref, result.share_id, consumed)
                    )
                else:
                    held.exclusive[result.device] = claim.ref
        return held

    def merged(self, other: Holdings) -> Holdings:
        shares = {d: list(s) for d, s in self.shares.items()}
        for device, more in other.shares.items():
            shares.setdefault(device, []).extend(more)
        return Holdings({**self.exclusive, **other.exclusive}, shares)

    def is_allocated(self, device: DeviceID) -> bool:
        """IsDeviceAllocated: held whole or shared (either consumes the device's counters)."""
        return device in self.exclusive or device in self.shares

    def consumed(self, device: DeviceID) -> dict[str, int] | None:
        """The capacity the device's shares consume together, None when it has none."""
        shares = self.shares.get(device)
        if not shares:
            return None
        total: dict[str, int] = {}
        for share in shares:
            for name, amount in share.consumed.items():
                total[name] = total.get(name, 0) + amount
        return total

    def holders(self, device: DeviceID) -> list[str]:
        """The claims holding the device, whole or by a share."""
        if device in self.exclusive:
            return [self.exclusive[device]]
        return sorted({s.claim for s in self.shares.get(device, ())})

    def __len__(self) -> int:
        return len(self.exclusive) + sum(len(s) for s in self.shares.values())


def _nanos(raw: Any, where: str) -> int:
    try:
        return quantity.parse_nanos(raw)
    except quantity.QuantityError as err:
        raise ModelError(f"{where}: {err}") from None
