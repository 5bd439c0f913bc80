"""The kubelet's DRA device health (pkg/kubelet/cm/dra: healthinfo.go, manager.go and
plugin/dra_plugin_manager.go as of v1.36), behind its ResourceHealthStatus gate (alpha and off in 1.34-1.35,
beta and on from 1.36).

- **The stream.** When a plugin registers, the kubelet opens DRAResourceHealth v1alpha1 `NodeWatchResources`
  on the plugin's endpoint, whether or not the plugin advertised the service (1.34-1.36; a 1.37 kubelet asks
  only plugins that advertise `v1alpha1.DRAResourceHealth`). It reads messages until the stream ends, then
  opens it again 5 s later, for as long as the plugin stays registered; deregistration cancels it. A driver
  without the service answers Unimplemented on the first read: the kubelet logs
  `"Error receiving from WatchResources stream" err="rpc error: code = Unimplemented desc = ..."` and tries
  again 5 s later, so such a driver keeps working for Prepare and Unprepare.
- **The cache.** Each message is the driver's complete list; every reported device is stamped with the
  time it arrived. A device reads Unknown once its `health_check_timeout_seconds` (30 s when unset) pass
  without a report, and every device of the driver reads Unknown as soon as its stream ends (the cache of
  that driver is cleared). A change (health, message or timeout) of a device a prepared claim holds sends
  the pods using that claim a status update.
- **The pod status.** For every regular container and each of its `resources.claims`, an entry named
  `claim:<pod claim name>` (or `claim:<pod claim name>/<request>`) lists the claim's devices for that request
  as `{resourceID, health, message}`: the resource ID is the device's first CDI ID (else
  `<driver>/<pool>/<device>`); `message` is set when non-empty and the ResourceHealthStatusMessage gate
  (beta and on in 1.36) is on; entries without devices are left out.

Not modelled: the health checkpoint file (the cache here starts empty after a restart, which the kubelet's
does not when its checkpoint is readable), the cap on message length, and init containers' statuses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2

from .dra_checkpoint import ClaimInfo
from .dra_plugins import DraPlugin
from .errors import go_rpc_error
from .events import EventKind, EventLog
from .pods import Pod

log = logging.getLogger(__name__)

DEFAULT_HEALTH_TIMEOUT = 30.0  # DefaultHealthTimeout
STREAM_RETRY_PERIOD = 5.0  # wait.UntilWithContext(..., 5*time.Second)
HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
_STATUS_NAMES = {health_pb2.HEALTHY: HEALTHY, health_pb2.UNHEALTHY: UNHEALTHY}


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    health: str  # Healthy, Unhealthy, Unknown
    message: str = ""
    timeout: float = DEFAULT_HEALTH_TIMEOUT
    updated_at: float = 0.0  # monotonic

    @property
    def key(self) -> tuple[str, str]:
        return self.pool, self.device


def from_message(device: health_pb2.DeviceHealth, now: float) -> DeviceHealth:
    """buildDeviceHealth: a status other than HEALTHY/UNHEALTHY is Unknown; a timeout <= 0 is the default."""
    timeout = float(device.health_check_timeout_seconds)
    return DeviceHealth(
        device.device.pool_name,
        device.device.device_name,
        _STATUS_NAMES.get(device.health, UNKNOWN),
        device.message,
        timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT,
        now,
    )


class HealthCache:
    """healthInfoCache: per driver, the last report of each (pool, device)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._drivers: dict[str, dict[tuple[str, str], DeviceHealth]] = {}

    def update(self, driver: str, reported: Iterable[DeviceHealth]) -> list[DeviceHealth]:
        """updateHealthInfo: store a report; returns the devices whose health, message or timeout changed,
        and those not reported any more that timed out (now Unknown)."""
        now = self._clock()
        devices = self._drivers.setdefault(driver, {})
        changed: list[DeviceHealth] = []
        seen = set()
        for device in reported:
            device = DeviceHealth(
                device.pool, device.device, device.health, device.message, device.timeout, now
            )
            seen.add(device.key)
            old = devices.get(device.key)
            if old is None or (old.health, old.message, old.timeout) != (
                device.health,
                device.message,
                device.timeout,
            ):
                changed.append(device)
            devices[device.key] = device
        for key, old in list(devices.items()):
            if key not in seen and old.health != UNKNOWN and now - old.updated_at > old.timeout:
                devices[key] = DeviceHealth(old.pool, old.device, UNKNOWN, "", old.timeout, now)
                changed.append(devices[key])
        return changed

    def get(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """getHealthInfo: (health, message); Unknown for a device never reported or not reported in time."""
        known = self._drivers.get(driver, {}).get((pool, device))
        if known is None or self._clock() - known.updated_at > known.timeout:
            return UNKNOWN, ""
        return known.health, known.message

    def clear(self, driver: str) -> None:
        self._drivers.pop(driver, None)


def container_statuses(
    pod: Pod, claim: Callable[[str, str], ClaimInfo | None], cache: HealthCache, *, messages: bool
) -> list[dict[str, Any]]:
    """UpdateAllocatedResourcesStatus for the pod's regular containers, as containerStatuses entries."""
    claim_names = {c.name: c.claim_name for c in pod.resource_claims}
    out = []
    for container in pod.containers:
        if container.init:
            continue
        statuses: dict[str, list[dict[str, str]]] = {}
        for ref in container.claims:
            actual = claim_names.get(ref.name)
            info = claim(pod.namespace, actual) if actual else None
            if info is None:
                continue
            name = f"claim:{ref.name}/{ref.request}" if ref.request else f"claim:{ref.name}"
            resources = statuses.setdefault(name, [])
            resources.clear()
            base_request = ref.request.split("/", 1)[0]  # a subrequest counts as its request
            seen = set()
            for driver, devices in info.drivers.items():
                for device in devices:
                    if ref.request and device.request_names and base_request not in device.request_names:
                        continue
                    health, message = cache.get(driver, device.pool_name, device.device_name)
                    resource_id = (
                        device.cdi_device_ids[0]
                        if device.cdi_device_ids
                        else f"{driver}/{device.pool_name}/{device.device_name}"
                    )
                    if resource_id in seen:
                        continue
                    seen.add(resource_id)
                    resource = {"resourceID": resource_id, "health": health}
                    if messages and message:
                        resource["message"] = message
                    resources.append(resource)
        status: dict[str, Any] = {
            "name": container.name,
            "ready": True,
            "restartCount": 0,
            "image": "",
            "imageID": "",
        }
        kept = [{"name": n, "resources": r} for n, r in statuses.items() if r]
        if kept:
            status["allocatedResourcesStatus"] = kept
        out.append(status)
    return out


class HealthStreams:
    """One health stream per registered plugin, feeding the cache; `on_change(driver, devices)` is told
    of every device whose reported health changed."""

    def __init__(
        self,
        cache: HealthCache,
        events: EventLog,
        on_change: Callable[[str, list[DeviceHealth]], None],
        retry_period: float = STREAM_RETRY_PERIOD,
    ) -> None:
        self.cache = cache
        self._events = events
        self._on_change = on_change
        self._retry_period = retry_period
        self._tasks: dict[int, tuple[DraPlugin, asyncio.Task[None]]] = {}

    def sync(self, plugins: Iterable[DraPlugin]) -> None:
        """Open a stream for each newly registered plugin, cancel those of plugins gone."""
        current = {id(p): p for p in plugins}
        for key, (plugin, task) in list(self._tasks.items()):
            if key not in current or current[key] is not plugin:
                task.cancel()
                del self._tasks[key]
        for key, plugin in current.items():
            if key not in self._tasks:
                task = asyncio.create_task(self._watch(plugin), name=f"health stream {plugin.driver}")
                self._tasks[key] = (plugin, task)

    async def stop(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, plugin: DraPlugin) -> None:
        while True:
            try:
                await self._read(plugin)
            finally:
                self.cache.clear(plugin.driver)  # HandleWatchResourcesStream's deferred clearDriver
            await asyncio.sleep(self._retry_period)

    async def _read(self, plugin: DraPlugin) -> None:
        call = plugin.watch_health()
        try:
            async for response in call:
                now = time.monotonic()
                changed = self.cache.update(plugin.driver, [from_message(d, now) for d in response.devices])
                self._events.emit(
                    EventKind.DRA_HEALTH_UPDATED,
                    f"DRA driver {plugin.driver}: health of {len(response.devices)} device(s), "
                    f"{len(changed)} changed",
                    plugin.driver,
                    changed=[(d.pool, d.device, d.health, d.message) for d in changed],
                )
                if changed:
                    self._on_change(plugin.driver, changed)
            log.debug("DRA driver %s: health stream ended with EOF", plugin.driver)
            self._events.emit(
                EventKind.DRA_HEALTH_STREAM_ENDED,
                f"DRA driver {plugin.driver}: health stream ended",
                plugin.driver,
                error="",
            )
        except grpc.aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.CANCELLED:
                return  # the plugin deregistered and its connection closed: not an error the kubelet logs
            text = go_rpc_error(err)
            log.error(
                '"Error receiving from WatchResources stream" err="%s" pluginName="%s"', text, plugin.driver
            )
            self._events.emit(
                EventKind.DRA_HEALTH_STREAM_ENDED,
                f"DRA driver {plugin.driver}: Error receiving from WatchResources stream: {text}",
                plugin.driver,
                error=text,
            )
        finally:
            call.cancel()


def affected_pods(claims: Iterable[ClaimInfo], driver: str, changed: Iterable[DeviceHealth]) -> set[str]:
    """The UIDs of the pods whose claims hold one of the changed devices of `driver`."""
    keys = {d.key for d in changed}
    pods: set[str] = set()
    for info in claims:
        if any((d.pool_name, d.device_name) in keys for d in info.drivers.get(driver, ())):
            pods |= info.pod_uids
    return pods


def status_patch(entries: list[dict[str, Any]]) -> Mapping[str, Any]:
    """The body of the kubelet's PATCH of pods/<name>/status: containerStatuses is an atomic list, so the
    whole list is sent."""
    return {"status": {"containerStatuses": entries}}
