"""The NVML health watcher: a thread that turns NVML events and probes into health updates.

The NVML event wait blocks, so it runs in its own thread and hands `HealthEvent`s to a callback (the daemon
passes one that hops onto the asyncio loop). NVIDIA's rules decide what is acted on: Xid critical errors
count unless the XID is ignored; ECC events are logged only; a failed wait marks every GPU unhealthy.

Beyond NVIDIA:
- between events, a cheap probe catches a GPU that fell off the bus without an event;
- what an XID calls for comes from the XID catalog (`xids.py`): application faults leave the GPU Healthy,
  reboot-class faults stay Unhealthy, and reset-class faults recover: once no critical XID has arrived for
  the quiet period, recovery probes run every probe interval (handle and memory info readable, no pending
  page retirement or row remap) and the GPU is reported Healthy again when they pass. Recovery can be
  switched off (KUBEGPU_HEALTH_RECOVERY=false) for NVIDIA's sticky behaviour.
The settings come typed from `kubegpu.settings.env.DaemonEnv`, validated when the daemon starts.
Every transition is logged once, with the XID, its meaning and the action.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.node.inventory import Health, Inventory
from kubegpu.node.nvml.pci import device_handle_id
from kubegpu.node.xids import XidAction, XidClassifier, XidPolicy, load_catalog, xid_classifier
from kubegpu.settings.env import DaemonEnv

log = logging.getLogger(__name__)

ALL_GPUS = None


def event_wait_backoff() -> Backoff:
    """After a failed NVML event wait: 100 ms doubling to 5 s, so a persistently failing wait does not spin.
    No jitter: the thread retries a local call, with no peer to stampede."""
    return Backoff(initial=0.1, maximum=5.0)


@dataclass(frozen=True, slots=True)
class HealthSettings:
    classifier: XidClassifier = field(default_factory=lambda: XidClassifier(XidPolicy(), load_catalog()))
    recovery: bool = True
    quiet_period_s: float = 60.0  # no critical XID for this long before recovery probes may pass
    probe_interval_s: float = 5.0
    wait_ms: int = 500  # NVML event wait slice; bounds how long stop() takes

    @classmethod
    def from_settings(cls, env: DaemonEnv) -> HealthSettings:
        """The daemon's health settings. Raises XidCatalogError when KUBEGPU_XID_ACTIONS's file is bad."""
        return cls(
            classifier=xid_classifier(env),
            recovery=env.health_recovery,
            quiet_period_s=env.recovery_quiet_s,
            probe_interval_s=env.health_probe_s,
        )


@dataclass(frozen=True, slots=True)
class HealthEvent:
    gpu_uuid: str | None  # None: every GPU (e.g. the event wait itself failed)
    health: Health


@dataclass(slots=True)
class Fault:
    """Why a GPU is unhealthy, and when the last critical event for it arrived (time.monotonic())."""

    action: XidAction
    reason: str
    xid: int | None
    last_at: float


class HealthMonitor:
    def __init__(
        self,
        nvml: Any,
        inventory: Inventory,
        settings: HealthSettings,
        emit: Callable[[Sequence[HealthEvent]], None],
        *,
        faults: Mapping[str, Fault] | None = None,
        on_xid: Callable[[int, str | None], None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._settings = settings
        self._classifier = settings.classifier
        self._emit = emit
        self._on_xid = on_xid  # every XID, acted on or not (metrics); called from this thread
        self._stop = threading.Event()
        self._armed = threading.Event()  # set once every GPU is registered for events (or given up on)
        self._thread: threading.Thread | None = None
        self._handles: dict[str, Any] = {}
        self._uuid_by_handle: dict[int, str] = {}
        self._index = {g.uuid: g.index for g in inventory.gpus}
        # Faults carried over from an earlier monitor (reload) keep their GPUs out until they recover.
        self.faults: dict[str, Fault] = {u: f for u, f in (faults or {}).items() if u in self._index}

    def start(self, arm_timeout_s: float = 10.0) -> None:
        """Start watching; returns once events are armed, so no XID after this call can be missed."""
        if not self._classifier.policy.checks_enabled:
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

    # --- thread body ---------------------------------------------------------------------------------

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error("cannot create NVML event set (%s); continuing with health checks disabled", err)
            self._armed.set()
            return
        try:
            events = [e for gpu in self._inventory.gpus if (e := self._register(event_set, gpu.uuid))]
            events += [HealthEvent(u, self.health_of(f)) for u, f in self.faults.items()]
            self._emit(events)
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
            return self._fault(uuid, XidAction.RESET_GPU, f"health events unavailable: {err}", None)
        return None

    def _loop(self, event_set: Any) -> None:
        nvml = self._nvml
        next_probe = time.monotonic() + self._settings.probe_interval_s
        backoff = event_wait_backoff()
        while not self._stop.is_set():
            if time.monotonic() >= next_probe:
                self._emit(self._probe())
                next_probe = time.monotonic() + self._settings.probe_interval_s
            try:
                # Wake in time for the next probe, so recovery is never later than one probe interval.
                until_probe_ms = int(max(0.0, next_probe - time.monotonic()) * 1000) + 1
                data = nvml.nvmlEventSetWait_v2(event_set, min(self._settings.wait_ms, until_probe_ms))
            except nvml.NVMLError_Timeout:
                backoff.reset()
                continue
            except nvml.NVMLError as err:
                log.error("waiting for NVML events failed (%s); marking all GPUs unhealthy", err)
                reason = f"NVML event wait failed: {err}"
                self._emit(
                    [e for u in self._index if (e := self._fault(u, XidAction.RESET_GPU, reason, None))]
                )
                self._stop.wait(backoff.next_delay())
                continue
            backoff.reset()
            event = self._interpret(data)
            if event is not None:
                self._emit([event])

    # --- events --------------------------------------------------------------------------------------

    def _interpret(self, data: Any) -> HealthEvent | None:
        nvml = self._nvml
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            log.info("ignoring ECC event type %#x on a GPU (NVIDIA acts on XIDs only)", data.eventType)
            return None
        xid = int(data.eventData)
        described = self._classifier.describe(xid)
        uuid = self._uuid_by_handle.get(device_handle_id(data.device))
        if uuid is None:
            try:
                uuid = nvml.nvmlDeviceGetUUID(data.device)
            except nvml.NVMLError as err:
                if self._on_xid is not None:
                    self._on_xid(xid, None)
                log.error("%s on a GPU we cannot identify (%s); marking all GPUs unhealthy", described, err)
                for u in self._index:
                    self._fault(u, XidAction.RESET_GPU, f"{described} on an unidentified GPU", xid)
                return HealthEvent(ALL_GPUS, Health.failed(f"{described} on an unidentified GPU", xid))
        if self._on_xid is not None:
            self._on_xid(xid, uuid)
        if uuid not in self._index:
            log.info("ignoring %s on GPU %s, which this plugin does not manage", described, uuid)
            return None
        action = self._classifier.action(xid)
        if not action.marks_unhealthy:
            log.info("%s on GPU %s: %s (%s)", described, self._name(uuid), action.value, action.advice)
            return None
        return self._fault(uuid, action, described, xid)

    def _fault(self, uuid: str, action: XidAction, reason: str, xid: int | None) -> HealthEvent | None:
        """Record a fault; returns the event to send when this is a transition (or a worse action)."""
        now = time.monotonic()
        known = self.faults.get(uuid)
        if known is not None:
            known.last_at = now  # a new critical event restarts the quiet period
            if action is XidAction.REBOOT_NODE and known.action is not XidAction.REBOOT_NODE:
                known.action, known.reason, known.xid = action, reason, xid
                log.warning("GPU %s: %s; action now: %s", self._name(uuid), reason, action.advice)
                return HealthEvent(uuid, self.health_of(known))
            log.debug("GPU %s: %s while already unhealthy", self._name(uuid), reason)
            return None
        fault = Fault(action, reason, xid, now)
        self.faults[uuid] = fault
        if action.recoverable and self._settings.recovery:
            after = f"recovery probes run after {self._settings.quiet_period_s:g} s without critical XIDs"
        else:
            after = "stays Unhealthy until the plugin restarts"
        log.warning(
            "GPU %s Healthy -> Unhealthy: %s; action: %s; %s", self._name(uuid), reason, action.advice, after
        )
        return HealthEvent(uuid, self.health_of(fault))

    @staticmethod
    def health_of(fault: Fault) -> Health:
        return Health.failed(f"{fault.reason}; action: {fault.action.value}", fault.xid)

    def _name(self, uuid: str) -> str:
        return f"{self._index.get(uuid, '?')} ({uuid})"

    # --- probes --------------------------------------------------------------------------------------

    def _probe(self) -> list[HealthEvent]:
        """Lost GPUs (NVML calls fail with GPU_IS_LOST even without an event), then recovery checks."""
        nvml, events = self._nvml, []
        for uuid, handle in self._handles.items():
            if uuid in self.faults:
                continue
            try:
                nvml.nvmlDeviceGetUUID(handle)
            except nvml.NVMLError_GpuIsLost:
                event = self._fault(
                    uuid, XidAction.RESET_GPU, "GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST)", 79
                )
                if event is not None:
                    events.append(event)
            except nvml.NVMLError as err:
                log.debug("probe of GPU %s failed: %s", uuid, err)
        if self._settings.recovery:
            events.extend(self._recover())
        return events

    def _recover(self) -> list[HealthEvent]:
        now, events = time.monotonic(), []
        for uuid, fault in list(self.faults.items()):
            if not fault.action.recoverable or now - fault.last_at < self._settings.quiet_period_s:
                continue
            problem = self._recovery_problem(uuid)
            if problem is not None:
                log.debug("GPU %s not recovered yet: %s", self._name(uuid), problem)
                continue
            del self.faults[uuid]
            log.warning(
                "GPU %s Unhealthy -> Healthy: recovery probes passed after %s (handle and memory readable, "
                "no pending page retirement or row remap, %g s without critical XIDs)",
                self._name(uuid),
                fault.reason,
                self._settings.quiet_period_s,
            )
            events.append(HealthEvent(uuid, Health.ok()))
        return events

    def _recovery_problem(self, uuid: str) -> str | None:
        """None when the GPU looks usable again; otherwise what is still wrong."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as err:
            return f"not readable ({err})"
        self._handles[uuid] = handle
        self._uuid_by_handle[device_handle_id(handle)] = uuid
        try:
            if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == nvml.NVML_FEATURE_ENABLED:
                return "page retirement pending (needs a GPU reset)"
        except nvml.NVMLError as err:
            log.debug("page retirement status of %s unavailable: %s", uuid, err)
        try:
            _, _, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
            if pending or failure:
                return "row remapping pending or failed (needs a GPU reset)"
        except nvml.NVMLError as err:
            log.debug("row remapping status of %s unavailable: %s", uuid, err)
        return None
