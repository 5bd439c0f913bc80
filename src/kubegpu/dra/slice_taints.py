"""Whether the API server keeps device taints, and so which devices the publisher may send.

A server without DRADeviceTaints (the gate off, or a 1.32 server, which has no taints field) drops a
device's taints on write and would show a broken GPU as healthy: there a tainted device is left out of the
slice instead. Whether taints are kept is learnt once (a dry-run create, by the publisher) and again when a
write comes back without the taints it sent (a downgrade, the gate turned off).
"""

from __future__ import annotations

import logging

from kubegpu.dra import slices
from kubegpu.dra.slices import Device

log = logging.getLogger("kubegpu.dra.publisher")


class TaintSupport:
    def __init__(self) -> None:
        self.served: bool | None = None  # None: not known yet
        self._left_out: tuple[str, ...] = ()

    def must_probe(self, devices: list[Device]) -> bool:
        return self.served is None and any(d.get("taints") for d in devices)

    def publishable(self, devices: list[Device]) -> list[Device]:
        """The devices this server can take: tainted ones only when it keeps taints."""
        if self.served is not False:
            return devices
        kept, left_out = slices.without_taints(devices)
        if tuple(left_out) != self._left_out:
            self._left_out = tuple(left_out)
            if left_out:
                log.info("left out of the ResourceSlices while tainted: %s", ", ".join(left_out))
        return kept

    def written(self, sent: list[Device], got: list[Device]) -> None:
        """A write came back: a server that dropped the taints we sent no longer keeps them; the next pass
        sees the slice differ from what it wants and writes it again without the tainted devices."""
        if self.served is not False and slices.dropped_taints(sent, got):
            self.dropped()

    def dropped(self) -> None:
        self.served = False
        log.warning(
            "the API server drops device taints (feature gate DRADeviceTaints is off): unhealthy devices are "
            "left out of the ResourceSlices instead of being tainted; enable the gate on the API server and "
            "scheduler to keep them listed with their taint"
        )
