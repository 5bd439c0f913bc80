"""HealthMonitor on the fake NVML, in-process: XID actions, recovery probes, lost GPUs, settings.

Most tests drive the monitor step by step (`arm`, `poll`, `probe`) on an injected clock: no thread, no
waiting, so a quiet period is exactly as long as the test says. A few run the real thread and wait for
what it reports.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pynvml
import pytest

from kubegpu.node.discovery import discover
from kubegpu.node.faults import FaultBook
from kubegpu.node.health import HealthEvent, HealthMonitor, HealthSettings
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.node.xids import XidAction, XidCatalogError, xid_classifier
from kubegpu.settings.env import DaemonEnv

QUIET = 60.0
PROBE = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Observed:
    """What the monitor reported to its observer (the metrics, in the daemon)."""

    def __init__(self) -> None:
        self.xids: Counter[int] = Counter()
        self.ignored: Counter[int] = Counter()
        self.ecc: Counter[str] = Counter()

    def xid(self, code: int, gpu_uuid: str | None) -> None:
        self.xids[code] += 1

    def xid_ignored(self, code: int) -> None:
        self.ignored[code] += 1

    def ecc_event(self, kind: str) -> None:
        self.ecc[kind] += 1


def health_settings(env: dict[str, str] | None = None, **options: object) -> HealthSettings:
    base = HealthSettings.from_settings(DaemonEnv.from_environ(env or {}))
    values = {"quiet_period_s": QUIET, "probe_interval_s": PROBE, "wait_ms": 20, **options}
    return HealthSettings(classifier=base.classifier, recovery=base.recovery, **values)  # type: ignore[arg-type]


class Stepped:
    """A monitor on the fake NVML, driven by the test on a fake clock."""

    def __init__(
        self,
        state: Path,
        *,
        profile: str = "t4-pcie",
        env: dict[str, str] | None = None,
        faults: FaultBook | None = None,
        arm: bool = True,
    ) -> None:
        self.nvml = FakeNvml.from_profile(profile, state_dir=state)
        self.nvml.nvmlInit()
        self.inventory = discover(self.nvml, self.nvml.sysfs_root)
        self.uuids = [g.uuid for g in self.inventory.gpus]
        self.state = StateDir(state)
        self.clock = Clock()
        self.observed = Observed()
        self.settings = health_settings(env)
        self.emitted: list[HealthEvent] = []
        self.monitor = HealthMonitor(
            self.nvml,
            self.inventory,
            self.settings,
            self.emitted.extend,
            faults=faults,
            observer=self.observed,
            clock=self.clock,
        )
        if arm:
            self.monitor.arm()

    def poll(self, events: int = 1) -> list[HealthEvent]:
        """Let the monitor take `events` injected events, and return what it reported."""
        for _ in range(events):
            assert self.monitor.poll(0)
        return self.take()

    def probe(self, after_s: float = 0.0) -> list[HealthEvent]:
        self.clock.advance(after_s)
        self.monitor.probe()
        return self.take()

    def take(self) -> list[HealthEvent]:
        out, self.emitted[:] = list(self.emitted), []
        return out

    def close(self) -> None:
        self.monitor.disarm()
        self.nvml.nvmlShutdown()


@pytest.fixture
def step(tmp_path: Path) -> Iterator[Stepped]:
    s = Stepped(tmp_path)
    yield s
    s.close()


def test_reset_class_xid_marks_unhealthy_then_recovers_after_exactly_the_quiet_period(step: Stepped) -> None:
    assert step.take() == []  # arming a healthy node reports nothing
    step.state.inject_xid(1, 48)
    (sick,) = step.poll()
    assert sick.gpu_uuid == step.uuids[1] and not sick.health.healthy and sick.health.xid == 48
    assert sick.health.reason == "XID 48 (double-bit ECC error); action: reset_gpu"
    assert step.probe(after_s=QUIET - 0.001) == []  # not one moment before the quiet period
    (well,) = step.probe(after_s=0.001)
    assert well.gpu_uuid == step.uuids[1] and well.health.healthy
    assert step.uuids[1] not in step.monitor.faults


def test_new_xid_restarts_the_quiet_period(step: Stepped) -> None:
    step.state.inject_xid(0, 48)
    assert not step.poll()[0].health.healthy
    step.clock.advance(QUIET * 0.7)
    step.state.inject_xid(0, 48)  # still failing: no second transition, but the clock restarts
    assert step.poll() == []
    assert step.probe(after_s=QUIET * 0.6) == []  # 1.3 quiet periods since the first, 0.6 since the last
    (well,) = step.probe(after_s=QUIET * 0.4)
    assert well.health.healthy


def test_a_reboot_class_xid_overrides_a_reset_class_fault_and_never_recovers(step: Stepped) -> None:
    step.state.inject_xid(3, 48)
    step.state.inject_xid(3, 154)
    first, worse = step.poll(2)
    assert "reset_gpu" in (first.health.reason or "") and "reboot_node" in (worse.health.reason or "")
    assert step.probe(after_s=QUIET * 10) == []
    fault = step.monitor.faults.get(step.uuids[3])
    assert fault is not None and fault.action is XidAction.REBOOT_NODE


def test_application_xids_leave_the_gpu_healthy_and_are_counted(step: Stepped) -> None:
    codes = (13, 31, 43, 45, 68, 109, 94, 63)
    for xid in codes:
        step.state.inject_xid(2, xid)
    assert step.poll(len(codes)) == []
    assert step.observed.ignored == Counter(codes) and step.observed.xids == Counter(codes)
    assert step.monitor.faults.snapshot() == {}


def test_an_xid_storm_is_counted_and_logged_once_a_minute(
    step: Stepped, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.node.health")
    for _ in range(500):
        step.state.inject_xid(2, 13)
    assert step.poll(500) == []
    assert step.observed.ignored == Counter({13: 500})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"XID 13 (graphics engine exception (application fault)) on GPU 2 ({step.uuids[2]}): restart_app "
        "(restart the application; the GPU stays Healthy); repeats are counted in kubegpu_xid_ignored_total "
        "and logged at most every 60 s"
    ]
    caplog.clear()
    step.probe(after_s=59.0)
    assert caplog.records == []  # the minute is not over
    step.probe(after_s=1.0)
    (summary,) = [r.getMessage() for r in caplog.records]
    assert summary.endswith("; 499 more like it in the last 60 s")


def test_ecc_events_are_counted_not_acted_on(step: Stepped) -> None:
    step.state.inject_ecc(1, "single")
    step.state.inject_ecc(1, "single")
    assert step.poll(2) == []
    assert step.observed.ecc == Counter({"single_bit": 2}) and step.monitor.faults.snapshot() == {}


def test_pending_page_retirement_blocks_recovery_until_reset(step: Stepped) -> None:
    step.state.inject_ecc(0, "double")  # T4: page retirement pending
    step.state.inject_xid(0, 48)
    (sick,) = step.poll(2)
    assert not sick.health.healthy
    assert step.probe(after_s=QUIET * 3) == []
    step.state.recover(0)  # as after a GPU reset
    (well,) = step.probe(after_s=PROBE)
    assert well.gpu_uuid == step.uuids[0] and well.health.healthy


@pytest.mark.parametrize("profile", ["dgx-a100", "hgx-h100"])
def test_pending_row_remap_blocks_recovery_until_reset(tmp_path: Path, profile: str) -> None:
    s = Stepped(tmp_path, profile=profile)
    try:
        s.state.inject_ecc(4, "double")  # A100/H100: a row remap is pending until the GPU is reset
        s.state.inject_xid(4, 48)
        (sick,) = s.poll(2)
        assert sick.gpu_uuid == s.uuids[4] and not sick.health.healthy
        for _ in range(5):
            assert s.probe(after_s=QUIET) == []
        assert s.nvml.nvmlDeviceGetRemappedRows(s.nvml.nvmlDeviceGetHandleByIndex(4))[2] == 1
        s.state.recover(4)
        (well,) = s.probe(after_s=PROBE)
        assert well.gpu_uuid == s.uuids[4] and well.health.healthy
    finally:
        s.close()


def test_lost_gpu_recovers_when_it_is_back(step: Stepped) -> None:
    step.state.inject_lost(2)  # XID 79, and every call on it fails
    (event,) = step.poll()
    assert event.gpu_uuid == step.uuids[2] and not event.health.healthy and event.health.xid == 79
    assert step.probe(after_s=QUIET * 2) == []  # calls on it still fail
    step.state.recover(2)
    (well,) = step.probe(after_s=PROBE)
    assert well.gpu_uuid == step.uuids[2] and well.health.healthy


def test_a_gpu_lost_without_an_event_is_caught_by_the_probe(step: Stepped) -> None:
    step.state.update_gpu_faults(1, lambda f: dataclasses.replace(f, lost=True))
    (event,) = step.probe(after_s=PROBE)
    assert event.gpu_uuid == step.uuids[1]
    assert event.health.reason == "GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST); action: reset_gpu"


def test_wait_error_marks_every_gpu_then_they_recover(step: Stepped) -> None:
    step.state.inject_wait_error()
    assert not step.monitor.poll(0)
    down = step.take()
    assert {e.gpu_uuid for e in down} == set(step.uuids) and not any(e.health.healthy for e in down)
    up = step.probe(after_s=QUIET)
    assert {e.gpu_uuid for e in up} == set(step.uuids) and all(e.health.healthy for e in up)


def test_recovery_off_is_nvidias_sticky_behaviour(tmp_path: Path) -> None:
    s = Stepped(tmp_path, env={"KUBEGPU_HEALTH_RECOVERY": "false"})
    try:
        s.state.inject_xid(1, 48)
        assert not s.poll()[0].health.healthy
        assert s.probe(after_s=QUIET * 10) == []
    finally:
        s.close()


def test_nvidia_env_still_decides_what_is_acted_on(tmp_path: Path) -> None:
    s = Stepped(tmp_path, env={"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "13"})
    try:
        s.state.inject_xid(0, 48)
        s.state.inject_xid(1, 13)
        (event,) = s.poll(2)
        assert event.gpu_uuid == s.uuids[1] and not event.health.healthy
        assert s.observed.ignored == Counter({48: 1})
    finally:
        s.close()


def test_faults_outlive_the_monitor_that_found_them(tmp_path: Path) -> None:
    book = FaultBook()
    first = Stepped(tmp_path, faults=book)
    first.state.inject_xid(3, 154)
    first.state.inject_xid(1, 48)
    first.poll(2)
    first.close()
    second = Stepped(tmp_path, faults=book, arm=False)
    try:
        second.monitor.arm()
        carried = {e.gpu_uuid: e.health for e in second.take()}
        assert set(carried) == {second.uuids[1], second.uuids[3]} and not any(
            h.healthy for h in carried.values()
        )
        # The reset-class fault recovers on the new monitor's watch; the reboot-class one stays.
        (well,) = second.probe(after_s=QUIET)
        assert well.gpu_uuid == second.uuids[1] and well.health.healthy
        assert set(book.snapshot()) == {second.uuids[3]}
    finally:
        second.close()


def test_a_gpu_lost_when_the_monitor_arms_is_watched_again_once_it_is_back(tmp_path: Path) -> None:
    s = Stepped(tmp_path, arm=False)
    try:
        s.state.update_gpu_faults(2, lambda f: dataclasses.replace(f, lost=True))
        s.monitor.arm()
        (event,) = s.take()
        assert event.gpu_uuid == s.uuids[2] and not event.health.healthy
        assert "NVML cannot find the GPU" in (event.health.reason or "")
        s.state.recover(2)
        (well,) = s.probe(after_s=QUIET)
        assert well.gpu_uuid == s.uuids[2] and well.health.healthy
        s.state.inject_xid(2, 48)  # its events were registered again on recovery
        (sick,) = s.poll()
        assert sick.gpu_uuid == s.uuids[2] and sick.health.xid == 48
    finally:
        s.close()


def test_without_an_event_set_probes_still_catch_a_lost_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = Stepped(tmp_path, arm=False)
    try:

        def no_event_set() -> object:
            raise pynvml.NVMLError_NotSupported()

        s.nvml.nvmlEventSetCreate = no_event_set  # type: ignore[method-assign]
        s.monitor.arm()
        assert "cannot create an NVML event set" in caplog.text
        s.state.update_gpu_faults(0, lambda f: dataclasses.replace(f, lost=True))
        (event,) = s.probe(after_s=PROBE)
        assert event.gpu_uuid == s.uuids[0] and not event.health.healthy
    finally:
        s.close()


def test_transitions_name_the_gpu_by_index_and_uuid(step: Stepped, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubegpu.node.health")
    step.state.inject_xid(1, 48)
    step.poll()
    step.probe(after_s=QUIET)
    down, up = (r for r in caplog.records if "->" in r.getMessage())
    assert down.getMessage().startswith(
        f"GPU 1 ({step.uuids[1]}) Healthy -> Unhealthy: XID 48 (double-bit ECC error)"
    )
    assert up.getMessage().startswith(f"GPU 1 ({step.uuids[1]}) Unhealthy -> Healthy: recovery probes passed")
    assert (down.levelname, up.levelname) == ("WARNING", "INFO")  # a recovery is good news


# --- the thread --------------------------------------------------------------------------------------


class Threaded:
    def __init__(self, state: Path) -> None:
        self.nvml = FakeNvml.from_profile("t4-pcie", state_dir=state)
        self.nvml.nvmlInit()
        self.inventory = discover(self.nvml, self.nvml.sysfs_root)
        self.state = StateDir(state)
        self.events: queue.Queue[HealthEvent] = queue.Queue()
        self.monitor = HealthMonitor(self.nvml, self.inventory, health_settings(), self._emit)

    def _emit(self, events: Sequence[HealthEvent]) -> None:
        for event in events:
            self.events.put(event)

    def close(self) -> None:
        self.monitor.stop()
        self.nvml.nvmlShutdown()


def test_the_thread_acts_on_events_until_stopped(tmp_path: Path) -> None:
    t = Threaded(tmp_path)
    try:
        t.monitor.start()
        t.state.inject_xid(1, 79)
        event = t.events.get(timeout=10)
        assert event.gpu_uuid == t.inventory.gpus[1].uuid and not event.health.healthy
        t.monitor.stop()
        assert t.monitor.finished.result(timeout=10) is None
    finally:
        t.close()


def test_a_thread_that_dies_says_why_in_its_finished_future(tmp_path: Path) -> None:
    t = Threaded(tmp_path)
    try:

        def broken(event_set: object, timeout_ms: int) -> object:
            raise RuntimeError("injected failure in the health thread")

        t.nvml.nvmlEventSetWait_v2 = broken  # type: ignore[method-assign]
        t.monitor.start()
        with pytest.raises(RuntimeError, match="injected failure in the health thread"):
            t.monitor.finished.result(timeout=10)
    finally:
        t.close()


# --- settings ----------------------------------------------------------------------------------------


def test_settings_come_from_the_validated_env() -> None:
    settings = HealthSettings.from_settings(
        DaemonEnv.from_environ(
            {
                "KUBEGPU_RECOVERY_QUIET_SECONDS": "5",
                "KUBEGPU_HEALTH_RECOVERY": "0",
                "KUBEGPU_HEALTH_PROBE_SECONDS": "0.5",
            }
        )
    )
    assert settings.quiet_period_s == 5 and not settings.recovery and settings.probe_interval_s == 0.5
    defaults = HealthSettings.from_settings(DaemonEnv.default())
    assert (defaults.quiet_period_s, defaults.recovery, defaults.probe_interval_s) == (60, True, 5)


def test_user_catalog_overrides_and_bad_catalog_is_explained(tmp_path: Path) -> None:
    good = tmp_path / "xids.yaml"
    good.write_text(
        "xids:\n  48: {action: reboot_node, meaning: treat DBE as fatal here}\n  300: {action: ignore}\n"
    )
    classifier = xid_classifier(DaemonEnv.from_environ({"KUBEGPU_XID_ACTIONS": str(good)}))
    assert classifier.action(48) is XidAction.REBOOT_NODE
    assert classifier.action(300) is XidAction.IGNORE
    assert classifier.action(79) is XidAction.RESET_GPU  # built-in entries stay
    bad = tmp_path / "bad.yaml"
    bad.write_text("xids:\n  48: {action: explode}\n")
    with pytest.raises(XidCatalogError, match="KUBEGPU_XID_ACTIONS"):
        xid_classifier(DaemonEnv.from_environ({"KUBEGPU_XID_ACTIONS": str(bad)}))


class _RecordingStop(threading.Event):
    """The monitor's stop event: records each back-off wait and stops the loop after `limit` of them."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


def test_a_failing_event_wait_backs_off_from_100_ms_to_5_s_and_resets_on_success(tmp_path: Path) -> None:
    nvml = FakeNvml.from_profile("t4-pcie", state_dir=tmp_path)
    nvml.nvmlInit()
    try:
        inventory = discover(nvml, nvml.sysfs_root)
        settings = HealthSettings(probe_interval_s=3600.0, wait_ms=1)
        monitor = HealthMonitor(nvml, inventory, settings, lambda events: None)
        monitor.arm()
        # Eight failed waits, one that times out (a working wait), then two more failures.
        outcomes = iter([False] * 8 + [True] + [False] * 2)

        def wait(event_set: object, timeout_ms: int) -> object:
            if next(outcomes):
                raise pynvml.NVMLError_Timeout()
            raise pynvml.NVMLError_Unknown()

        nvml.nvmlEventSetWait_v2 = wait  # type: ignore[method-assign]
        stop = _RecordingStop(limit=10)
        monitor._stop = stop
        monitor._loop()
        assert stop.waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 0.1, 0.2])
    finally:
        nvml.nvmlShutdown()
