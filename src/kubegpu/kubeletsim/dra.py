"""The kubelet's DRA side: plugin watcher, plugin store, DRA manager and ResourceSlice wiping, together.

    settings = DraSettings(api_url=api.url, node_name="node-a", kubelet_version="1.34")
    async with KubeletSimulator(root / "device-plugins", dra=settings) as sim:
        ...  # a DRA driver registers on root/plugins_registry/<driver>-reg.sock
        await sim.admit(pod)  # prepares its claims, then starts its containers with the CDI IDs

Wiping, as the kubelet does it: at start every ResourceSlice of the node is deleted (a driver must
publish again); when the last plugin of a driver deregisters, that driver's slices of the node are
deleted - at once by a 1.32 kubelet, after `wipe_delay` (30 s) from 1.34, cancelled if the driver comes
back in time. Device health (DRAResourceHealth, `dra_health.py`): with the ResourceHealthStatus gate (on
for "1.36") every registered plugin's health stream is read, and the pods whose devices changed get their
`allocatedResourcesStatus` written to the API server (PATCH pods/<name>/status; a pod the API server does
not have is skipped). Not modelled: the gRPC connection state (a plugin is usable while registered), and
the rolling-update socket names beyond what the watcher finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dra_api import ApiEndpoint, ApiRequestError
from .dra_health import (
    STREAM_RETRY_PERIOD,
    DeviceHealth,
    HealthCache,
    HealthStreams,
    affected_pods,
    container_statuses,
    status_patch,
)
from .dra_manager import DraError, DraManager
from .dra_plugins import DEFAULT_CALL_TIMEOUT, PluginStore
from .endpoint import RpcRecorder
from .events import EventKind, EventLog
from .plugin_watcher import DIAL_TIMEOUT, GET_INFO_TIMEOUT, NOTIFY_TIMEOUT, REGISTRY_DIR, PluginWatcher
from .pods import Pod

log = logging.getLogger(__name__)

KUBELET_VERSIONS = ("1.32", "1.34", "1.36")
WIPE_DELAY_134 = 30.0  # defaultWipingDelay
RECONCILE_PERIOD = 60.0


@dataclass(frozen=True)
class DraSettings:
    """How the simulated kubelet's DRA side behaves.

    `kubelet_version`: "1.32" (v1beta1 claims, [v1beta1.DRAPlugin, v1alpha3.NodeService] with the silent
    fallback, one plugin per driver, wipe at once), "1.34" (v1 claims, the plugin's first of
    [v1.DRAPlugin, v1beta1.DRAPlugin], several plugins per driver, wipe after 30 s) or "1.36" (1.34's, with
    ResourceHealthStatus and ResourceHealthStatusMessage beta and on).
    `resource_health_status` / `health_messages`: those two gates (None: the version's default; the first
    has no effect on 1.32, which has no DRA health). `health_retry_period`: the wait before the health
    stream is opened again; `status_sync_period`: how often pod statuses are recomputed (a device whose
    report timed out turns Unknown then, as at the kubelet's next pod sync).
    `root`: the kubelet root with plugins_registry/ and dra_manager_state; by default the parent of the
    simulator's device-plugin directory. `api_url` None runs without an API server (no claims, no wipes).
    `keep_checkpoint`: False makes a restart forget dra_manager_state (as a wiped /var/lib/kubelet would).
    """

    node_name: str = "node-a"
    api_url: str | None = None
    api_token: str = ""
    kubelet_version: str = "1.34"
    root: Path | None = None
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    dial_timeout: float = DIAL_TIMEOUT
    get_info_timeout: float = GET_INFO_TIMEOUT
    notify_timeout: float = NOTIFY_TIMEOUT
    wipe_delay: float | None = None  # None: the version's (0 for 1.32, 30 s for 1.34)
    reconcile_period: float = RECONCILE_PERIOD
    keep_checkpoint: bool = True
    poll_interval: float = 0.05
    resource_health_status: bool | None = None
    health_messages: bool | None = None
    health_retry_period: float = STREAM_RETRY_PERIOD
    status_sync_period: float = 10.0

    def __post_init__(self) -> None:
        if self.kubelet_version not in KUBELET_VERSIONS:
            raise ValueError(
                f"kubelet_version must be one of {KUBELET_VERSIONS}, got {self.kubelet_version!r}"
            )

    @property
    def effective_wipe_delay(self) -> float:
        if self.wipe_delay is not None:
            return self.wipe_delay
        return 0.0 if self.kubelet_version == "1.32" else WIPE_DELAY_134

    @property
    def health_stream(self) -> bool:
        if self.kubelet_version == "1.32":
            return False
        return (
            self.kubelet_version >= "1.36"
            if self.resource_health_status is None
            else self.resource_health_status
        )

    @property
    def health_message(self) -> bool:
        return self.kubelet_version >= "1.36" if self.health_messages is None else self.health_messages


class DraKubelet:
    def __init__(self, settings: DraSettings, root: Path, events: EventLog, record: RpcRecorder) -> None:
        self.settings = settings
        self.root = root
        self.events = events
        resource_version = "v1beta1" if settings.kubelet_version == "1.32" else "v1"
        self.api = ApiEndpoint(settings.api_url or "", settings.api_token, resource_version)
        self.plugins = PluginStore(settings.kubelet_version)
        self.manager = DraManager(root, self.api, self.plugins, events, checkpoint=True)
        self.watcher = PluginWatcher(
            root / REGISTRY_DIR,
            self.plugins,
            events,
            record,
            on_change=self._driver_changed,
            call_timeout=settings.call_timeout,
            dial_timeout=settings.dial_timeout,
            get_info_timeout=settings.get_info_timeout,
            notify_timeout=settings.notify_timeout,
            poll_interval=settings.poll_interval,
        )
        self._wipes: dict[str, asyncio.Task[None]] = {}
        self._reconcile_task: asyncio.Task[None] | None = None
        self._started_once = False
        self.health = HealthCache()
        self._streams = HealthStreams(self.health, events, self._health_changed, settings.health_retry_period)
        self._pods: Callable[[], list[Pod]] = list
        self._written: dict[str, list[dict[str, Any]]] = {}  # pod uid -> the containerStatuses last written
        self._status_task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def registry_dir(self) -> Path:
        return self.watcher.directory

    async def start(
        self, active_pod_uids: Callable[[], set[str]], pods: Callable[[], list[Pod]] = list
    ) -> int:
        """Start as the kubelet does; returns how many claims came back from the checkpoint."""
        self._pods = pods
        self.root.mkdir(parents=True, exist_ok=True)
        if self._started_once and not self.settings.keep_checkpoint:
            (self.root / "dra_manager_state").unlink(missing_ok=True)
        self._started_once = True
        try:
            restored = self.manager.restore()
        except ValueError as err:
            raise RuntimeError(f"the DRA manager cannot start: {err}") from None
        if self.settings.api_url:
            await self._wipe("", "kubelet started")
        await self.watcher.start()
        self._reconcile_task = asyncio.create_task(
            self._reconcile_loop(active_pod_uids), name="DRA reconcile"
        )
        if self.settings.health_stream and self.settings.api_url:
            self._status_task = asyncio.create_task(self._status_loop(), name="DRA pod status")
        return restored

    async def stop(self) -> None:
        for task in (self._reconcile_task, self._status_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reconcile_task = self._status_task = None
        await self._streams.stop()
        for write in list(self._writes):
            write.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        self._written.clear()
        for task in list(self._wipes.values()):
            task.cancel()
        await asyncio.gather(*self._wipes.values(), return_exceptions=True)
        self._wipes.clear()
        await self.watcher.stop()

    # ---- wiping -----------------------------------------------------------------------------------

    def _driver_changed(self, driver: str) -> None:
        if self.settings.health_stream:
            self._streams.sync(self.plugins.all())
        if self.plugins.usable(driver):
            pending = self._wipes.pop(driver, None)
            if pending is not None:
                pending.cancel()
            return
        if driver in self._wipes or not self.settings.api_url:
            return
        self._wipes[driver] = asyncio.create_task(self._wipe_later(driver), name=f"wipe {driver}")

    async def _wipe_later(self, driver: str) -> None:
        try:
            await asyncio.sleep(self.settings.effective_wipe_delay)
            await self._wipe(driver, "driver gone")
        finally:
            if self._wipes.get(driver) is asyncio.current_task():
                del self._wipes[driver]

    async def _wipe(self, driver: str, why: str) -> None:
        try:
            count = await self.api.delete_slices(self.settings.node_name, driver)
        except ApiRequestError as err:
            log.warning("wiping ResourceSlices of node %s: %s", self.settings.node_name, err)
            self.events.emit(
                EventKind.DRA_SLICES_WIPED,
                f"could not delete the ResourceSlices of node {self.settings.node_name} ({why}): {err}",
                driver or None,
                error=str(err),
                deleted=0,
            )
            return
        what = f"driver {driver}'s" if driver else "all"
        self.events.emit(
            EventKind.DRA_SLICES_WIPED,
            f"deleted {what} ResourceSlices of node {self.settings.node_name} ({why}): {count}",
            driver or None,
            deleted=count,
            reason=why,
        )

    # ---- reconciliation ---------------------------------------------------------------------------

    async def _reconcile_loop(self, active_pod_uids: Callable[[], set[str]]) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_period)
            try:
                await self.manager.reconcile(active_pod_uids)
            except DraError as err:
                log.warning("DRA reconcile: %s", err)

    # ---- device health in the pod status ---------------------------------------------------------

    def _health_changed(self, driver: str, changed: list[DeviceHealth]) -> None:
        uids = affected_pods(self.manager.claims(), driver, changed)
        if uids and self.settings.api_url:
            task = asyncio.create_task(self.write_pod_statuses(uids), name="DRA health pod status")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def write_pod_statuses(self, uids: set[str] | None = None) -> None:
        """Recompute the pods' containerStatuses (all pods when `uids` is None); PATCH those that changed."""
        for pod in self._pods():
            if uids is not None and pod.uid not in uids:
                continue
            entries = container_statuses(
                pod, self.manager.claim_info, self.health, messages=self.settings.health_message
            )
            if self._written.get(pod.uid) == entries:
                continue
            try:
                await self.api.patch_pod_status(pod.namespace, pod.name, status_patch(entries))
            except ApiRequestError as err:
                log.info("pod %s/%s: cannot write its status: %s", pod.namespace, pod.name, err)
                continue
            self._written[pod.uid] = entries
            count = sum(len(e.get("allocatedResourcesStatus", [])) for e in entries)
            self.events.emit(
                EventKind.POD_STATUS_WRITTEN,
                f"pod {pod.name}: status written ({count} allocated resource status entries)",
                pod=pod.name,
                container_statuses=entries,
            )

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.status_sync_period)
            await self.write_pod_statuses()
