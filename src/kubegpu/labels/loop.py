"""The labelling loop: label, write, sleep, repeat; SIGHUP reloads the config, SIGTERM/SIGINT/SIGQUIT stop.

As GFD: the labels go to the node's NodeFeature object (`nodefeature.py`), or with
--use-node-feature-api=false to the features.d file or stdout (`output.py`); the timestamp is taken once
per (re)load; `--oneshot` labels once and exits, keeping the file or object; on exit otherwise the file is
removed, so a stopped labeller leaves no stale labels, except with an `infinite` interval, whose point is
to label once and keep the labels (the NodeFeature object always stays). A labelling error (no NVML, a
malformed driver version, MPS with MIG) ends the process with status 1, as it ends GFD, and so does an
output that cannot work (no NodeFeature CRD, no permission: a fatal OutputError).

Deliberately better than GFD, which exits on any output error: a failed file write (a full disk, a
read-only mount) is logged with its cause and retried at the next interval, and the previous file stays in
place; an API server that cannot be reached or answers 429/5xx is retried with back-off (`retry_backoff`)
until it answers, up to `ONESHOT_ATTEMPTS` times with --oneshot; and a SIGHUP does not delete the file
before the reloaded config rewrites it (GFD's file disappears for a moment on every reload), unless the
reloaded config writes somewhere else.
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

from kubegpu.common.backoff import Backoff
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
OutputFactory = Callable[[LabelSettings], LabelOutput]
BackoffFactory = Callable[[LabelSettings], Backoff]

# With --oneshot, attempts at an output that fails transiently before giving up (about 15 s with back-off):
# a oneshot run is expected to end.
ONESHOT_ATTEMPTS = 5
MAX_RETRY_S = 30.0


def open_output(settings: LabelSettings) -> LabelOutput:
    """GFD's NewOutputer: the node's NodeFeature object (the default), else the file or stdout.

    Raises a fatal OutputError when the NodeFeature output cannot be set up (no node name, no client
    configuration)."""
    if settings.use_node_feature_api:
        # imported here: `kubernetes` takes a while to import, and the file output does not need it
        from kubegpu.labels.nodefeature import open_node_feature_output

        return open_node_feature_output(settings.api)
    return make_output(settings.output_file)


def retry_backoff(settings: LabelSettings) -> Backoff:
    """The waits after transient output failures: 1 s doubling to 30 s, never longer than the interval,
    each up to 25% longer, so a fleet that lost the API server together does not come back in step."""
    cap = MAX_RETRY_S if settings.infinite else min(MAX_RETRY_S, settings.sleep_interval / 1e9)
    return Backoff(initial=min(1.0, cap), maximum=cap, jitter=(1.0, 1.25))


def _timeout_s(settings: LabelSettings) -> float | None:
    if settings.infinite:
        return None
    return min(settings.sleep_interval / 1e9, threading.TIMEOUT_MAX)


def _seconds_text(seconds: float) -> str:
    return format_go_duration(round(seconds * 1000) * 1_000_000)


def _on_signal(received: int) -> int | _Reload:
    if received == signal.SIGHUP:
        log.info("Received SIGHUP, reloading the config.")
        return RELOAD
    log.info("Received signal %s, shutting down.", signal.Signals(received).name)
    return 0


def _run(
    settings: LabelSettings,
    output: LabelOutput,
    waiter: Waiter,
    *,
    load_backend: Callable[[], NvmlBackend],
    labeller: Labeller,
    now: Callable[[], float],
    backoff: Backoff,
) -> int | _Reload:
    """GFD's run(): label until a signal. Returns an exit status, or RELOAD on SIGHUP."""
    timestamp = None if settings.no_timestamp else int(now())
    try:
        backend = load_backend()
    except ProfileError as err:
        log.error("%s", err)
        return 1
    failures = 0  # transient output failures in a row
    while True:
        try:
            labels = labeller(backend, settings, timestamp)
        except LabelError as err:
            log.error("error generating labels: %s", err)
            return 1
        if len(labels) <= 1:
            log.warning("No labels generated from any source")
        timeout = _timeout_s(settings)
        try:
            output.write(labels)
        except OutputError as err:
            if err.fatal:
                log.error("%s", err)
                return 1
            if err.transient:
                failures += 1
                if settings.oneshot and failures >= ONESHOT_ATTEMPTS:
                    log.error("%s; giving up after %d attempts", err, failures)
                    return 1
                timeout = backoff.next_delay()
                log.error("%s; next attempt in %s", err, _seconds_text(timeout))
            elif settings.oneshot:
                log.error("%s", err)
                return 1
            else:
                log.error(
                    "%s; keeping the previous labels, next attempt in %s",
                    err,
                    format_go_duration(settings.sleep_interval),
                )
        else:
            if failures:
                log.info("Labels published after %d failed attempts", failures)
            failures = 0
            backoff.reset()
            if settings.oneshot:
                return 0
            log.info("Sleeping for %s", format_go_duration(settings.sleep_interval))
        received = waiter.wait(timeout)
        if received is not None:
            return _on_signal(received)


def _load(
    load_settings: Callable[[], LabelSettings], output_factory: OutputFactory
) -> tuple[LabelSettings, LabelOutput] | None:
    """The settings and their output, or None (logged) when either cannot be had."""
    try:
        settings = load_settings()
    except ConfigError as err:
        log.error("unable to load config: %s", err)
        return None
    for warning in settings.warnings:
        log.warning("%s", warning)
    log.info("Running with config:\n%s", settings.describe())
    try:
        return settings, output_factory(settings)
    except OutputError as err:  # the NodeFeature output cannot be set up
        log.error("%s", err)
        return None


def serve(
    load_settings: Callable[[], LabelSettings],
    waiter: Waiter,
    *,
    load_backend: Callable[[], NvmlBackend] = load_nvml,
    labeller: Labeller = label_node,
    now: Callable[[], float] = time.time,
    output_factory: OutputFactory = open_output,
    backoff_factory: BackoffFactory = retry_backoff,
) -> int:
    """Label until told to stop; returns the exit status. `load_settings` runs at start and on each SIGHUP."""
    kept: tuple[LabelSettings, LabelOutput] | None = None  # the file a reload took over from the last run
    while True:
        loaded = _load(load_settings, output_factory)
        if loaded is None:
            if kept is not None and kept[0].removes_output_on_exit:
                kept[1].remove()
            return 1
        settings, output = loaded
        if kept is not None and kept[1] != output and kept[0].removes_output_on_exit:
            kept[1].remove()  # the reloaded config writes elsewhere: the old file would go stale
        result = _run(
            settings,
            output,
            waiter,
            load_backend=load_backend,
            labeller=labeller,
            now=now,
            backoff=backoff_factory(settings),
        )
        if isinstance(result, _Reload):
            kept = (settings, output)
            continue
        if settings.removes_output_on_exit:
            output.remove()
        return result
