"""Device health to the kubelet: DRAResourceHealth v1alpha1 `NodeWatchResources` on the DRA socket.

The kubelet (1.34+, with its ResourceHealthStatus gate: beta and on from 1.36) opens this stream after the
driver registers and shows each prepared device's health in the pod's
`status.containerStatuses[].allocatedResourcesStatus`. Every message holds the complete list of the node's
devices, named by pool and device exactly as the ResourceSlice publishes them.

The health is derived from the device's slice taint (`devices.health_taint`), with the messages NVIDIA's
driver sends, so the pod status and the ResourceSlice never disagree:

    <driver>/xid taint       Unhealthy  "critical XID <xid> reported by NVML"
    <driver>/gpu-lost taint  Unhealthy  "GPU is lost"
    health checks off        Unknown    "device health is not monitored"
    no taint                 Healthy    (no message)

The kubelet stamps each device with the time a message arrived and reads it as Unknown once
`health_check_timeout_seconds` (its default: 30 s) pass without another. So a stream gets the full state
at once, again on every change, and again every `RESEND_PERIOD_S` while the health thread is alive: a
driver whose health thread is down stops vouching for its devices and the kubelet shows them Unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import grpc

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.dra.devices import DraDevice, health_taint

# What the driver advertises in GetInfo's supported_versions (the kubelet plugin helper's string): a 1.37
# kubelet opens the stream only for a driver that lists it; 1.34-1.36 open it for every driver.
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
HEALTH_CHECK_TIMEOUT_S = 30  # the kubelet's DefaultHealthTimeout, told explicitly (read from 1.35)
RESEND_PERIOD_S = 10.0  # well inside the timeout: two lost resends still leave the devices known

HEALTHY = health_pb2.HEALTHY
UNHEALTHY = health_pb2.UNHEALTHY
UNKNOWN = health_pb2.UNKNOWN

HEALTH_NAMES: dict[int, str] = {HEALTHY: "Healthy", UNHEALTHY: "Unhealthy", UNKNOWN: "Unknown"}  # as pods say

NOT_MONITORED = "device health is not monitored"
GPU_LOST = "GPU is lost"


@dataclass(frozen=True, slots=True)
class DeviceHealthReport:
    """One device's line in a NodeWatchResources message."""

    pool: str
    device: str
    health: int  # health_pb2.HealthStatus
    message: str = ""


def health_reports(
    table: Mapping[str, DraDevice], *, pool: str, driver_name: str, monitored: bool
) -> tuple[DeviceHealthReport, ...]:
    """Every published device's health, in slice order: the same devices and taints the slice carries.

    `table` is what the node publishes (`devices.device_table`, with DynamicMIG's partitions in place of
    their GPUs): a partition and a MIG device have their GPU's health, so they follow it."""
    reports = []
    for name, device in table.items():
        if not monitored:
            reports.append(DeviceHealthReport(pool, name, UNKNOWN, NOT_MONITORED))
            continue
        taint = health_taint(device.health, driver_name)
        if taint is None:
            reports.append(DeviceHealthReport(pool, name, HEALTHY))
        elif taint["key"] == f"{driver_name}/xid":
            reports.append(
                DeviceHealthReport(pool, name, UNHEALTHY, f"critical XID {taint['value']} reported by NVML")
            )
        else:
            reports.append(DeviceHealthReport(pool, name, UNHEALTHY, GPU_LOST))
    return tuple(reports)


class HealthBroadcast:
    """The latest reports and a wake-up for every open stream when they change.

    Reports are only sent while they are kept true: once the health thread is armed (or health is known
    not to be monitored, which the reports then say), never before and not while it is down. A stream
    opened earlier waits for that; meanwhile the kubelet shows the devices Unknown, which they are.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._reports: tuple[DeviceHealthReport, ...] = ()
        self._wake = asyncio.Event()
        self.alive = False
        self.updates = 0  # how many times the reports changed
        self.open_streams = 0

    @property
    def reports(self) -> tuple[DeviceHealthReport, ...]:
        return self._reports

    def update(self, reports: tuple[DeviceHealthReport, ...]) -> bool:
        """Set the reports; wakes every stream when they changed. Returns whether they did."""
        if reports == self._reports:
            return False
        self._reports = reports
        self.updates += 1
        self._wake_streams()
        return True

    def set_alive(self, alive: bool) -> None:
        """Whether the reports are being kept true (the health thread runs, or health is not monitored)."""
        if alive and not self.alive:
            self._wake_streams()
        self.alive = alive

    def _wake_streams(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def response(self) -> health_pb2.NodeWatchResourcesResponse:
        now = int(self._clock())
        return health_pb2.NodeWatchResourcesResponse(
            devices=[
                health_pb2.DeviceHealth(
                    device=health_pb2.DeviceIdentifier(pool_name=r.pool, device_name=r.device),
                    health=r.health,  # type: ignore[arg-type]  # an int of the HealthStatus enum
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S,
                    message=r.message,
                )
                for r in self._reports
            ]
        )

    async def watch(
        self, resend_period: float = RESEND_PERIOD_S
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        """The full state as soon as it is known, then on every change, and every `resend_period`."""
        self.open_streams += 1
        try:
            while True:
                wake = self._wake  # taken before yielding: a change during the send is not missed
                if self.alive:
                    yield self.response()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), resend_period)
        finally:
            self.open_streams -= 1


class DraHealthService(health_grpc.DRAResourceHealthServicer):
    def __init__(self, broadcast: HealthBroadcast, resend_period: float = RESEND_PERIOD_S) -> None:
        self.broadcast = broadcast
        self.resend_period = resend_period

    async def NodeWatchResources(  # an async generator: how grpc.aio serves a response stream
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        async for response in self.broadcast.watch(self.resend_period):
            yield response
