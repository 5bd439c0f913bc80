"""The NVML health watcher: a thread that turns NVML events and probes into GPU faults.

The NVML event wait blocks, so it runs in its own thread. What it finds goes into the daemon's `FaultBook`
(faults.py), which outlives every monitor; each change is also handed to `emit` as `HealthEvent`s (the daemon
passes a callback that wakes the event loop). NVIDIA's rules decide what is acted on: Xid critical errors
count unless the XID is ignored; ECC events are counted only; a failed wait marks every GPU unhealthy.

Beyond NVIDIA:
- between events, a cheap probe catches a GPU that fell off the bus without an event;
- what an XID calls for comes from the XID catalog (`xids.py`): application faults leave the GPU Healthy,
  reboot-class faults stay Unhealthy, and reset-class faults recover: once no critical XID has arrived for
  the quiet period, recovery probes run every probe interval (handle and memory info readable, no pending
  page retirement or row remap, health events registered again) and the GPU is reported Healthy again
  when they pass. Recovery can be switched off (KUBEGPU_HEALTH_RECOVERY=false) for NVIDIA's sticky
  behaviour.
- events that are not acted on (ignored XIDs, ECC events) are counted by the observer and logged the first
  time and then at most once a minute, so an XID storm cannot flood the log.
The settings come typed from `kubegpu.settings.env.DaemonEnv`, validated when the daemon starts. Every
transition is logged once, naming the GPU by index and UUID, with the XID, its meaning and the action.

The work is in steps the thread calls in turn and tests call directly on an injected clock: `arm()`
(register for events), `poll()` (wait for one event and act on it), `probe()` (lost GPUs and recovery).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubegpu.common.backoff import Backoff
from kubegpu.node.faults import FaultBook, Recorded
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


class HealthObserver(Protocol):
    """What the monitor reports besides faults (PluginMetrics implements it); called from its thread."""

    def xid(self, code: int, gpu_uuid: str | None) -> None:
        """Every XID event, acted on or not; `gpu_uuid` None when NVML cannot say which GPU."""
        ...

    def xid_ignored(self, code: int) -> None:
        """An XID that is not acted on (application fault, ignored by policy, or not one of our GPUs)."""
        ...

    def ecc_event(self, kind: str) -> None:
        """An ECC event ("single_bit" or "double_bit"); NVIDIA acts on XIDs only."""
        ...


REPEAT_LOG_INTERVAL_S = 60.0


@dataclass(slots=True)
class _Repeats:
    logged_at: float
    count: int = 0  # since logged_at
    last_message: str = ""


class RepeatLog:
    """Logs the first event of each kind at once, and repeats of it at most once per interval, as a count.

    An XID storm (thousands of application XIDs a second) must not flood the log: every event is counted
    in a metric anyway, the log says what happened and how often.
    """

    def __init__(self, clock: Callable[[], float], interval_s: float = REPEAT_LOG_INTERVAL_S) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self._kinds: dict[Hashable, _Repeats] = {}

    def note(self, kind: Hashable, message: str, counted_in: str) -> None:
        now = self._clock()
        repeats = self._kinds.get(kind)
        if repeats is None:
            self._kinds[kind] = _Repeats(logged_at=now)
            log.info(
                "%s; repeats are counted in %s and logged at most every %g s",
                message,
                counted_in,
                self.interval_s,
            )
            return
        repeats.count += 1
        repeats.last_message = message
        self._summarize(repeats, now)

    def flush(self) -> None:
        """Log the pending counts whose interval has passed (called between events, so a storm's tail
        is reported even when no further event arrives)."""
        now = self._clock()
        for repeats in self._kinds.values():
            self._summarize(repeats, now)

    def _summarize(self, repeats: _Repeats, now: float) -> None:
        if repeats.count and now - repeats.logged_at >= self.interval_s:
            log.info(
                "%s; %d more like it in the last %.0f s",
                repeats.last_message,
                repeats.count,
                now - repeats.logged_at,
            )
            repeats.count = 0
            repeats.logged_at = now


class HealthMonitor:
    def __init__(
        self,
        nvml: Any,
        inventory: Inventory,
        settings: HealthSettings,
        emit: Callable[[Sequence[HealthEvent]], None],
        *,
        faults: FaultBook | None = None,
        observer: HealthObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._settings = settings
        self._classifier = settings.classifier
        self._emit = emit
        self._observer = observer
        self._clock = clock
        self._repeats = RepeatLog(clock)
        # Shared with the monitors before and after this one: a fault ends only when its GPU recovers.
        self.faults = faults if faults is not None else FaultBook()
        self._stop = threading.Event()
        self._armed = threading.Event()  # set once every GPU is registered for events (or given up on)
        self._thread: threading.Thread | None = None
        # Resolved when the thread ends: None after stop(), the exception when it died.
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._event_set: Any = None
        self._handles: dict[str, Any] = {}
        self._uuid_by_handle: dict[int, str] = {}
        self._unregistered: set[str] = set()  # GPUs whose events could not be registered (yet)
        self._index = {g.uuid: g.index for g in inventory.gpus}

    @property
    def gpus(self) -> frozenset[str]:
        """The UUIDs of the GPUs this monitor watches."""
        return frozenset(self._index)

    def start(self, arm_timeout_s: float = 10.0) -> None:
        """Start watching; returns once events are armed, so no XID after this call can be missed."""
        # The daemons decide (and log) that health checks are off; they start no monitor then.
        assert self._classifier.policy.checks_enabled, "no health monitor is started with health checks off"
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
        try:
            self.arm()
            self._armed.set()
            self._loop()
        except BaseException as err:  # handed to whoever supervises the thread
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # nobody waits any more
                self.finished.set_exception(err)
        else:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.finished.set_result(None)
        finally:
            self._armed.set()
            self.disarm()

    def _loop(self) -> None:
        next_probe = self._clock() + self._settings.probe_interval_s
        backoff = event_wait_backoff()
        while not self._stop.is_set():
            if self._clock() >= next_probe:
                self.probe()
                next_probe = self._clock() + self._settings.probe_interval_s
            until_probe_s = max(0.0, next_probe - self._clock())
            if self._event_set is None:  # no events on this node: probes only
                self._stop.wait(until_probe_s)
                continue
            # Wake in time for the next probe, so recovery is never later than one probe interval.
            if self.poll(min(self._settings.wait_ms, int(until_probe_s * 1000) + 1)):
                backoff.reset()
            else:
                self._stop.wait(backoff.next_delay())

    # --- steps ---------------------------------------------------------------------------------------

    def arm(self) -> None:
        """Register every GPU for health events, then report the faults its GPUs already have."""
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error(
                "cannot create an NVML event set (%s): XIDs will not be seen; probes still catch lost GPUs",
                err,
            )
        events = [e for gpu in self._inventory.gpus if (e := self._register(gpu.uuid))]
        named = {e.gpu_uuid for e in events}
        faulty = self.faults.snapshot().items()
        events += [HealthEvent(u, f.health) for u, f in faulty if u in self._index and u not in named]
        self._emit(events)

    def disarm(self) -> None:
        nvml, event_set, self._event_set = self._nvml, self._event_set, None
        if event_set is None:
            return
        try:
            nvml.nvmlEventSetFree(event_set)
        except nvml.NVMLError as err:
            log.debug("freeing NVML event set failed: %s", err)

    def poll(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for one NVML event and act on it; False when the wait itself failed."""
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except nvml.NVMLError_Timeout:
            return True
        except nvml.NVMLError as err:
            log.error("waiting for NVML events failed (%s); marking all GPUs unhealthy", err)
            reason = f"NVML event wait failed: {err}"
            self._emit([e for u in self._index if (e := self._fault(u, XidAction.RESET_GPU, reason, None))])
            return False
        event = self._interpret(data)
        if event is not None:
            self._emit([event])
        return True

    def probe(self) -> None:
        """Lost GPUs (NVML calls fail with GPU_IS_LOST even without an event), then recovery checks."""
        nvml, events = self._nvml, []
        for uuid, handle in list(self._handles.items()):
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
                log.debug("probe of GPU %s failed: %s", self._name(uuid), err)
        if self._settings.recovery:
            events.extend(self._recover())
        self._repeats.flush()
        if events:
            self._emit(events)

    # --- events --------------------------------------------------------------------------------------

    def _register(self, uuid: str) -> HealthEvent | None:
        """Register for events on one GPU; a GPU we cannot watch is reported unhealthy (NVIDIA does too)."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as err:
            self._unregistered.add(uuid)
            return self._fault(uuid, XidAction.RESET_GPU, f"NVML cannot find the GPU: {err}", None)
        self._remember(uuid, handle)
        if self._event_set is None:
            return None
        problem = self._register_events(uuid, handle)
        if problem is None:
            return None
        return self._fault(uuid, XidAction.RESET_GPU, f"health events unavailable: {problem}", None)

    def _register_events(self, uuid: str, handle: Any) -> str | None:
        """None once the GPU's events are registered (or it is too old to have any); else the error."""
        nvml = self._nvml
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        try:
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, self._event_set)
        except nvml.NVMLError_NotSupported:
            log.warning("GPU %s is too old to support health checking; it stays Healthy", self._name(uuid))
        except nvml.NVMLError as err:
            self._unregistered.add(uuid)
            return str(err)
        self._unregistered.discard(uuid)
        return None

    def _remember(self, uuid: str, handle: Any) -> None:
        self._handles[uuid] = handle
        self._uuid_by_handle[device_handle_id(handle)] = uuid

    def _interpret(self, data: Any) -> HealthEvent | None:
        nvml = self._nvml
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            kind = "double_bit" if data.eventType == nvml.nvmlEventTypeDoubleBitEccError else "single_bit"
            if self._observer is not None:
                self._observer.ecc_event(kind)
            where = self._uuid_by_handle.get(device_handle_id(data.device))
            self._repeats.note(
                ("ecc", kind, where),
                f"ignoring a {kind.replace('_', '-')} ECC event on GPU {self._name(where)} (NVIDIA acts on "
                "XIDs only; ECC errors that need action also raise an XID)",
                "kubegpu_ecc_events_total",
            )
            return None
        xid = int(data.eventData)
        described = self._classifier.describe(xid)
        uuid = self._uuid_by_handle.get(device_handle_id(data.device))
        if uuid is None:
            try:
                uuid = nvml.nvmlDeviceGetUUID(data.device)
            except nvml.NVMLError as err:
                if self._observer is not None:
                    self._observer.xid(xid, None)
                log.error("%s on a GPU we cannot identify (%s); marking all GPUs unhealthy", described, err)
                for u in self._index:
                    self._fault(u, XidAction.RESET_GPU, f"{described} on an unidentified GPU", xid)
                return HealthEvent(ALL_GPUS, Health.failed(f"{described} on an unidentified GPU", xid))
        if self._observer is not None:
            self._observer.xid(xid, uuid)
        if uuid not in self._index:
            self._ignore(xid, uuid, f"ignoring {described} on GPU {uuid}, which this plugin does not manage")
            return None
        action = self._classifier.action(xid)
        if not action.marks_unhealthy:
            advice = f"{action.value} ({action.advice})"
            self._ignore(xid, uuid, f"{described} on GPU {self._name(uuid)}: {advice}")
            return None
        return self._fault(uuid, action, described, xid)

    def _ignore(self, xid: int, uuid: str, message: str) -> None:
        if self._observer is not None:
            self._observer.xid_ignored(xid)
        self._repeats.note(("xid", xid, uuid), message, "kubegpu_xid_ignored_total")

    def _fault(self, uuid: str, action: XidAction, reason: str, xid: int | None) -> HealthEvent | None:
        """Record a fault; returns the event to send when this is a transition (or a worse action)."""
        recorded, fault = self.faults.record(uuid, action, reason, xid, self._clock())
        if recorded is Recorded.REPEATED:
            log.debug("GPU %s: %s while already unhealthy", self._name(uuid), reason)
            return None
        if recorded is Recorded.WORSE:
            log.warning("GPU %s: %s; action now: %s", self._name(uuid), reason, action.advice)
            return HealthEvent(uuid, fault.health)
        if action.recoverable and self._settings.recovery:
            after = f"recovery probes run after {self._settings.quiet_period_s:g} s without critical XIDs"
        else:
            after = "stays Unhealthy until the plugin restarts"
        log.warning(
            "GPU %s Healthy -> Unhealthy: %s; action: %s; %s", self._name(uuid), reason, action.advice, after
        )
        return HealthEvent(uuid, fault.health)

    def _name(self, uuid: str | None) -> str:
        """How every message names a GPU: its index and its UUID."""
        if uuid is None:
            return "? (not identified)"
        return f"{self._index.get(uuid, '?')} ({uuid})"

    # --- recovery ------------------------------------------------------------------------------------

    def _recover(self) -> list[HealthEvent]:
        now, events = self._clock(), []
        for uuid, fault in self.faults.snapshot().items():
            if uuid not in self._index or not fault.action.recoverable:
                continue
            if now - fault.last_at < self._settings.quiet_period_s:
                continue
            problem = self._recovery_problem(uuid)
            if problem is not None:
                log.debug("GPU %s not recovered yet: %s", self._name(uuid), problem)
                continue
            if not self.faults.clear(uuid, fault):
                continue  # a critical event arrived while we probed: the quiet period starts over
            log.info(  # good news: INFO, so alerts on WARNING fire for the fault, not for its end
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
        self._remember(uuid, handle)
        try:
            if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == nvml.NVML_FEATURE_ENABLED:
                return "page retirement pending (needs a GPU reset)"
        except nvml.NVMLError as err:
            log.debug("page retirement status of GPU %s unavailable: %s", self._name(uuid), err)
        try:
            _, _, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
            if pending or failure:
                return "row remapping pending or failed (needs a GPU reset)"
        except nvml.NVMLError as err:
            log.debug("row remapping status of GPU %s unavailable: %s", self._name(uuid), err)
        if uuid in self._unregistered and self._event_set is not None:
            problem = self._register_events(uuid, handle)
            if problem is not None:
                return f"health events still cannot be registered ({problem})"
        return None
