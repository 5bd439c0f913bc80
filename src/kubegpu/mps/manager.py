"""`kubegpu mps-daemon run`: start the MPS control daemons this node's config asks for, keep them, stop them.

Lifecycle (NVIDIA's mps-control-daemon): load the config with the plugin's own precedence and validation,
discover the GPUs, build the same resources the plugin builds, and start one daemon per resource shared
with MPS. When every daemon runs, `<root>/.ready` is written; a daemon that fails to start makes the
manager stop everything and try again after 30 s. SIGHUP restarts with a re-read config, SIGTERM, SIGINT
and SIGQUIT stop: `.ready` goes first, so the plugin stops trusting the daemons before they quit.

Beyond NVIDIA: a config or node that cannot run on SIGHUP or on a retry keeps the daemons already running
(logged with the reason) instead of exiting; the first start still exits 1 on such an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from kubegpu.allocation.resources import ResourceError, build_resources
from kubegpu.mps.daemon import ControlDaemon, DaemonOptions, Labeler, set_selinux_label
from kubegpu.mps.plan import DaemonPlan, MpsConfigError, describe, plan_daemons
from kubegpu.node.mps_control import MpsCommandError
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.nvidia_sharing import SharingStrategy
from kubegpu.settings.plugin import PluginSettings

log = logging.getLogger(__name__)

DEFAULT_RETRY_S = 30.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class StartupError(RuntimeError):
    """The daemons cannot be planned on this node with this config; the message says why and what to do."""


def ready_content(block: SharingStrategy | None) -> str:
    """What `.ready` holds: the `sharing.mps` block the daemons run with, in the config file's JSON keys.

    NVIDIA's daemon also records its MPS block there, so a plugin can notice daemons that were started
    from another config than its own.
    """
    if block is None:
        return "{}\n"
    data: dict[str, Any] = {}
    if block.renameByDefault:
        data["renameByDefault"] = True
    if block.failRequestsGreaterThanOne is not None:
        data["failRequestsGreaterThanOne"] = block.failRequestsGreaterThanOne
    resources = []
    for r in block.resources or ():
        entry: dict[str, Any] = {"name": r.name}
        if r.rename:
            entry["rename"] = r.rename
        entry["devices"] = r.devices.describe()
        entry["replicas"] = r.replicas
        resources.append(entry)
    data["resources"] = resources
    return json.dumps(data, separators=(",", ":")) + "\n"


def discover_plans(settings: PluginSettings, backend: NvmlBackend | None = None) -> list[DaemonPlan]:
    """The daemons this node needs: the plugin's own discovery and resources, then NVIDIA's limits.

    Raises StartupError (NVML, resources or replica limits).
    """
    kind, _ = settings.sharing_strategy()
    if kind != "mps":
        log.info("Sharing strategy is not MPS (%s); no MPS daemon to run", kind)
        return []
    from kubegpu.allocation.from_settings import resource_options  # the plugin's, so names and devices match
    from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session

    try:
        backend = backend or load_nvml(settings.env.nvml)
        with nvml_session(backend.nvml):
            inventory = discover(backend)
    except pynvml.NVMLError as err:
        raise StartupError(f"nvml init failed: {err}. {explain_nvml_error(err)}") from err
    except ValueError as err:  # an unknown or broken fake profile
        raise StartupError(str(err)) from err
    try:
        return plan_daemons(build_resources(inventory, resource_options(settings)), inventory)
    except MpsConfigError as err:
        raise StartupError(f"error getting daemons: {err} ({err.hint})" if err.hint else str(err)) from err
    except ResourceError as err:
        raise StartupError(f"error getting daemons: {err}") from err


@dataclass
class Manager:
    """The daemons of one config. `start` brings them all up or reports failure; `stop` undoes it."""

    plans: list[DaemonPlan]
    options: DaemonOptions = field(default_factory=DaemonOptions)
    mps_block: SharingStrategy | None = None
    labeler: Labeler = set_selinux_label
    daemons: list[ControlDaemon] = field(default_factory=list)

    def start(self) -> bool:
        """Start every daemon, then write `.ready`. False when one failed (the caller retries later)."""
        if not self.plans:
            log.info("No devices are configured for MPS sharing; Waiting indefinitely.")
        self.daemons = [ControlDaemon(p, self.options, self.labeler) for p in self.plans]
        for daemon in self.daemons:
            try:
                daemon.start()
            except (MpsCommandError, OSError) as err:
                log.error("Failed to start MPS daemon for %s: %s", daemon.resource, err)
                return False
        ready = self.options.root.ready_file
        try:
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.write_text(ready_content(self.mps_block))
        except OSError as err:
            log.error("failed to create .ready file %s: %s", ready, err)
            return False
        log.info("MPS daemons ready: %s", ready)
        return True

    def stop(self) -> list[str]:
        """Remove `.ready` first, then stop every daemon. Returns the errors."""
        try:
            self.options.root.ready_file.unlink()
        except FileNotFoundError:
            log.warning("Failed to remove .ready file: %s does not exist", self.options.root.ready_file)
        log.info("Stopping MPS daemons.")
        errors = [e for d in self.daemons for e in d.stop()]
        self.daemons = []
        return errors


def prepare(
    settings: PluginSettings,
    options: DaemonOptions,
    backend: NvmlBackend | None = None,
    labeler: Labeler = set_selinux_label,
) -> Manager:
    """Log the config and plan the daemons. Raises StartupError."""
    log.info("Running with config:\n%s", settings.log_json())
    for warning in settings.warnings:
        log.warning("%s", warning)
    plans = discover_plans(settings, backend)
    log.info("MPS daemons to run:\n%s", describe(plans))
    _, block = settings.sharing_strategy()
    return Manager(plans, options, block if plans else None, labeler)


@dataclass(frozen=True)
class RunOptions:
    daemon: DaemonOptions = field(default_factory=DaemonOptions)
    retry_s: float = DEFAULT_RETRY_S


async def serve(load_settings: Callable[[], PluginSettings], options: RunOptions) -> int:
    """Run until a stop signal. Raises ConfigError or StartupError when the first start cannot run."""
    loop = asyncio.get_running_loop()
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    for sig in (signal.SIGHUP, *STOP_SIGNALS):
        loop.add_signal_handler(sig, signals.put_nowait, sig)

    def plan() -> Manager:
        # NVML is opened afresh on every (re)start, as NVIDIA does: a driver reload in between is seen.
        return prepare(load_settings(), options.daemon)

    try:
        supervisor = _Supervisor(await asyncio.to_thread(plan), plan, signals, options.retry_s)
        try:
            await supervisor.run()
        finally:
            # Whatever ended the loop (a stop signal or a bug), leave no daemon and no exclusive GPU behind.
            errors = await asyncio.to_thread(supervisor.manager.stop)
    finally:
        for sig in (signal.SIGHUP, *STOP_SIGNALS):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
    _log_errors(errors)
    return 1 if errors else 0


@dataclass
class _Supervisor:
    """Start, then restart on SIGHUP or after a failed start, until a stop signal."""

    manager: Manager
    plan: Callable[[], Manager]
    signals: asyncio.Queue[signal.Signals]
    retry_s: float

    async def run(self) -> None:
        started = await asyncio.to_thread(self.manager.start)
        while True:
            if not started:
                log.info("Failed to start one or more MPS daemons. Retrying in %gs...", self.retry_s)
            try:
                sig = await asyncio.wait_for(self.signals.get(), None if started else self.retry_s)
            except TimeoutError:
                sig = None
            if sig in STOP_SIGNALS:
                log.info('Received signal "%s", shutting down.', signal.Signals(sig).name)
                return
            log.info("Received SIGHUP, restarting." if sig else "Restarting the MPS daemons.")
            try:
                new = await asyncio.to_thread(self.plan)
            except (ConfigError, StartupError) as err:
                log.error("cannot restart with the current config, keeping the last good one: %s", err)
                if started:
                    continue  # the running daemons are still good: leave them alone
                old = self.manager
                new = Manager(old.plans, old.options, old.mps_block, old.labeler)
            _log_errors(await asyncio.to_thread(self.manager.stop))
            self.manager = new
            started = await asyncio.to_thread(self.manager.start)


def _log_errors(errors: list[str]) -> None:
    for error in errors:
        log.error("error stopping daemons: %s", error)
