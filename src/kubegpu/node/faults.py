"""Every GPU fault the plugin knows, in one place that outlives the health monitors, servers and reloads.

A fault is recorded when a critical XID arrives, a GPU falls off the bus, its health events cannot be
registered, or a rediscovery no longer finds it; it is cleared only by its own recovery (the recovery probes
pass). The daemon owns one `FaultBook` for its whole life and hands it to every health monitor it starts,
so nothing in between (a reload, a config switch, a restarted server or health thread) can make a broken
GPU look healthy. The health thread writes, the event loop reads: every method takes the lock.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from kubegpu.node.inventory import Health
from kubegpu.node.xids import XidAction


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a GPU is unhealthy, and when the last critical event for it arrived (on the monitor's clock)."""

    action: XidAction
    reason: str
    xid: int | None
    last_at: float

    @property
    def health(self) -> Health:
        return Health.failed(f"{self.reason}; action: {self.action.value}", self.xid)


class Recorded(enum.Enum):
    """What `FaultBook.record` did."""

    NEW = "new"  # the GPU was healthy: a transition the kubelet must see
    WORSE = "worse"  # it was unhealthy and now calls for a reboot: the reason the kubelet sees changes
    REPEATED = "repeated"  # already unhealthy for as much: only the quiet period starts over


class FaultBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}

    def record(
        self, uuid: str, action: XidAction, reason: str, xid: int | None, now: float
    ) -> tuple[Recorded, Fault]:
        """Note a critical event for the GPU; a reboot-class event overrides a reset-class one. Returns what
        changed and the GPU's fault now."""
        with self._lock:
            known = self._faults.get(uuid)
            if known is None:
                recorded, fault = Recorded.NEW, Fault(action, reason, xid, now)
            elif action is XidAction.REBOOT_NODE and known.action is not XidAction.REBOOT_NODE:
                recorded, fault = Recorded.WORSE, Fault(action, reason, xid, now)
            else:
                recorded, fault = Recorded.REPEATED, Fault(known.action, known.reason, known.xid, now)
            self._faults[uuid] = fault
            return recorded, fault

    def clear(self, uuid: str, seen: Fault) -> bool:
        """The GPU recovered: forget its fault, unless a new critical event arrived since `seen` was read."""
        with self._lock:
            if self._faults.get(uuid) != seen:
                return False
            del self._faults[uuid]
            return True

    def get(self, uuid: str) -> Fault | None:
        with self._lock:
            return self._faults.get(uuid)

    def __contains__(self, uuid: object) -> bool:
        with self._lock:
            return uuid in self._faults

    def snapshot(self) -> dict[str, Fault]:
        with self._lock:
            return dict(self._faults)

    def health(self, uuids: Iterable[str] | None = None) -> dict[str, Health]:
        """The health each faulty GPU must be served with (only those among `uuids`, when given)."""
        faults = self.snapshot()
        wanted = faults.keys() if uuids is None else set(uuids) & faults.keys()
        return {uuid: faults[uuid].health for uuid in wanted}
