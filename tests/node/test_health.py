"""HealthMonitor on the fake NVML, in-process: XID actions, recovery probes, lost GPUs, settings."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pynvml
import pytest

from kubegpu.node.discovery import discover
from kubegpu.node.health import HealthEvent, HealthMonitor, HealthSettings
from kubegpu.node.nvml.fake import FakeNvml
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.node.xids import XidAction, XidCatalogError, xid_classifier
from kubegpu.settings.env import DaemonEnv

QUIET = 0.3
PROBE = 0.05


class Watch:
    """A running monitor and the events it emitted."""

    def __init__(self, state: Path, env: dict[str, str] | None = None, **settings: object) -> None:
        self.nvml = FakeNvml.from_profile("t4-pcie", state_dir=state)
        self.nvml.nvmlInit()
        self.inventory = discover(self.nvml, self.nvml.sysfs_root)
        self.uuids = [g.uuid for g in self.inventory.gpus]
        self.state = StateDir(state)
        self.events: queue.Queue[HealthEvent] = queue.Queue()
        base = HealthSettings.from_settings(DaemonEnv.from_environ(env or {}))
        options = {"quiet_period_s": QUIET, "probe_interval_s": PROBE, "wait_ms": 20, **settings}
        self.settings = HealthSettings(classifier=base.classifier, recovery=base.recovery, **options)  # type: ignore[arg-type]
        self.monitor = HealthMonitor(self.nvml, self.inventory, self.settings, self._emit)
        self.monitor.start()

    def _emit(self, events: Sequence[HealthEvent]) -> None:
        for event in events:
            self.events.put(event)

    def next(self, timeout: float = 3.0) -> HealthEvent:
        return self.events.get(timeout=timeout)

    def nothing_for(self, seconds: float) -> None:
        with pytest.raises(queue.Empty):
            self.events.get(timeout=seconds)

    def close(self) -> None:
        self.monitor.stop()
        self.nvml.nvmlShutdown()


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Watch]:
    w = Watch(tmp_path)
    yield w
    w.close()


def test_reset_class_xid_marks_unhealthy_then_recovers_after_quiet_period(watch: Watch) -> None:
    watch.state.inject_xid(1, 48)
    sick = watch.next()
    assert sick.gpu_uuid == watch.uuids[1] and not sick.health.healthy and sick.health.xid == 48
    assert "double-bit ECC error" in (sick.health.reason or "") and "reset_gpu" in (sick.health.reason or "")
    started = time.monotonic()
    well = watch.next()
    assert well.gpu_uuid == watch.uuids[1] and well.health.healthy
    assert time.monotonic() - started >= QUIET * 0.9  # not before the quiet period


def test_new_xid_restarts_the_quiet_period(watch: Watch) -> None:
    watch.state.inject_xid(0, 48)
    assert not watch.next().health.healthy
    time.sleep(QUIET * 0.7)
    watch.state.inject_xid(0, 48)  # still failing: no second transition, but the clock restarts
    watch.nothing_for(QUIET * 0.6)
    assert watch.next().health.healthy


def test_application_xids_leave_the_gpu_healthy(watch: Watch) -> None:
    for xid in (13, 31, 43, 45, 68, 109, 94, 63):
        watch.state.inject_xid(2, xid)
    watch.nothing_for(0.3)


def test_reboot_class_xid_never_recovers(watch: Watch) -> None:
    watch.state.inject_xid(3, 154)
    event = watch.next()
    assert not event.health.healthy and "reboot_node" in (event.health.reason or "")
    watch.nothing_for(QUIET + 0.3)


def test_pending_row_remap_blocks_recovery_until_reset(watch: Watch) -> None:
    watch.state.inject_ecc(0, "double")  # T4: page retirement pending
    watch.state.inject_xid(0, 48)
    assert not watch.next().health.healthy
    watch.nothing_for(QUIET + 0.3)
    watch.state.recover(0)  # as after a GPU reset
    assert watch.next().health.healthy


def test_lost_gpu_recovers_when_it_is_back(watch: Watch) -> None:
    watch.state.inject_lost(2)
    event = watch.next()
    assert event.gpu_uuid == watch.uuids[2] and not event.health.healthy
    watch.nothing_for(QUIET + 0.2)  # calls on it still fail
    watch.state.recover(2)
    assert watch.next().health.healthy


def test_wait_error_marks_every_gpu_then_they_recover(watch: Watch) -> None:
    watch.state.inject_wait_error()
    down = {watch.next().gpu_uuid for _ in watch.uuids}
    assert down == set(watch.uuids)
    up = {e.gpu_uuid for e in (watch.next() for _ in watch.uuids) if e.health.healthy}
    assert up == set(watch.uuids)


def test_recovery_off_is_nvidias_sticky_behaviour(tmp_path: Path) -> None:
    w = Watch(tmp_path, env={"KUBEGPU_HEALTH_RECOVERY": "false"})
    try:
        w.state.inject_xid(1, 48)
        assert not w.next().health.healthy
        w.nothing_for(QUIET + 0.3)
    finally:
        w.close()


def test_nvidia_env_still_decides_what_is_acted_on(tmp_path: Path) -> None:
    w = Watch(tmp_path, env={"DP_DISABLE_HEALTHCHECKS": "48", "DP_ENABLE_HEALTHCHECKS": "13"})
    try:
        w.state.inject_xid(0, 48)
        w.state.inject_xid(1, 13)
        event = w.next()
        assert event.gpu_uuid == w.uuids[1] and not event.health.healthy
        w.nothing_for(0.1)
    finally:
        w.close()


def test_faults_carry_over_to_a_new_monitor(tmp_path: Path, watch: Watch) -> None:
    watch.state.inject_xid(3, 154)
    watch.next()
    watch.monitor.stop()
    again = HealthMonitor(
        watch.nvml, watch.inventory, watch.settings, lambda e: None, faults=watch.monitor.faults
    )
    assert set(again.faults) == {watch.uuids[3]}
    assert again.faults[watch.uuids[3]].action is XidAction.REBOOT_NODE


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
        # Eight failed waits, one that times out (a working wait), then two more failures.
        outcomes = iter([False] * 8 + [True] + [False] * 2)

        def wait(event_set: object, timeout_ms: int) -> object:
            if next(outcomes):
                raise pynvml.NVMLError_Timeout()
            raise pynvml.NVMLError_Unknown()

        nvml.nvmlEventSetWait_v2 = wait  # type: ignore[method-assign]
        stop = _RecordingStop(limit=10)
        monitor._stop = stop
        monitor._loop(nvml.nvmlEventSetCreate())
        assert stop.waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 0.1, 0.2])
    finally:
        nvml.nvmlShutdown()
