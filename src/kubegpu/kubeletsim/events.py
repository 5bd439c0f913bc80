"""What the simulated kubelet did, as a timestamped log that tests and benchmarks can wait on.

Every state change is one `SimEvent` with a one-line human description. The log's condition variable is
notified on each event, so `wait_for` wakes exactly when something changed instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class EventKind(enum.StrEnum):
    KUBELET_STARTED = "kubelet-started"
    KUBELET_STOPPED = "kubelet-stopped"
    REGISTRATION_REJECTED = "registration-rejected"
    REGISTERED = "registered"
    DEVICES_UPDATED = "devices-updated"  # one ListAndWatch message processed
    STREAM_ENDED = "stream-ended"  # ListAndWatch ended: the resource's devices became unhealthy
    DISCONNECTED = "disconnected"  # the kubelet stopped and dropped the plugin: devices unhealthy too
    RESOURCE_REMOVED = "resource-removed"  # endpoint stopped longer than the grace period
    NODE_STATUS = "node-status"  # node capacity/allocatable changed
    POD_ADMITTED = "pod-admitted"
    POD_REJECTED = "pod-rejected"
    CONTAINER_STARTED = "container-started"
    CONTAINER_START_FAILED = "container-start-failed"
    POD_REMOVED = "pod-removed"
    DRA_PLUGIN_REGISTERED = "dra-registered"  # a DRA driver's plugin passed the plugin watcher
    DRA_PLUGIN_REJECTED = "dra-rejected"  # registration failed (retried with back-off)
    DRA_PLUGIN_DEREGISTERED = "dra-deregistered"  # its registration socket went away
    DRA_SLICES_WIPED = "dra-slices-wiped"  # the kubelet deleted ResourceSlices (start-up, driver gone)
    CLAIMS_PREPARED = "claims-prepared"  # NodePrepareResources succeeded for a pod's claims
    PREPARE_FAILED = "prepare-failed"  # the pod cannot start: FailedPrepareDynamicResources
    CLAIMS_UNPREPARED = "claims-unprepared"
    UNPREPARE_FAILED = "unprepare-failed"
    DRA_HEALTH_UPDATED = "dra-health-updated"  # one NodeWatchResources message processed
    DRA_HEALTH_STREAM_ENDED = (
        "dra-health-stream-ended"  # the health stream ended (error: why), retried in 5 s
    )
    POD_STATUS_WRITTEN = "pod-status-written"  # the pod's containerStatuses were written to the API server


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One state change. `time` is `time.monotonic()` when it happened; `seq` orders events."""

    seq: int
    time: float
    kind: EventKind
    message: str
    resource: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": str(self.kind),
            "resource": self.resource,
            "message": self.message,
            "data": dict(self.data),
        }


EventListener = Callable[[SimEvent], None]


class EventLog:
    """Append-only event list plus a condition notified on every append."""

    def __init__(self) -> None:
        self._events: list[SimEvent] = []
        self._changed = asyncio.Condition()
        self._listeners: list[EventListener] = []
        self._notify_task: asyncio.Task[None] | None = None

    def subscribe(self, listener: EventListener) -> None:
        self._listeners.append(listener)

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest event (0 when empty): pass it as `after` to wait for newer ones."""
        return self._events[-1].seq if self._events else 0

    def events(
        self, kind: EventKind | None = None, *, resource: str | None = None, after: int = 0
    ) -> list[SimEvent]:
        return [
            e
            for e in self._events
            if e.seq > after
            and (kind is None or e.kind == kind)
            and (resource is None or e.resource == resource)
        ]

    def emit(self, kind: EventKind, message: str, resource: str | None = None, **data: Any) -> SimEvent:
        """Record an event, tell the listeners, and wake every `wait_for` on the next loop iteration.

        Synchronous so that state changes made from plain functions (timers, `remove_pod`) are events too;
        the timestamp is taken here, so a deferred wake-up does not skew measurements.
        """
        event = SimEvent(self.last_seq + 1, time.monotonic(), kind, message, resource, data)
        self._events.append(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                # A broken printer must not break the kubelet's RPC handling.
                log.exception("event listener failed on %s", event.kind)
        if self._notify_task is None:
            with contextlib.suppress(RuntimeError):  # no loop running: nobody can be waiting
                self._notify_task = asyncio.get_running_loop().create_task(self._notify())
        return event

    async def _notify(self) -> None:
        async with self._changed:
            # Cleared under the lock with no await before notify_all: an event emitted later schedules anew.
            self._notify_task = None
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Return once `predicate()` holds; it is re-checked after every event. TimeoutError otherwise."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError:
            last = self._events[-1].message if self._events else "no events"
            raise TimeoutError(f"condition not met within {timeout} s (last event: {last})") from None

    async def wait_for_event(
        self,
        kind: EventKind,
        *,
        resource: str | None = None,
        after: int = 0,
        where: Callable[[SimEvent], bool] | None = None,
        timeout: float,
    ) -> SimEvent:
        """The first event of `kind` (and `resource`, and satisfying `where`) with seq > `after`."""

        def matching() -> list[SimEvent]:
            return [e for e in self.events(kind, resource=resource, after=after) if where is None or where(e)]

        await self.wait_for(lambda: bool(matching()), timeout)
        return matching()[0]
