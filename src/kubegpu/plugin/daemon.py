"""The `kubegpu plugin` daemon: discovery, servers, registrar and health monitor on one asyncio loop.

Lifecycle (architecture.md §4): settings are already validated when we get here. Discover (in a thread: NVML
blocks), build resources, serve and register them, then apply health changes until a signal says stop
(SIGTERM/SIGINT/SIGQUIT) or reload (SIGHUP or a changed config file).

Every change of what is served (start, reload, rediscovery, MPS retry) goes the same way:
1. prepare a `Candidate` without touching anything: the settings (parsed in a thread, within a time
   budget), discovery, the GPUs it lost carried over, the Allocate options, the resources, the CDI specs;
2. write the CDI specs, all or nothing;
3. plan (reconcile.py) against what the servers serve now, and apply the plan (serving.py for the servers,
   health_watch.py for the health monitor).
Step 1 and 2 live in prepare.py; the HTTP side (metrics, telemetry, /healthz) in endpoints.py.
A failure in 1 or 2 keeps the old config serving with the health monitor untouched, says why and counts it
(kubegpu_config_reloads_total); a failure in 3 is a bug that leaves the state unknown, so the daemon exits
non-zero and the DaemonSet restarts it.

Health: one `FaultBook` lives as long as the daemon; monitors write to it, and the served snapshot is always
the discovered one with the book's faults on top, so no reload, server restart or monitor restart can make a
broken GPU look healthy. Background tasks run under a `Supervisor` (supervise.py): restarted with back-off,
or the daemon exits; `/healthz` fails while one is down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.node.faults import FaultBook
from kubegpu.node.health import HealthSettings
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.node.xids import XidAction, XidCatalogError
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.plugin.coexist import DraAnnouncer
from kubegpu.plugin.config_diff import config_changes
from kubegpu.plugin.endpoints import Endpoints
from kubegpu.plugin.filewatch import Identity, file_identity, watch_file
from kubegpu.plugin.health_watch import HealthWatch
from kubegpu.plugin.prepare import (
    CONFIG_LOAD_BUDGET_S,
    MISSING,
    Candidate,
    Current,
    Preparer,
    ReloadError,
    SettingsLoader,
    StartupError,
    write_cdi,
)
from kubegpu.plugin.reconcile import (
    Plan,
)
from kubegpu.plugin.registrar import KubeletId, Registrar, Registration
from kubegpu.plugin.serving import Serving
from kubegpu.plugin.supervise import Supervisor
from kubegpu.settings.choices import DEFAULT_KUBELET_SOCKET
from kubegpu.settings.plugin import PluginSettings

log = logging.getLogger(__name__)

NO_DEVICES = "No devices found. Waiting indefinitely."


class Daemon:
    def __init__(
        self,
        settings: PluginSettings,
        *,
        reload_settings: Callable[[], PluginSettings] | None = None,
        backend: NvmlBackend | None = None,
        config_load_budget_s: float = CONFIG_LOAD_BUDGET_S,
        restart_backoff: Callable[[], Backoff] | None = None,
        config_identity: Identity = None,
        health_settings: HealthSettings | None = None,
    ) -> None:
        self.settings = settings
        # What the config file was when `settings` were read from it (taken here if the caller did not).
        if config_identity is None and settings.config_file:
            config_identity = file_identity(Path(settings.config_file))
        self._config_identity = config_identity
        self._settings_loader = (
            SettingsLoader(reload_settings, config_load_budget_s) if reload_settings is not None else None
        )
        try:
            self._backend = backend or load_nvml(settings.env.nvml)
        except ValueError as err:  # KUBEGPU_FAKE_NVML names an unknown or broken profile
            raise StartupError(str(err)) from err
        kubelet = settings.kubelet_socket
        self.plugin_dir = Path(
            os.path.dirname(kubelet) if kubelet else os.path.dirname(DEFAULT_KUBELET_SOCKET)
        )
        self.started_at = time.monotonic()
        self._discovered = False  # the first discovery has finished (GPUs found or not)
        self.endpoints = Endpoints(
            settings,
            self,
            lambda: self.supervisor.states(),
            lambda: self.nvml,
            lambda: self.inventory,
            self.plugin_dir,
        )
        self.metrics = self.endpoints.metrics
        self.supervisor = Supervisor(self._fatal, observer=self.metrics, backoff=restart_backoff)
        self.endpoints.serve(self.supervisor)
        self.registrar = Registrar(
            self.plugin_dir,
            Path(kubelet) if kubelet else None,
            on_registered=self.metrics.registered,
            spawn=self.supervisor.spawn,
        )
        try:  # already read by validated_plugin_settings when the command starts the daemon
            self.health_settings = health_settings or HealthSettings.from_settings(settings.env)
        except XidCatalogError as err:
            raise StartupError(str(err)) from err
        self._cdi = CdiSpecWriter(settings.env.cdi_root)
        self.faults = FaultBook()  # outlives every monitor, reload and server
        self._preparer = Preparer(self._backend)
        self.serving = Serving(self.faults, self.registrar, self.metrics, self.plugin_dir)
        self.health_watch = HealthWatch(
            lambda: self.nvml, self.health_settings, self.faults, self.metrics, self.supervisor
        )
        self._dra_announcer = DraAnnouncer()
        self._reconcile_lock = asyncio.Lock()  # one prepare+apply at a time
        self._want_config = False  # what the next reconcile pass must do (requests are coalesced)
        self._want_discovery = False
        self._want_pass = False
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._oneshots: set[asyncio.Task[Any]] = set()

    @property
    def nvml(self) -> Any:
        return self._backend.nvml

    @property
    def inventory(self) -> Inventory:
        """The snapshot served now: the discovered GPUs with the fault book's faults on top."""
        return self.serving.inventory

    @property
    def _base(self) -> Inventory:
        return self.serving.base

    # --- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
        for sig in stop_signals:
            loop.add_signal_handler(sig, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))
        log.info("Running with config:\n%s", self.settings.log_json())
        log.info("Running with settings:\n%s", self.settings.log_settings())
        for warning in self.settings.warnings:
            log.warning("%s", warning)
        if not self.settings.kubelet_socket:
            log.info("Skipping registration with Kubelet")
        if not self.health_watch.checks_enabled:
            log.info("health checks disabled by DP_DISABLE_HEALTHCHECKS; GPUs stay Healthy")
        try:
            await self.registrar.start()
            await self.endpoints.start()
            await self._start_devices()
            self.endpoints.start_telemetry(self.supervisor)
            self.supervisor.start("health-reports", self._apply_health_reports)
            if self.settings.config_file:
                # A changed config file (config-manager symlink swap, ConfigMap update) reloads like SIGHUP;
                # a watcher that had to be restarted reloads once, for what it may have missed meanwhile.
                self.supervisor.start("config-watch", self._watch_config, on_restart=self.reload)
            await self._stopping.wait()
        finally:
            for sig in (*stop_signals, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            await self.shutdown()
        return self._exit_code

    def stop(self) -> None:
        self._stopping.set()

    def _fatal(self, what: str, err: BaseException) -> None:
        """Crash-only: the daemon cannot go on safely; exit non-zero so the DaemonSet restarts it."""
        self._exit_code = 1
        self._stopping.set()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A one-shot task (a reload asked for by a signal); its errors are handled inside."""
        task = asyncio.create_task(coro)
        self._oneshots.add(task)
        task.add_done_callback(self._oneshots.discard)

    async def shutdown(self) -> None:
        await self.endpoints.close()
        for task in list(self._oneshots):
            task.cancel()
        await self.supervisor.close()  # the health monitor's task stops its thread on the way out
        await self.registrar.close()  # stops servers and removes our sockets
        await asyncio.to_thread(self._cdi.remove)
        await self._preparer.shutdown()
        log.info("stopped; sockets removed")

    async def _start_devices(self) -> None:
        """Discover and serve. Without devices, keep retrying in the background (failOnInitError=false)."""
        async with self._reconcile_lock:  # a SIGHUP this early waits for the start to finish
            try:
                candidate = await self._prepare(self.settings, rediscover=True)
                await write_cdi(self._cdi, candidate.specs)
            except ReloadError as err:
                raise StartupError(str(err)) from err
            finally:
                self._discovered = True
            await self._apply(candidate)

    # --- what the health endpoints and metrics read ------------------------------------------------

    def expected_resources(self) -> Sequence[str] | None:
        if not self._discovered:
            return None
        if self.registrar.kubelet_socket is None:
            return ()  # registration switched off: nothing to check
        return [s.name for s in self.registrar.servers]

    def registration(self, resource: str) -> Registration | None:
        return self.registrar.registration(resource)

    def current_kubelet(self) -> KubeletId | None:
        return self.registrar.current_kubelet()

    # --- reconcile: prepare, then apply --------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read the config (SIGHUP, config file change) and rediscover."""
        if self._settings_loader is None:
            return
        await self._reconcile(load_config=True, rediscover=True)

    async def _reconcile(self, *, load_config: bool = False, rediscover: bool = True) -> None:
        """One prepare+apply pass at a time. Requests made while a pass runs are answered together by one
        more pass afterwards (which sees the latest config file and devices); each caller returns once a
        pass that started after its request has ended."""
        self._want_config |= load_config
        self._want_discovery |= rediscover
        self._want_pass = True
        async with self._reconcile_lock:
            while self._want_pass:
                load, discover_again = self._want_config, self._want_discovery
                self._want_pass = self._want_config = self._want_discovery = False
                await self._reconcile_once(load_config=load, rediscover=discover_again)

    async def _reconcile_once(self, *, load_config: bool, rediscover: bool) -> None:
        what = "config reload" if load_config else "rediscovery" if rediscover else "refresh"
        try:
            settings = (
                await self._settings_loader.load() if self._settings_loader and load_config else self.settings
            )
            candidate = await self._prepare(settings, rediscover=rediscover)
            await write_cdi(self._cdi, candidate.specs)
        except ReloadError as err:
            log.error("%s failed, keeping the last good config running: %s", what, err)
            if load_config:
                self.metrics.config_reload(err.reason)
            return
        except Exception:  # a bug, found before anything changed: the old config keeps serving
            log.exception("%s failed unexpectedly, keeping the last good config running", what)
            if load_config:
                self.metrics.config_reload("error")
            return
        previous = self.settings  # what a reload's line compares (the apply replaces it)
        try:
            applied = await self._apply(candidate)
        except Exception as err:
            log.critical("applying the %s failed part-way; exiting to be restarted", what, exc_info=True)
            self._fatal(what, err)
            return
        if load_config:
            self.metrics.config_reload(None)
            # One line: what changed in the config and what that changed in what is served.
            changed = config_changes(previous.log_json(), settings.log_json())
            log.info("reload complete: %s; served: %s", changed, applied.summary())

    async def _prepare(self, settings: PluginSettings, *, rediscover: bool) -> Candidate:
        serving = self.serving
        current = Current(serving.base, serving.missing, serving.to_dra)
        return await self._preparer.prepare(settings, current, rediscover=rediscover)

    async def _apply(self, candidate: Candidate) -> Plan:
        """Make the candidate what is served: state, health monitor, servers. Raises only on a bug."""
        for uuid, gpu in candidate.missing.items():
            if uuid not in self.faults:
                reason = candidate.missing_reasons.get(uuid, MISSING)
                self.faults.record(uuid, XidAction.RESET_GPU, reason, None, time.monotonic())
                log.warning(
                    "GPU %d (%s) %s: it stays listed as Unhealthy, under the same IDs, until it recovers",
                    gpu.index,
                    uuid,
                    reason,
                )
        serving = self.serving
        if candidate.rediscovered:
            self._dra_announcer.rediscovered(
                candidate.to_dra, candidate.base.gpus, candidate.settings.dra_gpus
            )
        async with serving.lock:
            self.settings = candidate.settings
            serving.take(candidate)
            applied = serving.plan(serving.build_served(), self.health_watch.watched)
            # Arm health events before the kubelet can see new devices, so no early XID slips through.
            await self.health_watch.apply(applied, serving.base)
            await serving.apply_servers(applied)
        gpus = serving.base.gpus
        if candidate.rediscovered and gpus:
            log.info(
                "discovered %d GPU(s) (driver %s, CUDA %s); serving %s",
                len(gpus),
                serving.base.driver_version or "?",
                serving.base.cuda_driver_version or "?",
                ", ".join(f"{r.name}={len(r.devices)}" for r in applied.serving) or "nothing",
            )
        # Every GPU given to DRA is not "no devices": nothing to serve and nothing to retry.
        if not gpus and not serving.to_dra and not self.supervisor.running("discovery-retry"):
            log.warning("%s", NO_DEVICES)
            self.supervisor.start("discovery-retry", self._retry_discovery)
        if serving.withheld and not self.supervisor.running("mps-retry"):
            self.supervisor.start("mps-retry", self._retry_mps)
        return applied

    async def _retry_discovery(self) -> None:
        while not self._base.gpus:
            await asyncio.sleep(self.settings.env.discovery_retry_s)
            await self._reconcile(rediscover=True)
        log.info("found %d GPU(s) on retry", len(self._base.gpus))

    async def _retry_mps(self) -> None:
        while self.serving.withheld:
            await asyncio.sleep(self.settings.env.mps_retry_s)
            await self._reconcile(rediscover=False)

    async def _watch_config(self) -> None:
        path = Path(self.settings.config_file)
        await watch_file(path, self._config_changed, since=self._config_identity)

    async def _config_changed(self) -> None:
        # A restarted watcher starts from here, not from the file as it was at start.
        self._config_identity = file_identity(Path(self.settings.config_file))
        log.info("config file %s changed; reloading", self.settings.config_file)
        await self.reload()

    # --- health --------------------------------------------------------------------------------------

    async def _apply_health_reports(self) -> None:
        """Serve each change of the fault book; a restarted task first catches up with all of it."""
        while True:
            self.health_watch.changed.clear()
            await self._sync_health()
            await self.health_watch.changed.wait()

    async def _sync_health(self) -> None:
        serving = self.serving
        async with serving.lock:
            if not serving.faults_changed():
                return
            applied = serving.plan(serving.build_served(), self.health_watch.watched)
            await serving.apply_servers(applied, updates_only=True)
        back = [u for u in serving.missing if u not in self.faults]
        if back:
            names = ", ".join(f"{serving.missing[u].index} ({u})" for u in back)
            log.info("GPU %s recovered after it was lost: rediscovering it", names)
            self._spawn(self._reconcile(rediscover=True))
