"""The `kubegpu plugin` daemon: discovery, servers, registrar and health monitor on one asyncio loop.

Lifecycle (architecture.md §4): settings are already validated when we get here. Discover (in a thread: NVML
blocks), build resources, serve and register them, then apply health changes until a signal says stop
(SIGTERM/SIGINT/SIGQUIT) or reload (SIGHUP or a changed config file).

Every change of what is served (start, reload, rediscovery, MPS retry) goes the same way:
1. prepare a `Candidate` without touching anything: the settings (parsed in a thread, within a time
   budget), discovery, the GPUs it lost carried over, the Allocate options, the resources, the CDI specs;
2. write the CDI specs, all or nothing;
3. plan (reconcile.py) against what the servers serve now, and apply the plan.
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
import contextlib
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.cdi import specs_for
from kubegpu.allocation.from_settings import allocate_options, resource_options
from kubegpu.allocation.resources import Resource, ResourceError, ResourceOptions, build_resources
from kubegpu.common.backoff import Backoff
from kubegpu.node.discovery import discover, explain_nvml_error
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.node.faults import FaultBook
from kubegpu.node.health import HealthEvent, HealthMonitor, HealthSettings
from kubegpu.node.inventory import Gpu, GpuLink, Inventory
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.node.xids import XidAction, XidCatalogError
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.plugin.coexist import describe, leave_to_dra
from kubegpu.plugin.config_diff import config_changes
from kubegpu.plugin.events import DaemonEvents, NoMetrics
from kubegpu.plugin.filewatch import Identity, file_identity, watch_file
from kubegpu.plugin.prepare import (
    CONFIG_LOAD_BUDGET_S,
    MISSING,
    Candidate,
    ReloadError,
    in_daemon_thread,
    missing_health,
    mps_not_ready,
    why_missing,
    write_cdi,
)
from kubegpu.plugin.reconcile import (
    MonitorStep,
    Plan,
    Served,
    Step,
    carry_missing,
    plan,
    with_faults,
)
from kubegpu.plugin.registrar import KubeletId, Registrar, Registration
from kubegpu.plugin.server import ResourceServer
from kubegpu.plugin.supervise import Supervisor
from kubegpu.settings.choices import DEFAULT_KUBELET_SOCKET
from kubegpu.settings.dra_selection import GpuSelection
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings

if TYPE_CHECKING:
    from kubegpu.plugin.http_endpoint import HttpServer
    from kubegpu.plugin.telemetry import Telemetry

log = logging.getLogger(__name__)

NO_DEVICES = "No devices found. Waiting indefinitely."
MONITOR_TASK = "nvml-health"


class StartupError(RuntimeError):
    """The daemon cannot start; the message names the cause and the fix. Exit code 1."""


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
        self._reload_settings = reload_settings
        self._config_load_budget_s = config_load_budget_s
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
        self.metrics: DaemonEvents = NoMetrics()
        self.telemetry: Telemetry | None = None  # GPU telemetry for /metrics (telemetry.py)
        served_metrics = None
        if settings.http_port:  # prometheus-client only when /metrics is served (events.py says why)
            from kubegpu.plugin.metrics import PluginMetrics
            from kubegpu.plugin.podresources_client import PodResourcesClient

            pod_resources = settings.pod_resources_socket
            self.metrics = served_metrics = PluginMetrics(
                status=self,
                pod_resources=PodResourcesClient(pod_resources) if pod_resources else None,
                tasks=lambda: self.supervisor.states(),
            )
            from kubegpu.plugin.telemetry_metrics import install_telemetry

            self.telemetry = install_telemetry(
                served_metrics, settings, lambda: self.nvml, lambda: self.inventory, self.plugin_dir
            )
        self.supervisor = Supervisor(self._fatal, observer=self.metrics, backoff=restart_backoff)
        self.registrar = Registrar(
            self.plugin_dir,
            Path(kubelet) if kubelet else None,
            on_registered=self.metrics.registered,
            spawn=self.supervisor.spawn,
        )
        self.http: HttpServer | None = None
        if served_metrics is not None:
            from kubegpu.plugin.http_endpoint import HttpServer

            self.http = HttpServer(
                self,
                served_metrics,
                port=settings.http_port,
                host=settings.http_address or None,
                grace_s=settings.health_grace_s,
                tasks_down=self.supervisor.down,
                spawn=self.supervisor.spawn,
            )
        try:  # already read by validated_plugin_settings when the command starts the daemon
            self.health_settings = health_settings or HealthSettings.from_settings(settings.env)
        except XidCatalogError as err:
            raise StartupError(str(err)) from err
        self._nvml_up = False
        self._cdi = CdiSpecWriter(settings.env.cdi_root)
        # The state every apply replaces whole, under _apply_lock.
        self.faults = FaultBook()  # outlives every monitor, reload and server
        self._base = Inventory()  # discovered + carried GPUs, without faults
        self.inventory = Inventory()  # as served: _base with the faults on top
        self._missing: dict[str, Gpu] = {}
        self._to_dra: tuple[Gpu, ...] = ()
        self._said_to_dra: tuple[tuple[str, ...], GpuSelection] | None = None  # last logged
        self._resource_options = ResourceOptions()
        self._allocate_options = AllocateOptions()
        self._withheld: frozenset[str] = frozenset()
        self._watched: frozenset[str] | None = None  # the GPUs the health monitor task watches
        self._monitor_task: asyncio.Task[None] | None = None
        self._apply_lock = asyncio.Lock()  # an apply and a health update never interleave
        self._reconcile_lock = asyncio.Lock()  # one prepare+apply at a time
        self._want_config = False  # what the next reconcile pass must do (requests are coalesced)
        self._want_discovery = False
        self._want_pass = False
        self._parsing: asyncio.Future[PluginSettings] | None = None
        self._health_changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._oneshots: set[asyncio.Task[Any]] = set()

    @property
    def nvml(self) -> Any:
        return self._backend.nvml

    @property
    def _checks_enabled(self) -> bool:
        return self.health_settings.classifier.policy.checks_enabled

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
        if not self._checks_enabled:
            log.info("health checks disabled by DP_DISABLE_HEALTHCHECKS; GPUs stay Healthy")
        try:
            await self.registrar.start()
            await self._start_http()
            await self._start_devices()
            if self.telemetry is not None:
                self.supervisor.start("gpu-telemetry", self.telemetry.run)
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

    async def _start_http(self) -> None:
        if self.http is None:
            return
        try:
            await self.http.start()
        except OSError as err:  # the port is taken, the address does not resolve or is not ours
            where = f"{self.settings.http_address or '*'}:{self.settings.http_port}"
            if isinstance(err, socket.gaierror) or not err.errno:
                cause = err.strerror or str(err)
            else:  # asyncio words bind errors its own way; the errno's text is the one users search for
                cause = os.strerror(err.errno)
            raise StartupError(
                f"cannot serve the HTTP endpoint on {where}: {cause}; choose a free "
                "--http-port (KUBEGPU_HTTP_PORT) and an address of this node for --http-address "
                "(KUBEGPU_HTTP_ADDRESS)"
            ) from err
        log.info("serving /healthz, /readyz and /metrics on port %d", self.http.port)

    async def shutdown(self) -> None:
        if self.http is not None:
            await self.http.close()
        for task in list(self._oneshots):
            task.cancel()
        await self.supervisor.close()  # the health monitor's task stops its thread on the way out
        await self.registrar.close()  # stops servers and removes our sockets
        await asyncio.to_thread(self._cdi.remove)
        if self._nvml_up:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.nvml.nvmlShutdown)
            self._nvml_up = False
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

    def _links(self) -> Mapping[tuple[int, int], GpuLink]:
        return self.inventory.link_map()

    # --- reconcile: prepare, then apply --------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read the config (SIGHUP, config file change) and rediscover."""
        if self._reload_settings is None:
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
            settings = await self._load_settings() if load_config else self.settings
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
        previous = self.settings.log_json() if load_config else ""  # what the reload line compares
        try:
            applied = await self._apply(candidate)
        except Exception as err:
            log.critical("applying the %s failed part-way; exiting to be restarted", what, exc_info=True)
            self._fatal(what, err)
            return
        if load_config:
            self.metrics.config_reload(None)
            # One line: what changed in the config and what that changed in what is served.
            changed = config_changes(previous, settings.log_json())
            log.info("reload complete: %s; served: %s", changed, applied.summary())

    async def _load_settings(self) -> PluginSettings:
        """The new settings, parsed off the event loop within the time budget; ReloadError otherwise."""
        assert self._reload_settings is not None
        budget = self._config_load_budget_s
        if self._parsing is not None and not self._parsing.done():
            raise ReloadError(
                "timeout",
                f"the config file's previous parse is still running, over its {budget:g} s budget; fix the "
                "file (a ConfigMap holds at most 1 MiB) and reload again",
            )
        self._parsing = in_daemon_thread(self._reload_settings, "config-parse")
        try:
            return await asyncio.wait_for(asyncio.shield(self._parsing), budget)
        except TimeoutError:
            raise ReloadError(
                "timeout",
                f"parsing the config file took longer than its {budget:g} s budget; fix the file "
                "(a ConfigMap holds at most 1 MiB)",
            ) from None
        except ConfigError as err:
            raise ReloadError("invalid_config", str(err)) from err
        except Exception as err:  # anything else the parser raised is still a config we cannot use
            raise ReloadError("invalid_config", f"{type(err).__name__}: {err}") from err

    async def _prepare(self, settings: PluginSettings, *, rediscover: bool) -> Candidate:
        """Everything the change needs, or ReloadError naming what cannot be served. Changes nothing."""
        if rediscover:
            found = leave_to_dra(await self._discover(settings), settings.dra_gpus)
            # A GPU given to DRA since the last pass is not lost: it must not be carried over as missing.
            previous = leave_to_dra(self._base, settings.dra_gpus).inventory
            carried = carry_missing(previous, found.inventory)
            base, missing, to_dra = carried.inventory, carried.missing, found.gpus
            reasons = await asyncio.to_thread(why_missing, self.nvml, list(missing)) if missing else {}
        else:
            base, missing, reasons, to_dra = self._base, self._missing, {}, self._to_dra
        resource_opts = await asyncio.to_thread(resource_options, settings)
        try:
            allocate_opts = await asyncio.to_thread(allocate_options, settings)
        except ImexChannelError as err:
            raise ReloadError("resources", str(err)) from err
        faults = self.faults.health() | {u: missing_health(self.faults, reasons, u) for u in missing}
        served = with_faults(base, faults)
        try:
            resources = build_resources(served, resource_opts)
        except ResourceError as err:
            raise ReloadError("resources", str(err)) from err
        withheld = await mps_not_ready(resources, settings)
        specs = specs_for(served, settings, allocate_opts.imex_channels, resource_opts.mig_minors)
        return Candidate(
            settings=settings,
            base=base,
            missing=dict(missing),
            missing_reasons=reasons,
            rediscovered=rediscover,
            resource_options=resource_opts,
            allocate_options=allocate_opts,
            withheld=withheld,
            specs=specs,
            to_dra=to_dra,
        )

    async def _discover(self, settings: PluginSettings) -> Inventory:
        nvml = self.nvml
        try:
            if not self._nvml_up:
                await asyncio.to_thread(nvml.nvmlInit)
                self._nvml_up = True
            return await asyncio.to_thread(discover, nvml, self._backend.sysfs_root)
        except nvml.NVMLError as err:
            message = f"nvml init failed: {err}. {explain_nvml_error(err)}"
            if self._base.gpus or settings.flags.failOnInitError is not False:
                raise ReloadError("discovery", message) from err
            log.warning("%s (failOnInitError=false: staying up)", message)
            return Inventory()

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
        self._log_to_dra(candidate)
        async with self._apply_lock:
            self.settings = candidate.settings
            self._to_dra = candidate.to_dra
            self._base = candidate.base
            self._missing = dict(candidate.missing)
            self._resource_options = candidate.resource_options
            self._allocate_options = candidate.allocate_options
            self._withheld = candidate.withheld
            applied = self._plan(self._build_served())
            # Arm health events before the kubelet can see new devices, so no early XID slips through.
            await self._apply_monitor(applied)
            await self._apply_servers(applied)
        gpus = self._base.gpus
        if candidate.rediscovered and gpus:
            log.info(
                "discovered %d GPU(s) (driver %s, CUDA %s); serving %s",
                len(gpus),
                self._base.driver_version or "?",
                self._base.cuda_driver_version or "?",
                ", ".join(f"{r.name}={len(r.devices)}" for r in applied.serving) or "nothing",
            )
        # Every GPU given to DRA is not "no devices": nothing to serve and nothing to retry.
        if not gpus and not self._to_dra and not self.supervisor.running("discovery-retry"):
            log.warning("%s", NO_DEVICES)
            self.supervisor.start("discovery-retry", self._retry_discovery)
        if self._withheld and not self.supervisor.running("mps-retry"):
            self.supervisor.start("mps-retry", self._retry_mps)
        return applied

    def _log_to_dra(self, candidate: Candidate) -> None:
        """Say which GPUs DRA gets, at start and whenever that changes; warn about items naming no GPU."""
        selection = candidate.settings.dra_gpus
        said = (tuple(g.uuid for g in candidate.to_dra), selection)
        if not candidate.rediscovered or said == self._said_to_dra or (selection.empty and not self._to_dra):
            return
        self._said_to_dra = said
        log.info("%s", describe(candidate.to_dra, selection))
        unmatched = selection.unmatched([*candidate.base.gpus, *candidate.to_dra])
        if unmatched:
            log.warning("KUBEGPU_DRA_GPUS names no GPU of this node: %s", ", ".join(unmatched))

    def _build_served(self) -> list[Resource]:
        """The resources to serve now: the current snapshot with today's faults, minus withheld ones."""
        self.inventory = with_faults(self._base, self.faults.health())
        resources = build_resources(self.inventory, self._resource_options)
        return [r for r in resources if r.name not in self._withheld]

    def _plan(self, resources: Sequence[Resource]) -> Plan:
        served = [Served(s.resource, s.options) for s in self.registrar.servers]
        gpus = [g.uuid for g in self._base.gpus]
        return plan(served, resources, self._allocate_options, watched=self._watched, gpus=gpus)

    async def _apply_servers(self, applied: Plan, *, updates_only: bool = False) -> None:
        current = {s.name: s for s in self.registrar.servers}
        servers = []
        for change in applied.changes:
            server = current.get(change.name)
            if change.step is Step.REMOVE:
                continue
            assert change.resource is not None
            if change.step is Step.ADD or server is None:
                if updates_only:
                    continue  # the health path never changes which servers run
                options = self._allocate_options
                server = ResourceServer(change.resource, self.plugin_dir, options, self._links, self.metrics)
            elif change.step is Step.UPDATE:
                server.options = self._allocate_options
                if await server.update(change.resource) and updates_only:
                    r = change.resource
                    log.info("%s: %d of %d devices healthy", r.name, r.healthy_count, len(r.devices))
            servers.append(server)
        self.metrics.update_resources(s.resource for s in servers)
        if not updates_only and any(c.step in (Step.ADD, Step.REMOVE) for c in applied.changes):
            await self.registrar.set_servers(servers)

    async def _retry_discovery(self) -> None:
        while not self._base.gpus:
            await asyncio.sleep(self.settings.env.discovery_retry_s)
            await self._reconcile(rediscover=True)
        log.info("found %d GPU(s) on retry", len(self._base.gpus))

    async def _retry_mps(self) -> None:
        while self._withheld:
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

    async def _apply_monitor(self, applied: Plan) -> None:
        """Start a health monitor for the plan's GPUs (armed before it returns), then stop the old one."""
        if not self._checks_enabled or applied.monitor is MonitorStep.KEEP:
            return
        old, self._monitor_task = self._monitor_task, None
        self._watched = None
        if applied.monitor is MonitorStep.WATCH:
            armed = asyncio.Event()
            watch = functools.partial(self._run_monitor, self._base, armed)
            self._monitor_task = self.supervisor.start(MONITOR_TASK, watch)
            await armed.wait()
            self._watched = applied.gpus
        if old is not None:
            old.cancel()
            await asyncio.wait([old])

    async def _run_monitor(self, inventory: Inventory, armed: asyncio.Event) -> None:
        """The health thread as a supervised task: ends when cancelled, raises when the thread died."""
        loop = asyncio.get_running_loop()

        def emit(events: Sequence[HealthEvent]) -> None:
            if events:
                with contextlib.suppress(RuntimeError):  # the loop closed: we are stopping
                    loop.call_soon_threadsafe(self._health_changed.set)

        monitor = HealthMonitor(
            self.nvml, inventory, self.health_settings, emit, faults=self.faults, observer=self.metrics
        )
        try:
            await asyncio.to_thread(monitor.start)
            armed.set()
            await asyncio.wrap_future(monitor.finished)
            raise RuntimeError("the NVML health thread ended without being stopped")
        finally:
            armed.set()
            await asyncio.to_thread(monitor.stop)

    async def _apply_health_reports(self) -> None:
        """Serve each change of the fault book; a restarted task first catches up with all of it."""
        while True:
            self._health_changed.clear()
            await self._sync_health()
            await self._health_changed.wait()

    async def _sync_health(self) -> None:
        async with self._apply_lock:
            if with_faults(self._base, self.faults.health()) == self.inventory:
                return
            await self._apply_servers(self._plan(self._build_served()), updates_only=True)
        back = [u for u in self._missing if u not in self.faults]
        if back:
            names = ", ".join(f"{self._missing[u].index} ({u})" for u in back)
            log.info("GPU %s recovered after it was lost: rediscovering it", names)
            self._spawn(self._reconcile(rediscover=True))
