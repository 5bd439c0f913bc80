"""The labelling loop: label, write, sleep, repeat; SIGHUP reloads the config, SIGTERM/SIGINT/SIGQUIT stop.

As GFD: the timestamp is taken once per (re)load; `--oneshot` labels once and exits, keeping the file; on
exit otherwise the file is removed, so a stopped labeller leaves no stale labels, except with an
`infinite` interval, whose point is to label once and keep the labels. A labelling error (no NVML, a
malformed driver version, MPS with MIG) ends the process with status 1, as it ends GFD.

Deliberately better than GFD: a failed write (a full disk, a read-only mount) is logged with its cause
and retried at the next interval instead of killing the process, and the previous file stays in place;
and a SIGHUP does not delete the file before the reloaded config rewrites it (GFD's file disappears for a
moment on every reload), unless the reloaded config writes somewhere else.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubegpu.labels.errors import LabelError
from kubegpu.labels.node import label_node
from kubegpu.labels.output import LabelOutput, OutputError, make_output
from kubegpu.labels.resource_labels import Labels
from kubegpu.labels.settings import LabelSettings
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.node.nvml.fake_profile import ProfileError
from kubegpu.settings.goduration import format_go_duration
from kubegpu.settings.nvidia_config import ConfigError

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
HANDLED_SIGNALS = (signal.SIGHUP, *STOP_SIGNALS)


class Waiter(Protocol):
    def wait(self, timeout_s: float | None) -> int | None:
        """The next signal number, or None when `timeout_s` passed first (None: wait forever)."""
        ...


class SignalWaiter:
    """Delivers SIGHUP/SIGINT/SIGTERM/SIGQUIT to the loop through a queue (put() is safe in a handler)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._previous: dict[int, Any] = {}  # handlers to put back: callables, SIG_DFL, SIG_IGN or None

    def install(self) -> SignalWaiter:
        for sig in HANDLED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back; the default is closest
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: object) -> None:
        self._queue.put(signum)

    def wait(self, timeout_s: float | None) -> int | None:
        try:
            return self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None


@dataclass(frozen=True, slots=True)
class _Reload:
    """A run ended by SIGHUP."""


RELOAD = _Reload()
Labeller = Callable[[NvmlBackend, LabelSettings, int | None], Labels]


def _timeout_s(settings: LabelSettings) -> float | None:
    if settings.infinite:
        return None
    return min(settings.sleep_interval / 1e9, threading.TIMEOUT_MAX)


def _run(
    settings: LabelSettings,
    output: LabelOutput,
    waiter: Waiter,
    *,
    load_backend: Callable[[], NvmlBackend],
    labeller: Labeller,
    now: Callable[[], float],
) -> int | _Reload:
    """GFD's run(): label until a signal. Returns an exit status, or RELOAD on SIGHUP."""
    timestamp = None if settings.no_timestamp else int(now())
    try:
        backend = load_backend()
    except ProfileError as err:
        log.error("%s", err)
        return 1
    while True:
        try:
            labels = labeller(backend, settings, timestamp)
        except LabelError as err:
            log.error("error generating labels: %s", err)
            return 1
        if len(labels) <= 1:
            log.warning("No labels generated from any source")
        try:
            output.write(labels)
        except OutputError as err:
            if settings.oneshot:
                log.error("%s", err)
                return 1
            log.error(
                "%s; keeping the previous labels, next attempt in %s",
                err,
                format_go_duration(settings.sleep_interval),
            )
        if settings.oneshot:
            return 0
        log.info("Sleeping for %s", format_go_duration(settings.sleep_interval))
        received = waiter.wait(_timeout_s(settings))
        if received is None:
            continue
        if received == signal.SIGHUP:
            log.info("Received SIGHUP, reloading the config.")
            return RELOAD
        log.info("Received signal %s, shutting down.", signal.Signals(received).name)
        return 0


def serve(
    load_settings: Callable[[], LabelSettings],
    waiter: Waiter,
    *,
    load_backend: Callable[[], NvmlBackend] = load_nvml,
    labeller: Labeller = label_node,
    now: Callable[[], float] = time.time,
) -> int:
    """Label until told to stop; returns the exit status. `load_settings` runs at start and on each SIGHUP."""
    kept: tuple[LabelSettings, LabelOutput] | None = None  # the file a reload took over from the last run
    while True:
        try:
            settings = load_settings()
        except ConfigError as err:
            log.error("unable to load config: %s", err)
            if kept is not None and kept[0].removes_output_on_exit:
                kept[1].remove()
            return 1
        for warning in settings.warnings:
            log.warning("%s", warning)
        log.info("Running with config:\n%s", settings.describe())
        output = make_output(settings.output_file)
        if kept is not None and kept[1] != output and kept[0].removes_output_on_exit:
            kept[1].remove()  # the reloaded config writes elsewhere: the old file would go stale
        result = _run(settings, output, waiter, load_backend=load_backend, labeller=labeller, now=now)
        if isinstance(result, _Reload):
            kept = (settings, output)
            continue
        if settings.removes_output_on_exit:
            output.remove()
        return result
