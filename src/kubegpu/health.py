"""The NVML health watcher: a thread that turns NVML events into health updates for the event loop.

The NVML event wait blocks, so it runs in its own thread and hands `HealthEvent`s to a callback (the daemon
passes one that hops onto the asyncio loop). It only reports; the daemon decides what a report does to the
snapshot. NVIDIA's rules: Xid critical errors count unless the XID is ignored; ECC events are logged only;
a failed wait marks every GPU unhealthy. Beyond NVIDIA: between events we probe each GPU cheaply so a GPU
that fell off the bus without an event is still caught.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.inventory import Health, Inventory
from kubegpu.nvml import device_handle_id
from kubegpu.xids import XidPolicy, describe_xid

log = logging.getLogger(__name__)

ALL_GPUS = None
WHOLE_GPU = 0xFFFFFFFF  # GI/CI ids NVML reports for an event that concerns the whole GPU


@dataclass(frozen=True, slots=True)
class HealthEvent:
    gpu_uuid: str | None  # None: every GPU (e.g. the event wait itself failed)
    health: Health


class HealthMonitor:
    def __init__(
        self,
        nvml: Any,
        inventory: Inventory,
        policy: XidPolicy,
        emit: Callable[[Sequence[HealthEvent]], None],
        *,
        wait_ms: int = 500,
        probe_interval_s: float = 5.0,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._policy = policy
        self._emit = emit
        self._wait_ms = wait_ms
        self._probe_interval_s = probe_interval_s
        self._stop = threading.Event()
        self._armed = threading.Event()  # set once every GPU is registered for events (or given up on)
        self._thread: threading.Thread | None = None
        self._handles: dict[str, Any] = {}
        self._uuid_by_handle: dict[int, str] = {}
        self._lost: set[str] = set()

    def start(self, arm_timeout_s: float = 10.0) -> None:
        """Start watching; returns once events are armed, so no XID after this call can be missed."""
        if not self._policy.checks_enabled:
            log.info("health checks disabled by DP_DISABLE_HEALTHCHECKS; GPUs stay Healthy")
            return
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()
        if not self._armed.wait(arm_timeout_s):
            log.warning("NVML event registration is taking over %.0f s; serving anyway", arm_timeout_s)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error("cannot create NVML event set (%s); continuing with health checks disabled", err)
            self._armed.set()
            return
        try:
            self._emit([e for gpu in self._inventory.gpus if (e := self._register(event_set, gpu.uuid))])
            self._armed.set()
            self._loop(event_set)
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as err:
                log.debug("freeing NVML event set failed: %s", err)

    def _register(self, event_set: Any, uuid: str) -> HealthEvent | None:
        """Register for events on one GPU; a GPU we cannot watch is reported unhealthy (NVIDIA does too)."""
        nvml = self._nvml
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[uuid] = handle
            self._uuid_by_handle[device_handle_id(handle)] = uuid
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, event_set)
        except nvml.NVMLError_NotSupported:
            log.warning("GPU %s is too old to support health checking; it stays Healthy", uuid)
        except nvml.NVMLError as err:
            log.error("cannot watch GPU %s for health events (%s); marking it unhealthy", uuid, err)
            return HealthEvent(uuid, Health.failed(f"health events unavailable: {err}"))
        return None

    def _loop(self, event_set: Any) -> None:
        nvml = self._nvml
        next_probe = time.monotonic() + self._probe_interval_s
        failures = 0
        while not self._stop.is_set():
            if time.monotonic() >= next_probe:
                self._emit(self._probe())
                next_probe = time.monotonic() + self._probe_interval_s
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
            except nvml.NVMLError_Timeout:
                failures = 0
                continue
            except nvml.NVMLError as err:
                failures += 1
                log.error("waiting for NVML events failed (%s); marking all GPUs unhealthy", err)
                self._emit([HealthEvent(ALL_GPUS, Health.failed(f"NVML event wait failed: {err}"))])
                # Back off so a persistently failing wait does not spin.
                self._stop.wait(min(0.05 * 2**failures, 5.0))
                continue
            failures = 0
            event = self._interpret(data)
            if event is not None:
                self._emit([event])

    def _interpret(self, data: Any) -> HealthEvent | None:
        nvml = self._nvml
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            log.info("ignoring ECC event type %#x on a GPU (NVIDIA acts on XIDs only)", data.eventType)
            return None
        xid = int(data.eventData)
        uuid = self._uuid_by_handle.get(device_handle_id(data.device))
        if uuid is None:
            try:
                uuid = nvml.nvmlDeviceGetUUID(data.device)
            except nvml.NVMLError as err:
                log.error("%s on a GPU we cannot identify (%s); marking all GPUs unhealthy", xid, err)
                return HealthEvent(
                    ALL_GPUS, Health.failed(f"{describe_xid(xid)} on an unidentified GPU", xid)
                )
        if uuid not in self._handles:
            log.info("ignoring %s on GPU %s, which this plugin does not manage", describe_xid(xid), uuid)
            return None
        if not self._policy.is_critical(xid):
            log.info("ignoring %s on GPU %s (application-level or disabled XID)", describe_xid(xid), uuid)
            return None
        log.warning("%s on GPU %s: marking it unhealthy", describe_xid(xid), uuid)
        return HealthEvent(uuid, Health.failed(describe_xid(xid), xid))

    def _probe(self) -> list[HealthEvent]:
        """Catch GPUs that fell off the bus without an event: NVML calls on them fail with GPU_IS_LOST."""
        nvml, events = self._nvml, []
        for uuid, handle in self._handles.items():
            try:
                nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError_GpuIsLost:
                if uuid not in self._lost:
                    self._lost.add(uuid)
                    log.warning("GPU %s has fallen off the bus (NVML_ERROR_GPU_IS_LOST): unhealthy", uuid)
                    events.append(HealthEvent(uuid, Health.failed("GPU has fallen off the bus", 79)))
            except nvml.NVMLError as err:
                log.debug("probe of GPU %s failed: %s", uuid, err)
        return events
