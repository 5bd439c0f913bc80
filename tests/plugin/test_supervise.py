"""The supervisor of the daemon's background tasks: restart with back-off, exit when that does not help."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from kubegpu.common.backoff import Backoff
from kubegpu.plugin.supervise import OnFailure, Supervisor, TaskDown


class Fatal:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.happened = asyncio.Event()

    def __call__(self, name: str, err: BaseException) -> None:
        self.calls.append((name, str(err)))
        self.happened.set()


class Restarts:
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_restarted(self, name: str) -> None:
        self.names.append(name)


def quick() -> Backoff:
    return Backoff(initial=0.001, maximum=0.001)


def never() -> Backoff:
    return Backoff(initial=3600.0, maximum=3600.0)


def failing(times: int, runs: list[int], then: asyncio.Event | None = None) -> Callable[[], object]:
    """A task body that fails its first `times` runs, then waits (for ever, or until `then` is set)."""

    async def run() -> None:
        runs.append(len(runs) + 1)
        if len(runs) <= times:
            raise RuntimeError(f"injected failure {len(runs)}")
        if then is not None:
            then.set()
        await asyncio.Event().wait()

    return run


async def test_a_failed_task_is_restarted_after_its_back_off(caplog: pytest.LogCaptureFixture) -> None:
    fatal, restarts, runs, up = Fatal(), Restarts(), [], asyncio.Event()
    supervisor = Supervisor(fatal, backoff=quick, observer=restarts)
    supervisor.start("config-watch", failing(2, runs, up))  # type: ignore[arg-type]
    await asyncio.wait_for(up.wait(), 10)
    assert runs == [1, 2, 3] and restarts.names == ["config-watch", "config-watch"] and not fatal.calls
    assert supervisor.down() == [] and supervisor.states() == {"config-watch": True}
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and failures[0].exc_info is not None  # the cause, with its traceback
    assert (
        failures[0]
        .getMessage()
        .startswith(
            "background task config-watch failed (RuntimeError: injected failure 1); restarting it in 0.0 s"
        )
    )
    await supervisor.close()


async def test_a_task_waiting_to_restart_is_down_and_says_why() -> None:
    clock = [100.0]
    supervisor = Supervisor(Fatal(), backoff=never, clock=lambda: clock[0])
    failed = asyncio.Event()

    async def run() -> None:
        failed.set()  # the supervisor marks the task down in the same step as it raises
        raise RuntimeError("injected failure 1")

    supervisor.start("nvml-health", run)
    await failed.wait()
    clock[0] += 5
    (down,) = supervisor.down()
    assert down == TaskDown("nvml-health", 5.0, 1, "RuntimeError: injected failure 1", 3595.0)
    assert down.describe() == (
        "background task nvml-health is down for 5 s after 1 failure(s), last: RuntimeError: injected "
        "failure 1; restarting in 3595 s"
    )
    assert supervisor.states() == {"nvml-health": False}
    await supervisor.close()


async def test_on_restart_runs_before_each_restart_only() -> None:
    runs: list[int] = []
    caught_up: list[int] = []
    up = asyncio.Event()

    async def catch_up() -> None:
        caught_up.append(len(runs))

    supervisor = Supervisor(Fatal(), backoff=quick)
    supervisor.start("config-watch", failing(2, runs, up), on_restart=catch_up)  # type: ignore[arg-type]
    await asyncio.wait_for(up.wait(), 10)
    assert caught_up == [1, 2]  # before the second and the third run, not before the first
    await supervisor.close()


async def test_a_task_that_keeps_failing_ends_the_daemon() -> None:
    fatal, runs = Fatal(), []
    supervisor = Supervisor(fatal, backoff=quick, max_failures=3)
    supervisor.start("registrar-loop", failing(100, runs))  # type: ignore[arg-type]
    await asyncio.wait_for(fatal.happened.wait(), 10)
    assert runs == [1, 2, 3] and fatal.calls == [("registrar-loop", "injected failure 3")]
    (down,) = supervisor.down()
    assert down.name == "registrar-loop" and down.restart_in_s is None
    assert down.describe().endswith("not restarting")


async def test_an_exit_task_ends_the_daemon_at_its_first_failure() -> None:
    fatal, runs = Fatal(), []
    supervisor = Supervisor(fatal, backoff=quick)
    supervisor.start("apply", failing(1, runs), on_failure=OnFailure.EXIT)  # type: ignore[arg-type]
    await asyncio.wait_for(fatal.happened.wait(), 10)
    assert runs == [1] and fatal.calls == [("apply", "injected failure 1")]


async def test_a_failure_after_a_healthy_run_starts_the_count_over() -> None:
    clock = [0.0]
    fatal, runs = Fatal(), []
    supervisor = Supervisor(fatal, backoff=quick, clock=lambda: clock[0], max_failures=2)

    async def run() -> None:
        runs.append(1)
        if len(runs) == 2:  # the second run lasts a healthy hour before it fails
            clock[0] += 3600
        raise RuntimeError("boom")

    supervisor.start("health-reports", run)
    await asyncio.wait_for(fatal.happened.wait(), 10)
    # Failure 1; then 1 again after the healthy hour (not 2, which would have been fatal); then 2.
    assert len(runs) == 3


async def test_a_task_that_returns_is_done_and_not_restarted() -> None:
    runs: list[int] = []

    async def retry_that_succeeds() -> None:
        runs.append(1)

    supervisor = Supervisor(Fatal(), backoff=quick)
    task = supervisor.start("discovery-retry", retry_that_succeeds)
    await task
    assert runs == [1] and not supervisor.running("discovery-retry") and supervisor.down() == []
    assert supervisor.states() == {}
