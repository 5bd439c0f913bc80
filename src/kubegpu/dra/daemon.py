"""`kubegpu dra`'s lifecycle: discover, serve Prepare before registering, publish, follow health, stop clean.

1. Discover the GPUs (NVML in a thread), keep the ones the `--gpus` selection names.
2. Load the checkpoint (the claims an earlier process prepared survive a restart), start the DRA service
   and then the registration socket: the kubelet registers the driver and may call Prepare at once.
3. Publish the devices through the slice publisher, which keeps them published (the kubelet wipes a
   node's slices when it restarts).
4. The health thread (the device plugin's: XID catalog, probes, recovery) writes faults to the daemon's
   FaultBook; every change re-publishes the devices, an unhealthy one with NVIDIA's taint, a recovered one
   without it.
5. SIGTERM/SIGINT: the sockets go, the health thread stops. Prepared claims and their CDI specs stay: the
   next driver process (a restart, a rolling update) serves them from the checkpoint.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from kubegpu.allocation.resources import parse_mig_minors
from kubegpu.common.backoff import Backoff
from kubegpu.dra.checkpoint import Checkpoint, read_boot_id
from kubegpu.dra.claim_cdi import ClaimSpecs
from kubegpu.dra.claim_status import ClaimStatusWriter
from kubegpu.dra.claims import ClaimReader
from kubegpu.dra.consumable_shares import shared_entries, shares_mode
from kubegpu.dra.devices import DraDevice, device_entries, device_table, health_taint
from kubegpu.dra.dynamic_mig import DynamicMig, dynamic_mig_enabled, read_tables
from kubegpu.dra.events import DriverEvents, NoMetrics
from kubegpu.dra.health_stream import (
    GPU_LOST,
    HEALTH_NAMES,
    UNHEALTHY,
    DeviceHealthReport,
    DraHealthService,
    HealthBroadcast,
    health_reports,
)
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.lost_devices import PublishedStore, lost_entries
from kubegpu.dra.metered import MeteredPreparer
from kubegpu.dra.metrics_server import MetricsServer
from kubegpu.dra.mps_supervise import keep_forever
from kubegpu.dra.node_lock import LOCK_FILE, NodeLock
from kubegpu.dra.nvidia_flags import cdi_options, mps_daemons, time_slicer
from kubegpu.dra.prepare import Preparer
from kubegpu.dra.publisher import SlicePublisher
from kubegpu.dra.rebuild import clean_up, rebuild, rebuild_forever
from kubegpu.dra.service import KubeletServers
from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session
from kubegpu.node.faults import FaultBook
from kubegpu.node.health import HealthEvent, HealthMonitor, HealthSettings
from kubegpu.node.inventory import Health, Inventory
from kubegpu.node.nvml.backend import NvmlBackend
from kubegpu.settings.dra_driver import DEFAULT_DRIVER_FLAGS, DriverFlags
from kubegpu.settings.dra_selection import GpuSelection

log = logging.getLogger(__name__)

MAX_TASK_FAILURES = 5
CLEANUP_PERIOD_S = 600.0  # how often to look for prepared claims whose ResourceClaim is gone
MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")


class StartupError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class DraSettings:
    node_name: str
    driver_name: str
    selection: GpuSelection
    cdi_root: Path
    registrar_dir: Path
    plugins_dir: Path
    kubeconfig: str
    lock_timeout: float
    boot_id_file: Path
    api_timeout: float = 10.0
    http_endpoint: str = ""  # NVIDIA's --http-endpoint: empty serves no metrics
    metrics_path: str = "/metrics"
    driver: DriverFlags = DEFAULT_DRIVER_FLAGS  # NVIDIA's other flags and the feature gates

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name


class DraDaemon:
    def __init__(
        self,
        settings: DraSettings,
        nvml: NvmlBackend,
        health: HealthSettings,
        api: KubeClient,
    ) -> None:
        self.settings = settings
        self.nvml = nvml
        self.health = health
        self.api = api
        self.faults = FaultBook()  # outlives every health thread
        self.base = Inventory()
        self.published: list[dict[str, Any]] | None = None
        self.dynamic_mig: DynamicMig | None = None  # DynamicMIG's partitions (dra/dynamic_mig.py)
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self.health_stream = HealthBroadcast()
        self.events: DriverEvents = NoMetrics()
        self.checkpoint: Checkpoint | None = None  # set at start: its claims hold lost devices published
        self.store = PublishedStore(settings.plugin_dir)

    @property
    def _monitored(self) -> bool:
        return self.health.classifier.policy.checks_enabled

    # ---- what is served ----------------------------------------------------------------------------------

    def served(self) -> Inventory:
        return self.base.with_gpu_health(self.faults.health())

    def devices(self) -> tuple[Inventory, dict[str, DraDevice]]:
        inventory = self.served()
        partitioned = self.dynamic_mig.tables.keys() if self.dynamic_mig is not None else ()
        table = device_table(inventory, self.settings.selection, partitioned)
        if self.dynamic_mig is not None:
            selected = [g.uuid for g in inventory.gpus if self.settings.selection.includes(g)]
            table = self.dynamic_mig.table(table, inventory, selected)
        return inventory, table

    def report_health(self) -> None:
        """Hand the served devices' health to the kubelet's health streams (unchanged: nothing is sent)."""
        s = self.settings
        table = self.devices()[1]
        reports = health_reports(
            table, pool=s.node_name, driver_name=s.driver_name, monitored=self._monitored
        )
        reports += tuple(
            DeviceHealthReport(s.node_name, name, UNHEALTHY, GPU_LOST) for name in self.lost_held(table)
        )
        if self.health_stream.update(reports):
            self.events.devices(collections.Counter(HEALTH_NAMES[r.health] for r in reports))

    def entries(self) -> list[dict[str, Any]]:
        """What is published, with ConsumableShares' allowMultipleAllocations and request policies."""
        return shared_entries(self._entries(), shares_mode(self.settings.driver))

    def _entries(self) -> list[dict[str, Any]]:
        if self.dynamic_mig is not None:  # DynamicMIG: partitions and counter sets on partitioned GPUs
            inventory, table = self.devices()
            selected = [g.uuid for g in inventory.gpus if self.settings.selection.includes(g)]
            return self.dynamic_mig.entries(table, inventory, selected, self.settings.driver_name)
        found = device_entries(self.served(), self.settings.selection, driver_name=self.settings.driver_name)
        return found + self.lost_entries()

    def lost_held(self, table: Mapping[str, DraDevice]) -> list[str]:
        """The devices a prepared claim holds that the node no longer has (their GPU lost), in name order:
        streamed Unhealthy `GPU is lost` until the claim is unprepared, DynamicMIG's partitions included
        (which, unlike whole GPUs, are not published again)."""
        if self.checkpoint is None:
            return []
        return sorted({d.device for c in self.checkpoint.claims.values() for d in c.devices} - table.keys())

    def lost_entries(self) -> list[dict[str, Any]]:
        """Devices a prepared claim holds that discovery did not find, from their last published entries
        (`dra/lost_devices.py`): still published, tainted lost, until the claim is unprepared."""
        # Not under DynamicMIG: a partition consumes its GPU's counters, which a lost GPU no longer publishes.
        if self.checkpoint is None or self.dynamic_mig is not None:
            return []
        held = {d.device for c in self.checkpoint.claims.values() for d in c.devices}
        taint = health_taint(Health(healthy=False), self.settings.driver_name)
        assert taint is not None
        return lost_entries(self.store.saved, self.devices()[1], held, taint)

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def run(self) -> int:
        s = self.settings
        with nvml_session(self.nvml):
            try:
                self.base = await asyncio.to_thread(discover, self.nvml)
                if dynamic_mig_enabled(s.driver.gates):
                    tables = await asyncio.to_thread(read_tables, self.nvml.nvml, self.base)
                    self.dynamic_mig = DynamicMig(self.nvml.nvml, tables)
            except pynvml.NVMLError as err:
                raise StartupError(f"cannot discover the GPUs: {explain_nvml_error(err)}") from None
            _, table = self.devices()
            unmatched = s.selection.unmatched(self.base.gpus)
            if unmatched:
                log.warning("--gpus names GPUs this node does not have: %s", ", ".join(unmatched))
            log.info(
                "DRA driver %s on node %s: %d device(s): %s",
                s.driver_name,
                s.node_name,
                len(table),
                ", ".join(table),
            )

            metrics = self._serve_metrics()
            checkpoint = Checkpoint(s.plugin_dir / "checkpoint.json", read_boot_id(s.boot_id_file))
            checkpoint.load()
            self.checkpoint = checkpoint
            specs = ClaimSpecs(s.cdi_root, s.driver_name, cdi_options(s.driver, _mig_minors()))
            for stale in checkpoint.stale.values():
                specs.remove(stale.uid)
            reader = ClaimReader(self.api, s.driver_name, s.api_timeout)
            preparer = MeteredPreparer(
                self.events,
                driver_name=s.driver_name,
                node_name=s.node_name,
                checkpoint=checkpoint,
                specs=specs,
                reader=reader,
                lock=NodeLock(s.plugin_dir / LOCK_FILE, s.lock_timeout),
                devices=self.devices,
                gates=s.driver.gates,
                timeslicer=time_slicer(s.driver),
                shares=shares_mode(s.driver),
            )
            if preparer.shares is not None:  # what shared allocations consumed, shown on their claims
                preparer.status_writer = ClaimStatusWriter(
                    self.api, lambda: reader.version or "v1", s.api_timeout
                )
            preparer.confirm = lambda: rebuild(preparer)  # a Prepare after a lost checkpoint asks first
            preparer.on_unprepared = self._changed.set  # a lost device its claim held is published no more
            await preparer.recover()  # the specs the checkpoint does not name hold their devices
            preparer.mps = mps_daemons(s.driver, self.api, s.node_name, s.plugin_dir, self.nvml.is_fake)
            if self.dynamic_mig is not None:  # MIG devices no prepared claim holds are destroyed
                preparer.partitions = self.dynamic_mig
                async with preparer.locked():
                    held = {d.device for c in checkpoint.claims.values() for d in c.devices}
                    held.update(d for devices in preparer.orphans.values() for d in devices)
                    await asyncio.to_thread(self.dynamic_mig.reconcile, self.base, held)
            self.report_health()
            servers = KubeletServers(
                preparer,
                driver_name=s.driver_name,
                registrar_dir=s.registrar_dir,
                plugins_dir=s.plugins_dir,
                health=DraHealthService(self.health_stream),
            )
            self._install_signals()
            await servers.start()
            publisher = SlicePublisher(self.api, driver_name=s.driver_name, node_name=s.node_name)
            self._publish(publisher)
            tasks = [
                asyncio.create_task(self._supervised("slice publisher", publisher.run), name="publisher"),
                asyncio.create_task(self._supervised("health thread", self._run_monitor), name="health"),
                asyncio.create_task(
                    self._supervised("health reports", lambda: self._follow(publisher)), name="follow"
                ),
                asyncio.create_task(
                    self._supervised("checkpoint cleanup", lambda: _clean_up_forever(preparer)),
                    name="cleanup",
                ),
                asyncio.create_task(
                    self._supervised("claim rebuild", lambda: rebuild_forever(preparer)), name="rebuild"
                ),
            ]
            if preparer.mps is not None:  # MPSSupport: held daemons kept, the others removed
                mps = preparer.mps
                tasks.append(
                    asyncio.create_task(
                        self._supervised("MPS daemons", lambda: keep_forever(preparer, mps)), name="mps"
                    )
                )
            stop = asyncio.create_task(self._stop.wait())
            failed = await _until_stopped_or_failed(stop, tasks)
            log.info("stopping")
            await asyncio.gather(servers.stop(), publisher.stop())
            preparer.close()
            if metrics is not None:
                await asyncio.to_thread(metrics.stop)
            for task in (*tasks, stop):
                task.cancel()
            await asyncio.gather(*tasks, stop, return_exceptions=True)
            log.info("stopped")
            return 1 if failed else 0

    def _serve_metrics(self) -> MetricsServer | None:
        """With --http-endpoint: the metrics (prometheus-client is imported only now) and their server."""
        s = self.settings
        if not s.http_endpoint:
            return None
        from kubegpu.dra.metrics import DriverMetrics

        metrics = DriverMetrics(open_streams=lambda: self.health_stream.open_streams)
        try:
            server = MetricsServer(metrics.registry, s.http_endpoint, s.metrics_path)
        except OSError as err:
            raise StartupError(
                f"cannot serve metrics on {s.http_endpoint}: {err.strerror or err}; set --http-endpoint "
                "(HTTP_ENDPOINT) to a free [host]:port, or leave it empty to serve none"
            ) from None
        self.events = metrics
        self.api.on_error = metrics.api_error
        server.start()
        return server

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)

    def _publish(self, publisher: SlicePublisher) -> None:
        entries = self.entries()
        if entries != self.published:
            tainted = [e["name"] for e in entries if e.get("taints")]
            log.info(
                "publishing %d device(s)%s",
                len(entries),
                f"; tainted: {', '.join(tainted)}" if tainted else "",
            )
            self.published = entries
            self.store.save(entries)
            publisher.update(entries)

    async def _follow(self, publisher: SlicePublisher) -> None:
        """Re-publish on every health change (a restarted task first catches up)."""
        while True:
            self._changed.clear()
            self.report_health()
            self._publish(publisher)
            await self._changed.wait()

    async def _run_monitor(self) -> None:
        if not self.health.classifier.policy.checks_enabled:
            log.info(
                "health checks disabled by DP_DISABLE_HEALTHCHECKS; devices are published without taints"
            )
            self.health_stream.set_alive(True)  # the reports say so: "device health is not monitored"
            return
        loop = asyncio.get_running_loop()

        def emit(events: Sequence[HealthEvent]) -> None:
            if events:
                with contextlib.suppress(RuntimeError):  # the loop closed: stopping
                    loop.call_soon_threadsafe(self._changed.set)

        monitor = HealthMonitor(self.nvml.nvml, self.base, self.health, emit, faults=self.faults)
        try:
            await asyncio.to_thread(monitor.start)
            self.health_stream.set_alive(True)  # armed: no XID after this is missed
            await asyncio.wrap_future(monitor.finished)
            raise RuntimeError("the NVML health thread ended without being stopped")
        finally:
            self.health_stream.set_alive(False)
            await asyncio.to_thread(monitor.stop)

    async def _supervised(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Restart a failed background task after a back-off; give up (the daemon exits 1, the DaemonSet
        restarts it) after MAX_TASK_FAILURES failures in a row."""
        backoff = Backoff(initial=1.0, maximum=30.0)
        failures = 0
        while True:
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("%s failed (%d in a row)", name, failures)
                if failures >= MAX_TASK_FAILURES:
                    raise
                await asyncio.sleep(backoff.next_delay())


async def _until_stopped_or_failed(stop: asyncio.Task[Any], tasks: list[asyncio.Task[None]]) -> bool:
    """Wait for a stop signal or a task that gave up (True); a task that finished its job is let go."""
    pending: set[asyncio.Task[Any]] = {stop, *tasks}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if any(t is not stop and t.exception() is not None for t in done):
            return True
        if stop in done:
            return False


async def _clean_up_forever(preparer: Preparer) -> None:
    while True:
        await asyncio.sleep(CLEANUP_PERIOD_S)
        await clean_up(preparer)


def _mig_minors() -> dict[str, int]:
    try:
        return parse_mig_minors(MIG_MINORS_FILE.read_text())
    except (OSError, ValueError):
        return {}  # MIG devices get their parent's device node only
