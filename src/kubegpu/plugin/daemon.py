"""The `kubegpu plugin` daemon: discovery, servers, registrar and health monitor on one asyncio loop.

Lifecycle (design.md §2): settings are already validated when we get here. Discover (in a thread: NVML
blocks), build resources, serve and register them, then apply health reports as new snapshots until a signal
says stop (SIGTERM/SIGINT/SIGQUIT) or reload (SIGHUP: re-read the config; a bad one keeps the old running).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.cdi import specs_for
from kubegpu.allocation.from_settings import allocate_options, resource_options
from kubegpu.allocation.resources import (
    Resource,
    ResourceError,
    ResourceOptions,
    build_resources,
)
from kubegpu.node.discovery import discover, explain_nvml_error
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.node.health import (
    ALL_GPUS,
    Fault,
    HealthEvent,
    HealthMonitor,
    HealthSettings,
)
from kubegpu.node.inventory import GpuLink, Health, Inventory
from kubegpu.node.mps_control import mps_daemon_alive
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.node.xids import XidCatalogError
from kubegpu.plugin.cdi_files import CdiSpecWriter
from kubegpu.plugin.filewatch import watch_file
from kubegpu.plugin.http_endpoint import HttpServer
from kubegpu.plugin.metrics import PluginMetrics
from kubegpu.plugin.podresources_client import PodResourcesClient
from kubegpu.plugin.registrar import KubeletId, Registrar, Registration
from kubegpu.plugin.server import ResourceServer
from kubegpu.settings.choices import DEFAULT_KUBELET_SOCKET
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings
from kubegpu.settings.table import CDI_ROOT_ENV

log = logging.getLogger(__name__)

NO_DEVICES = "No devices found. Waiting indefinitely."


class StartupError(RuntimeError):
    """The daemon cannot start; the message names the cause and the fix. Exit code 1."""


class Daemon:
    def __init__(
        self,
        settings: PluginSettings,
        *,
        reload_settings: Callable[[], PluginSettings] | None = None,
        backend: NvmlBackend | None = None,
    ) -> None:
        self.settings = settings
        self._reload_settings = reload_settings
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
        pod_resources = settings.pod_resources_socket
        self.metrics = PluginMetrics(
            status=self, pod_resources=PodResourcesClient(pod_resources) if pod_resources else None
        )
        self.registrar = Registrar(
            self.plugin_dir, Path(kubelet) if kubelet else None, on_registered=self.metrics.registered
        )
        self.http = (
            HttpServer(
                self,
                self.metrics,
                port=settings.http_port,
                host=settings.http_address or None,
                grace_s=settings.health_grace_s,
            )
            if settings.http_port
            else None
        )
        self.inventory = Inventory()
        self._nvml_up = False
        self._monitor: HealthMonitor | None = None
        self._faults: dict[str, Fault] = {}  # survives reloads: a reload must not make a bad GPU healthy
        try:
            self.health_settings = HealthSettings.from_settings(settings.env)
        except XidCatalogError as err:
            raise StartupError(str(err)) from err
        self._cdi = CdiSpecWriter(settings.env.cdi_root)
        self._retry_pending = False
        self._resource_options = ResourceOptions()
        self._reload_lock = asyncio.Lock()
        self._reload_again = False
        self._stopping = asyncio.Event()
        self._health_queue: asyncio.Queue[Sequence[HealthEvent]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def nvml(self) -> Any:
        return self._backend.nvml

    # --- lifecycle -----------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(sig, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))
        log.info("Running with config:\n%s", self.settings.log_json())
        log.info("Running with settings:\n%s", self.settings.log_settings())
        for warning in self.settings.warnings:
            log.warning("%s", warning)
        if not self.settings.kubelet_socket:
            log.info("Skipping registration with Kubelet")
        try:
            await self.registrar.start()
            if self.http is not None:
                await self.http.start()
                log.info("serving /healthz, /readyz and /metrics on port %d", self.http.port)
            await self._start_devices()
            self._spawn(self._apply_health_reports())
            if self.settings.config_file:
                # A changed config file (config-manager symlink swap, ConfigMap update) reloads like SIGHUP.
                self._spawn(watch_file(Path(self.settings.config_file), self._config_changed))
            await self._stopping.wait()
        finally:
            await self.shutdown()
        return 0

    def stop(self) -> None:
        self._stopping.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def shutdown(self) -> None:
        if self.http is not None:
            await self.http.close()
        await asyncio.to_thread(self._stop_monitor)
        for task in list(self._tasks):
            task.cancel()
        await self.registrar.close()  # stops servers and removes our sockets
        await asyncio.to_thread(self._cdi.remove)
        if self._nvml_up:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.nvml.nvmlShutdown)
            self._nvml_up = False
        log.info("stopped; sockets removed")

    async def _start_devices(self) -> None:
        """Discover and serve. Without devices, keep retrying in the background (failOnInitError=false)."""
        inventory = await self._discover()
        self._discovered = True
        if inventory is None or not inventory.gpus:
            log.warning("%s", NO_DEVICES)
            self._spawn(self._retry_discovery())
            return
        await self._serve(inventory)

    async def _discover(self) -> Inventory | None:
        nvml = self.nvml
        try:
            if not self._nvml_up:
                await asyncio.to_thread(nvml.nvmlInit)
                self._nvml_up = True
            return await asyncio.to_thread(discover, nvml, self._backend.sysfs_root)
        except nvml.NVMLError as err:
            message = f"nvml init failed: {err}. {explain_nvml_error(err)}"
            if self.settings.flags.failOnInitError is not False:
                raise StartupError(message) from err
            log.warning("%s (failOnInitError=false: staying up)", message)
            return None

    async def _retry_discovery(self) -> None:
        while True:
            await asyncio.sleep(self.settings.env.discovery_retry_s)
            try:
                inventory = await self._discover()
            except StartupError as err:  # failOnInitError may have been turned on by a reload
                log.warning("%s", err)
                continue
            if inventory is not None and inventory.gpus:
                log.info("found %d GPU(s) on retry", len(inventory.gpus))
                await self._serve(inventory)
                return

    async def _serve(self, inventory: Inventory) -> None:
        carried = {u: HealthMonitor.health_of(f) for u, f in self._faults.items() if inventory.gpu_by_uuid(u)}
        inventory = inventory.with_gpu_health(carried)
        self.inventory = inventory
        # Read once per (re)start: health updates rebuild resources often and must not re-read files.
        self._resource_options = resource_options(self.settings)
        try:
            options = allocate_options(self.settings)
        except ImexChannelError as err:
            raise StartupError(str(err)) from err
        await self._refresh_cdi_specs(inventory, options)
        try:
            resources = self._build(inventory)
        except ResourceError as err:
            raise StartupError(str(err)) from err
        resources = await self._serveable(resources)
        self.metrics.update_resources(resources)
        current = {s.name: s for s in self.registrar.servers}
        servers = []
        for resource in resources:
            server = current.get(resource.name)
            if server is None:
                server = ResourceServer(resource, self.plugin_dir, options, self._links, metrics=self.metrics)
            else:  # unchanged name: update in place, no restart and no re-registration
                server.options = options
                await server.update(resource)
            servers.append(server)
        log.info(
            "discovered %d GPU(s) (driver %s, CUDA %s); serving %s",
            len(inventory.gpus),
            inventory.driver_version or "?",
            inventory.cuda_driver_version or "?",
            ", ".join(f"{r.name}={len(r.devices)}" for r in resources),
        )
        # Arm health events before the kubelet can see the devices, so no early XID slips through.
        await self._start_monitor(inventory)
        await self.registrar.set_servers(servers)

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

    async def _serveable(self, resources: list[Resource]) -> list[Resource]:
        """Leave out MPS resources whose control daemon does not answer yet, and retry them later.

        NVIDIA checks the same thing before serving an MPS resource; a plugin serving replicas without a
        daemon would hand out pipes nobody listens on.
        """
        out = []
        for resource in resources:
            if resource.sharing == "mps":
                root = self.settings.env.mps_container_root
                alive, reason = await asyncio.to_thread(mps_daemon_alive, root, resource.name, 10.0)
                if not alive:
                    log.warning(
                        "not serving %s yet: the MPS control daemon is not ready (%s)", resource.name, reason
                    )
                    self._schedule_retry()
                    continue
            out.append(resource)
        return out

    def _schedule_retry(self) -> None:
        if self._retry_pending:
            return
        self._retry_pending = True

        async def retry() -> None:
            await asyncio.sleep(self.settings.env.mps_retry_s)
            self._retry_pending = False
            if self.inventory.gpus:
                await self._serve(self.inventory)

        self._spawn(retry())

    def _build(self, inventory: Inventory) -> list[Resource]:
        return build_resources(inventory, self._resource_options)

    # --- CDI spec files ----------------------------------------------------------------------------------

    async def _refresh_cdi_specs(self, inventory: Inventory, options: AllocateOptions) -> None:
        """Write our CDI specs for this inventory (or remove them when no CDI strategy is selected).

        Runs before the servers register: the runtime must find a spec for every name Allocate hands out.
        """
        minors = self._resource_options.mig_minors
        specs = specs_for(inventory, self.settings, options.imex_channels, minors)
        try:
            await asyncio.to_thread(self._cdi.refresh, specs)
        except OSError as err:
            raise StartupError(
                f"unable to write CDI specs to {self._cdi.root}: {err}; the cdi-* device-list strategies "
                f"need a writable CDI directory (mount the host's /var/run/cdi, or set {CDI_ROOT_ENV})"
            ) from err

    # --- health --------------------------------------------------------------------------------------

    async def _start_monitor(self, inventory: Inventory) -> None:
        loop = asyncio.get_running_loop()

        def emit(events: Sequence[HealthEvent]) -> None:
            if events:
                loop.call_soon_threadsafe(self._health_queue.put_nowait, events)

        self._monitor = HealthMonitor(
            self.nvml, inventory, self.health_settings, emit, faults=self._faults, on_xid=self.metrics.xid
        )
        await asyncio.to_thread(self._monitor.start)

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()
            self._faults = dict(self._monitor.faults)
            self._monitor = None

    async def _apply_health_reports(self) -> None:
        while True:
            events = await self._health_queue.get()
            await self.apply_health(events)

    async def apply_health(self, events: Sequence[HealthEvent]) -> None:
        updates: dict[str, Health] = {}
        for event in events:
            targets = (
                [g.uuid for g in self.inventory.gpus] if event.gpu_uuid is ALL_GPUS else [event.gpu_uuid]
            )
            for uuid in targets:
                updates[uuid] = event.health
        inventory = self.inventory.with_gpu_health(updates)
        if inventory is self.inventory:
            return
        self.inventory = inventory
        resources = self._build(inventory)
        self.metrics.update_resources(resources)
        for resource in resources:
            for server in self.registrar.servers:
                if server.name == resource.name and await server.update(resource):
                    log.info(
                        "%s: %d of %d devices healthy",
                        resource.name,
                        resource.healthy_count,
                        len(resource.devices),
                    )

    async def _config_changed(self) -> None:
        log.info("config file %s changed; reloading", self.settings.config_file)
        await self.reload()

    # --- reload --------------------------------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read the config (SIGHUP, config file change). Reloads never overlap; a burst of requests
        while one runs is answered by one more reload afterwards, which sees the latest file."""
        if self._reload_settings is None:
            return
        if self._reload_lock.locked():
            self._reload_again = True
            return
        async with self._reload_lock:
            self._reload_again = True
            while self._reload_again:
                self._reload_again = False
                await self._reload_once()

    async def _reload_once(self) -> None:
        """One reload; anything wrong with the new config keeps the old one running."""
        assert self._reload_settings is not None
        try:
            settings = self._reload_settings()
        except ConfigError as err:
            log.error("config reload failed, keeping the last good config running: %s", err)
            return
        inventory = await self._discover()
        if inventory is not None and inventory.gpus:
            try:
                build_resources(inventory, resource_options(settings))  # dry run before anything changes
                allocate_options(settings)
            except (ResourceError, ImexChannelError) as err:
                log.error("config reload failed, keeping the last good config running: %s", err)
                return
        log.info("reloading with the new config")
        self.settings = settings
        log.info("Running with config:\n%s", settings.log_json())
        await asyncio.to_thread(self._stop_monitor)
        if inventory is None or not inventory.gpus:
            await self.registrar.set_servers([])
            log.warning("%s", NO_DEVICES)
            self._spawn(self._retry_discovery())
            return
        await self._serve(inventory)
        log.info("reload complete")
