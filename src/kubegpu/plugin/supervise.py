"""Crash-only background work: every long-running task of the daemon runs under a supervisor.

A task that raises is never left for dead. The supervisor logs the exception with its traceback, marks the
task down (so `/healthz` fails, naming it), waits a back-off and runs it again; `on_restart` lets a task
catch up on what it missed while it was down (the config watcher reloads once). A task that keeps failing
(`MAX_FAILURES` in a row without running `HEALTHY_AFTER_S` in between), or one whose policy says so, ends the
daemon with a non-zero exit instead, so the DaemonSet restarts it: a live process that does nothing is the
one outcome we rule out. A task that returns has finished its job (a retry that succeeded).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from kubegpu.common.backoff import Backoff

log = logging.getLogger(__name__)

MAX_FAILURES = 5  # in a row, without a healthy run in between: then the daemon exits
HEALTHY_AFTER_S = 60.0  # a task that ran this long before failing starts its count (and back-off) over


def restart_backoff(clock: Callable[[], float] = time.monotonic) -> Backoff:
    """1 s doubling to 30 s, 20% jitter; starts over after a healthy minute."""
    return Backoff(initial=1.0, maximum=30.0, jitter=(0.8, 1.2), reset_after=HEALTHY_AFTER_S, clock=clock)


class OnFailure(enum.Enum):
    RESTART = "restart"  # with back-off; exit after MAX_FAILURES in a row
    EXIT = "exit"  # the daemon's state is no longer known: exit non-zero at once


@dataclass(frozen=True, slots=True)
class TaskDown:
    """A needed task that is not running: what /healthz and the log say about it."""

    name: str
    down_for_s: float
    failures: int  # in a row
    error: str  # the last exception, as `Type: message`
    restart_in_s: float | None  # None: not restarting (the daemon is exiting)

    def describe(self) -> str:
        when = "not restarting" if self.restart_in_s is None else f"restarting in {self.restart_in_s:.0f} s"
        return (
            f"background task {self.name} is down for {self.down_for_s:.0f} s after {self.failures} "
            f"failure(s), last: {self.error}; {when}"
        )


@dataclass(slots=True)
class _State:
    name: str
    needed: bool
    running: bool = True
    failures: int = 0
    restarts: int = 0
    started_at: float = 0.0
    down_since: float | None = None
    restart_at: float | None = None
    error: str = ""


class TaskObserver(Protocol):
    """What the supervisor reports (PluginMetrics implements it)."""

    def task_restarted(self, name: str) -> None: ...


class Supervisor:
    def __init__(
        self,
        on_fatal: Callable[[str, BaseException], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[], Backoff] | None = None,
        observer: TaskObserver | None = None,
        max_failures: int = MAX_FAILURES,
    ) -> None:
        self._on_fatal = on_fatal
        self._clock = clock
        self._backoff = backoff or (lambda: restart_backoff(clock))
        self._observer = observer
        self._max_failures = max_failures
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._states: dict[str, _State] = {}

    def start(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        *,
        on_failure: OnFailure = OnFailure.RESTART,
        on_restart: Callable[[], Awaitable[None]] | None = None,
        needed: bool = True,
    ) -> asyncio.Task[None]:
        """Run `run()` as task `name` until it returns; a task of that name already running is replaced
        (cancelled once the new one has started)."""
        state = _State(name, needed, started_at=self._clock())
        old = self._tasks.get(name)
        task = asyncio.create_task(self._supervise(state, run, on_failure, on_restart), name=name)
        self._tasks[name] = task
        self._states[name] = state
        task.add_done_callback(lambda t: self._forget(name, t))
        if old is not None and not old.done():
            old.cancel()
        return task

    def spawn(self, name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """`start` with the defaults: what components that run their own loops are handed."""
        return self.start(name, run)

    def running(self, name: str) -> bool:
        task = self._tasks.get(name)
        return task is not None and not task.done()

    def down(self) -> list[TaskDown]:
        """Needed tasks that are down now (failed and waiting to restart)."""
        now = self._clock()
        out = []
        for state in self._states.values():
            if state.needed and not state.running and state.down_since is not None:
                restart_in = None if state.restart_at is None else max(0.0, state.restart_at - now)
                down_for = now - state.down_since
                out.append(TaskDown(state.name, down_for, state.failures, state.error, restart_in))
        return sorted(out, key=lambda d: d.name)

    def states(self) -> dict[str, bool]:
        """Every supervised task by name: True while it runs."""
        return {name: state.running for name, state in sorted(self._states.items())}

    async def close(self, timeout_s: float = 2.0) -> None:
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    def _forget(self, name: str, task: asyncio.Task[None]) -> None:
        # A task that ended by failing stays listed as down: the daemon is exiting because of it.
        if self._tasks.get(name) is task and self._states[name].running:
            del self._tasks[name]
            del self._states[name]

    async def _supervise(
        self,
        state: _State,
        run: Callable[[], Awaitable[None]],
        on_failure: OnFailure,
        on_restart: Callable[[], Awaitable[None]] | None,
    ) -> None:
        backoff = self._backoff()
        first = True
        while True:
            state.running, state.down_since, state.restart_at = True, None, None
            state.started_at = self._clock()
            try:
                if not first and on_restart is not None:
                    await on_restart()
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:
                first = False
                now = self._clock()
                if now - state.started_at >= HEALTHY_AFTER_S:
                    state.failures = 0
                state.failures += 1
                state.running, state.down_since = False, now
                state.error = f"{type(err).__name__}: {err}"
                if on_failure is OnFailure.EXIT or state.failures >= self._max_failures:
                    log.critical(
                        "background task %s failed (%s); %s: exiting so that the plugin is restarted",
                        state.name,
                        state.error,
                        "it cannot be restarted safely"
                        if on_failure is OnFailure.EXIT
                        else f"{state.failures} failures in a row",
                        exc_info=err,
                    )
                    self._on_fatal(state.name, err)
                    return
                delay = backoff.next_delay()
                state.restart_at = now + delay
                log.error(
                    "background task %s failed (%s); restarting it in %.1f s (failure %d in a row; at %d "
                    "the plugin exits)",
                    state.name,
                    state.error,
                    delay,
                    state.failures,
                    self._max_failures,
                    exc_info=err,
                )
                await asyncio.sleep(delay)
                state.restarts += 1
                if self._observer is not None:
                    self._observer.task_restarted(state.name)
