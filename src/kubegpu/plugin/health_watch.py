"""The NVML health thread of the GPUs served, run as a supervised task and replaced whole when a change of
what is served asks for it (reconcile.py's `MonitorStep`).

The new monitor is armed before the old one stops and before the kubelet can see new devices, so no XID
slips through a reload. The thread records faults in the daemon's `FaultBook` and sets `changed`, which
wakes the task that serves the book's changes (daemon.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from kubegpu.node.faults import FaultBook
from kubegpu.node.health import HealthEvent, HealthMonitor, HealthSettings
from kubegpu.node.inventory import Inventory
from kubegpu.plugin.events import DaemonEvents
from kubegpu.plugin.reconcile import MonitorStep, Plan
from kubegpu.plugin.supervise import Supervisor

MONITOR_TASK = "nvml-health"


class HealthWatch:
    def __init__(
        self,
        nvml: Callable[[], Any],
        settings: HealthSettings,
        faults: FaultBook,
        observer: DaemonEvents,
        supervisor: Supervisor,
    ) -> None:
        self._nvml = nvml
        self.settings = settings
        self._faults = faults
        self._observer = observer
        self._supervisor = supervisor
        self.changed = asyncio.Event()  # set by the health thread when the fault book changed
        self.watched: frozenset[str] | None = None  # the GPUs the running monitor watches
        self._task: asyncio.Task[None] | None = None

    @property
    def checks_enabled(self) -> bool:
        return self.settings.classifier.policy.checks_enabled

    async def apply(self, applied: Plan, inventory: Inventory) -> None:
        """Start a monitor for the plan's GPUs (armed before it returns), then stop the old one."""
        if not self.checks_enabled or applied.monitor is MonitorStep.KEEP:
            return
        old, self._task = self._task, None
        self.watched = None
        if applied.monitor is MonitorStep.WATCH:
            armed = asyncio.Event()
            self._task = self._supervisor.start(MONITOR_TASK, functools.partial(self._run, inventory, armed))
            await armed.wait()
            self.watched = applied.gpus
        if old is not None:
            old.cancel()
            await asyncio.wait([old])

    async def _run(self, inventory: Inventory, armed: asyncio.Event) -> None:
        """The health thread as a supervised task: ends when cancelled, raises when the thread died."""
        loop = asyncio.get_running_loop()

        def emit(events: Sequence[HealthEvent]) -> None:
            if events:
                with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                    loop.call_soon_threadsafe(self.changed.set)

        monitor = HealthMonitor(
            self._nvml(), inventory, self.settings, emit, faults=self._faults, observer=self._observer
        )
        try:
            await asyncio.to_thread(monitor.start)
            armed.set()
            await asyncio.wrap_future(monitor.finished)
            raise RuntimeError("the NVML health thread ended without being stopped")
        finally:
            armed.set()
            await asyncio.to_thread(monitor.stop)
