"""The labelling loop: oneshot, interval, infinite, SIGHUP reload, stop signals, write and label failures."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from kubegpu.common import files as files_module
from kubegpu.labels.errors import LabelError
from kubegpu.labels.loop import SignalWaiter, serve
from kubegpu.labels.settings import LabelSettings
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.settings.goduration import INFINITE
from kubegpu.settings.nvidia_config import ConfigError

MS = 1_000_000


def file_settings(**kw: Any) -> LabelSettings:
    """Settings that write the features.d file (or stdout), as --use-node-feature-api=false does."""
    return LabelSettings(use_node_feature_api=False, **kw)


class Script:
    """A waiter that answers from a list (None = the interval passed) and records the timeouts asked for."""

    def __init__(self, *answers: int | None) -> None:
        self.answers = list(answers)
        self.timeouts: list[float | None] = []

    def wait(self, timeout_s: float | None) -> int | None:
        self.timeouts.append(timeout_s)
        return self.answers.pop(0)


class Labeller:
    """Counts passes and records the timestamp each was given; can fail on a chosen pass."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[int | None] = []
        self.fail_on = fail_on

    def __call__(self, backend: Any, settings: LabelSettings, timestamp: int | None) -> dict[str, str]:
        self.calls.append(timestamp)
        if self.fail_on == len(self.calls):
            raise LabelError('error getting driver version: Version "550" does not match format "X.Y[.Z]"')
        return {"nvidia.com/pass": str(len(self.calls)), "nvidia.com/mig.strategy": settings.mig_strategy}


def no_backend() -> NvmlBackend:
    return cast(NvmlBackend, None)  # the stub labeller never looks at it


def clock() -> Iterator[float]:
    t = 1_000.0
    while True:
        yield t
        t += 1


def run(settings: LabelSettings | list[LabelSettings], waiter: Script, labeller: Labeller, **kw: Any) -> int:
    queue = list(settings) if isinstance(settings, list) else [settings]

    def load() -> LabelSettings:
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        return item

    ticks = clock()
    return serve(load, waiter, load_backend=no_backend, labeller=labeller, now=lambda: next(ticks), **kw)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "features.d" / "gfd"


def test_oneshot_writes_once_and_keeps_the_file(out: Path) -> None:
    waiter, labeller = Script(), Labeller()
    assert run(file_settings(oneshot=True, output_file=str(out)), waiter, labeller) == 0
    assert out.read_text() == "nvidia.com/mig.strategy=none\nnvidia.com/pass=1\n"
    assert waiter.timeouts == []


def test_interval_relabels_until_sigterm_then_removes_the_file(out: Path) -> None:
    waiter, labeller = Script(None, None, signal.SIGTERM), Labeller()
    settings = file_settings(sleep_interval=250 * MS, output_file=str(out))
    assert run(settings, waiter, labeller) == 0
    assert waiter.timeouts == [0.25, 0.25, 0.25]
    assert labeller.calls == [1000, 1000, 1000]  # the timestamp is taken once per config load
    assert not out.exists()
    assert not (out.parent / "gfd-tmp").exists()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGQUIT])
def test_other_stop_signals(out: Path, stop: signal.Signals) -> None:
    assert run(file_settings(output_file=str(out)), Script(stop), Labeller()) == 0
    assert not out.exists()


def test_infinite_labels_once_waits_forever_and_keeps_the_file(out: Path) -> None:
    waiter = Script(signal.SIGTERM)
    assert run(file_settings(sleep_interval=INFINITE, output_file=str(out)), waiter, Labeller()) == 0
    assert waiter.timeouts == [None]
    assert out.exists()


def test_sighup_reloads_without_removing_the_file(out: Path) -> None:
    seen: list[bool] = []
    first = file_settings(output_file=str(out))
    second = dataclasses.replace(first, mig_strategy="mixed")
    loads = [first, second]

    def load() -> LabelSettings:
        seen.append(out.exists())
        return loads.pop(0)

    labeller = Labeller()
    ticks = clock()
    waiter = Script(signal.SIGHUP, signal.SIGTERM)
    code = serve(load, waiter, load_backend=no_backend, labeller=labeller, now=lambda: next(ticks))
    assert code == 0
    assert seen == [False, True]  # the file survived the reload
    assert labeller.calls == [1000, 1001]  # a new timestamp after the reload
    assert not out.exists()


def test_reload_to_another_file_removes_the_old_one(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    settings = [file_settings(output_file=str(old)), file_settings(oneshot=True, output_file=str(new))]
    assert run(settings, Script(signal.SIGHUP), Labeller()) == 0
    assert not old.exists()
    assert new.read_text() == "nvidia.com/mig.strategy=none\nnvidia.com/pass=2\n"


def test_reload_with_a_broken_config_exits_1_and_removes_the_file(out: Path) -> None:
    settings: list[Any] = [file_settings(output_file=str(out)), ConfigError("unknown version: v2")]
    assert run(settings, Script(signal.SIGHUP), Labeller()) == 1
    assert not out.exists()


def test_config_error_at_start_exits_1(out: Path) -> None:
    settings: list[Any] = [ConfigError("bad")]
    assert run(settings, Script(), Labeller()) == 1


def test_label_error_exits_1_and_removes_the_file(out: Path) -> None:
    labeller = Labeller(fail_on=2)
    assert run(file_settings(output_file=str(out)), Script(None), labeller) == 1
    assert len(labeller.calls) == 2
    assert not out.exists()


def test_failed_write_is_retried_at_the_next_interval(
    out: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = files_module._write_fully
    failures = iter([True, False])

    def flaky(fd: int, data: bytes) -> None:
        if next(failures, False):
            raise OSError(28, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(files_module, "_write_fully", flaky)
    seen: list[bool] = []

    class Watch(Script):
        def wait(self, timeout_s: float | None) -> int | None:
            seen.append(out.exists())
            return super().wait(timeout_s)

    settings = file_settings(sleep_interval=10 * MS, output_file=str(out))
    assert run(settings, Watch(None, signal.SIGTERM), Labeller()) == 0
    assert seen == [False, True]  # the first pass could not write, the second did
    assert "No space left on device (ENOSPC); the filesystem is full" in caplog.text
    assert "keeping the previous labels, next attempt in 10ms" in caplog.text


def test_failed_write_in_oneshot_exits_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings = file_settings(oneshot=True, output_file=str(blocker / "gfd"))
    assert run(settings, Script(), Labeller()) == 1


def test_stdout_mode(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert run(file_settings(oneshot=True, output_file=""), Script(), Labeller()) == 0
    assert capsysbinary.readouterr().out == b"nvidia.com/mig.strategy=none\nnvidia.com/pass=1\n"


def test_signal_waiter_receives_real_signals() -> None:
    before = signal.getsignal(signal.SIGHUP)
    waiter = SignalWaiter().install()
    try:
        assert waiter.wait(0.01) is None
        os.kill(os.getpid(), signal.SIGHUP)
        assert waiter.wait(5) == signal.SIGHUP
    finally:
        waiter.restore()
    assert signal.getsignal(signal.SIGHUP) == before
