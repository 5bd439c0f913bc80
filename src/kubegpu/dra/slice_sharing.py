"""Whether the API server keeps ConsumableShares' fields, and so what the publisher may send.

A server without DRAConsumableCapacity (the gate off, or a release before 1.34) drops a device's
`allowMultipleAllocations` and its capacities' `requestPolicy` on write. Sent again and again, they would
make every write look like someone else's edit and the pool be rewritten every few seconds: once a write
comes back without them, they are left out of what is published (the devices are then allocated whole,
one claim each) and a warning says why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kubegpu.dra.slices import Device

log = logging.getLogger("kubegpu.dra.publisher")

ALLOW_MULTIPLE = "allowMultipleAllocations"


class SharingSupport:
    def __init__(self) -> None:
        self.served: bool | None = None  # None: not known yet (no write has come back with shared devices)

    def publishable(self, devices: list[Device]) -> list[Device]:
        """The devices as this server keeps them: without the sharing fields when it drops them."""
        if self.served is not False:
            return devices
        return [_unshared(d) if d.get(ALLOW_MULTIPLE) else d for d in devices]

    def written(self, sent: Sequence[Device], got: Sequence[Device]) -> None:
        """A write came back: a server that dropped `allowMultipleAllocations` does not keep them."""
        shared = {d.get("name") for d in sent if d.get(ALLOW_MULTIPLE)}
        if not shared or self.served is False:
            return
        kept = all(d.get(ALLOW_MULTIPLE) for d in got if d.get("name") in shared)
        if kept:
            self.served = True
            return
        self.served = False
        log.warning(
            "the API server drops allowMultipleAllocations and request policies (feature gate "
            "DRAConsumableCapacity is off): devices are published for one claim each; enable the gate on the "
            "API server and scheduler (Kubernetes 1.34+) for --consumable-shares to take effect"
        )


def _unshared(device: Device) -> Device:
    out = {k: v for k, v in device.items() if k != ALLOW_MULTIPLE}
    capacity = device.get("capacity")
    if isinstance(capacity, dict):
        out["capacity"] = {
            name: {k: v for k, v in c.items() if k != "requestPolicy"} if isinstance(c, dict) else c
            for name, c in capacity.items()
        }
    return out
