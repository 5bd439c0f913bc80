"""The kubelet simulator's DRA device health (v1.36: ResourceHealthStatus and ResourceHealthStatusMessage beta
and on) against small in-test drivers, and the pod status it writes into the simulated API server.

Expected texts and shapes are the kubelet's (cm/dra manager.go, healthinfo.go, dra_plugin_manager.go),
written out here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from kubegpu.api.drahealth.v1alpha1 import api_pb2 as health_pb2
from kubegpu.api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.apisim import ApiServerSim
from kubegpu.demo.dranode import pod_object
from kubegpu.kubeletsim import EventKind
from kubegpu.kubeletsim.dra_health import DeviceHealth, HealthCache
from tests.kubeletsim.test_dra import (
    DRIVER,
    FakeDriver,
    allocated_claim,
    gpu_pod,
    kubelet,
    registered,
    settings,
    start_driver,
)

FAST = {"kubelet_version": "1.36", "health_retry_period": 0.1, "status_sync_period": 0.2}


class HealthServer(health_grpc.DRAResourceHealthServicer):
    """Sends whatever the test puts in `queue`; None ends the stream."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[health_pb2.NodeWatchResourcesResponse | None] = asyncio.Queue()
        self.opened = 0

    async def NodeWatchResources(  # an async generator: how grpc.aio serves a response stream
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        self.opened += 1
        while (message := await self.queue.get()) is not None:
            yield message


def report(*devices: tuple[str, int, str], timeout: int = 0) -> health_pb2.NodeWatchResourcesResponse:
    return health_pb2.NodeWatchResourcesResponse(
        devices=[
            health_pb2.DeviceHealth(
                device=health_pb2.DeviceIdentifier(pool_name="node-a", device_name=name),
                health=health,  # type: ignore[arg-type]
                message=message,
                health_check_timeout_seconds=timeout,
            )
            for name, health, message in devices
        ]
    )


async def driver_with_health(drivers: list[FakeDriver], root: Path) -> tuple[FakeDriver, HealthServer]:
    health = HealthServer()
    driver = FakeDriver(root, versions=("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"))
    original = grpc.aio.server

    def server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
        created = original(*args, **kwargs)
        health_grpc.add_DRAResourceHealthServicer_to_server(health, created)
        return created

    grpc.aio.server = server  # type: ignore[assignment]  # FakeDriver.start builds its one server
    try:
        await driver.start()
    finally:
        grpc.aio.server = original  # type: ignore[assignment]
    drivers.append(driver)
    return driver, health


def statuses(api: ApiServerSim, pod: str) -> list[dict[str, Any]]:
    return (api.get("pods", pod).get("status") or {}).get("containerStatuses") or []


async def until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the API server's state has no event to wait on
            await asyncio.sleep(0.02)


async def test_a_driver_without_the_service_gets_unimplemented_logged_and_retried_and_still_prepares(
    root: Path,
    api: ApiServerSim,
    drivers: list[FakeDriver],
) -> None:
    await start_driver(drivers, root)
    sim = await kubelet(root, settings(api, **FAST))
    try:
        await registered(sim)
        await sim.wait_for(lambda: len(sim.events(EventKind.DRA_HEALTH_STREAM_ENDED)) >= 2, 5)
        ended = sim.events(EventKind.DRA_HEALTH_STREAM_ENDED)[0]
        assert ended.data["error"].startswith("rpc error: code = Unimplemented desc = ")
        assert ended.message.startswith(f"DRA driver {DRIVER}: Error receiving from WatchResources stream: ")
        pod = gpu_pod("train", "c1")
        allocated_claim(api, "c1", pod)
        allocation = await sim.admit(pod)
        assert allocation.containers["c0"].run_options is not None
    finally:
        await sim.stop()


async def test_the_pod_status_per_container_request_with_messages_and_unknown_for_unreported(
    root: Path,
    api: ApiServerSim,
    drivers: list[FakeDriver],
) -> None:
    _, health = await driver_with_health(drivers, root)
    sim = await kubelet(root, settings(api, **FAST))
    try:
        await registered(sim)
        pod = gpu_pod("train", "c1", requests=("gpu", "other", ""))
        c1 = allocated_claim(api, "c1", pod, requests=2)
        uid = c1["metadata"]["uid"]
        api.create("pods", pod_object(pod))
        await sim.admit(pod)
        health.queue.put_nowait(
            report(("gpu-0", 2, "critical XID 79 reported by NVML"))
        )  # gpu-1 not reported
        gpu0, gpu1 = f"k8s.gpu.nvidia.com/claim={uid}-gpu-0", f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"
        bad = {"resourceID": gpu0, "health": "Unhealthy", "message": "critical XID 79 reported by NVML"}
        await until(lambda: len(statuses(api, "train")) == 3)
        assert [(s["name"], s.get("allocatedResourcesStatus")) for s in statuses(api, "train")] == [
            ("c0", [{"name": "claim:pc-c1/gpu", "resources": [bad]}]),
            ("c1", [{"name": "claim:pc-c1/other", "resources": [{"resourceID": gpu1, "health": "Unknown"}]}]),
            ("c2", [{"name": "claim:pc-c1", "resources": [bad, {"resourceID": gpu1, "health": "Unknown"}]}]),
        ]
        health.queue.put_nowait(report(("gpu-0", 1, ""), ("gpu-1", 1, "")))
        good = [{"resourceID": gpu0, "health": "Healthy"}, {"resourceID": gpu1, "health": "Healthy"}]
        await until(lambda: statuses(api, "train")[2]["allocatedResourcesStatus"][0]["resources"] == good)
    finally:
        await sim.stop()


async def test_without_the_message_gate_no_message_and_an_ended_stream_reads_unknown(
    root: Path,
    api: ApiServerSim,
    drivers: list[FakeDriver],
) -> None:
    _, health = await driver_with_health(drivers, root)
    sim = await kubelet(root, settings(api, **FAST, health_messages=False))
    try:
        await registered(sim)
        pod = gpu_pod("train", "c1")
        allocated_claim(api, "c1", pod)
        api.create("pods", pod_object(pod))
        await sim.admit(pod)
        health.queue.put_nowait(report(("gpu-0", 2, "critical XID 79 reported by NVML")))

        def resources() -> list[dict[str, str]] | None:
            found = statuses(api, "train")
            return found[0]["allocatedResourcesStatus"][0]["resources"] if found else None

        await until(lambda: resources() is not None and resources()[0]["health"] == "Unhealthy")
        assert "message" not in resources()[0]  # type: ignore[index]
        health.queue.put_nowait(None)  # the driver ends the stream: the kubelet clears what it knew
        await until(lambda: resources() is not None and resources()[0]["health"] == "Unknown")
        await sim.wait_for(lambda: health.opened >= 2, 5)  # and opens it again
    finally:
        await sim.stop()


def test_the_cache_times_out_to_unknown_and_reports_what_changed() -> None:
    now = [100.0]
    cache = HealthCache(clock=lambda: now[0])
    first = cache.update(
        DRIVER,
        [DeviceHealth("node-a", "gpu-0", "Healthy", "", 1.0), DeviceHealth("node-a", "gpu-1", "Healthy")],
    )
    assert [(d.device, d.health) for d in first] == [("gpu-0", "Healthy"), ("gpu-1", "Healthy")]
    assert cache.update(DRIVER, [DeviceHealth("node-a", "gpu-1", "Healthy")]) == []  # nothing changed
    now[0] = 101.5  # gpu-0's own 1 s timeout passed without a report
    assert cache.get(DRIVER, "node-a", "gpu-0") == ("Unknown", "")
    assert cache.get(DRIVER, "node-a", "gpu-1") == ("Healthy", "")
    changed = cache.update(DRIVER, [DeviceHealth("node-a", "gpu-1", "Unhealthy", "GPU is lost")])
    assert [(d.device, d.health, d.message) for d in changed] == [
        ("gpu-1", "Unhealthy", "GPU is lost"),
        ("gpu-0", "Unknown", ""),
    ]
    now[0] = 140.0  # the default 30 s
    assert cache.get(DRIVER, "node-a", "gpu-1") == ("Unknown", "")
    assert cache.get(DRIVER, "node-a", "gpu-9") == ("Unknown", "")
    cache.update(DRIVER, [DeviceHealth("node-a", "gpu-1", "Healthy")])
    cache.clear(DRIVER)
    assert cache.get(DRIVER, "node-a", "gpu-1") == ("Unknown", "")
