"""Streams and unary calls admitted apart on a real socket: no number of ListAndWatch streams starves an
Allocate, refusals are counted and logged at a bounded rate, stream opens are logged once a minute."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.plugin import server as server_module
from kubegpu.plugin.server import ResourceServer
from tests.builders import gpu_uuid, make_inventory

INVENTORY = make_inventory(4)
RESOURCE = build_resources(INVENTORY)[0]


class Refusals:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str, str]] = []

    def allocated(self, resource: str, devices: int) -> None:
        pass

    def allocation_failed(self, resource: str, rpc: str = "Allocate") -> None:
        pass

    def rpc_refused(self, resource: str, rpc: str, reason: str) -> None:
        self.refused.append((resource, rpc, reason))


@contextlib.asynccontextmanager
async def serving(metrics: Refusals, **slow: Any) -> AsyncIterator[tuple[ResourceServer, str]]:
    plugin_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="kg-"))
    server = ResourceServer(RESOURCE, plugin_dir, AllocateOptions(), INVENTORY.link_map, metrics)
    for name, method in slow.items():
        setattr(server, name, method)  # the method table binds the servicer's methods when it starts
    await server.start()
    try:
        yield server, f"unix://{server.socket_path}"
    finally:
        await server.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def allocate_request() -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(1)])]
    )


async def test_fifteen_held_streams_do_not_starve_allocate() -> None:
    # The measured case: 15 streams held open on one socket, 16 with the kubelet's; every valid Allocate
    # got RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!" when streams counted against the 16 calls.
    metrics = Refusals()
    async with serving(metrics) as (_, target), grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        kubelet = stub.ListAndWatch(api_pb2.Empty())
        assert len((await kubelet.read()).devices) == 4
        tools = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(15)]
        answers = await asyncio.gather(*(t.read() for t in tools), return_exceptions=True)
        held = [a for a in answers if isinstance(a, api_pb2.ListAndWatchResponse)]
        refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        assert len(held) == 7 and len(refused) == 8  # 8 streams at once, the kubelet's among them
        for err in refused:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.details() == (
                "ListAndWatch for nvidia.com/gpu: 8 streams are open on this socket, the most it serves; "
                "close one (the kubelet needs only its own)"
            )
        results = await asyncio.gather(*(stub.Allocate(allocate_request()) for _ in range(20)))
        assert len(results) == 20
        assert all(r.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(1) for r in results)
        assert metrics.refused == [("nvidia.com/gpu", "ListAndWatch", "busy")] * 8
        for stream in (kubelet, *tools):
            stream.cancel()


def test_the_first_stream_of_a_server_is_admitted_whatever_the_count() -> None:
    # The kubelet dials back as soon as a fresh server registers: that first stream is never refused.
    from kubegpu.plugin.admission import STREAM, UNARY, Admission, IdBudget

    admission = Admission(unary=1, streams=0, budget=IdBudget(10))
    assert admission.enter(STREAM)
    assert not admission.enter(STREAM)
    assert admission.enter(UNARY) and not admission.enter(UNARY)
    admission.leave(UNARY)
    assert admission.enter(UNARY)


async def test_unary_calls_over_the_limit_are_refused_counted_and_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "BUSY", LogThrottle(server_module.log, interval_s=60.0, burst=1))
    release = asyncio.Event()

    async def held(request: Any, context: Any) -> api_pb2.PreStartContainerResponse:
        await release.wait()
        return api_pb2.PreStartContainerResponse()

    metrics = Refusals()
    caplog.set_level(logging.WARNING, logger="kubegpu.plugin.server")
    async with (
        serving(metrics, PreStartContainer=held) as (_, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = api_pb2_grpc.DevicePluginStub(channel)
        request = api_pb2.PreStartContainerRequest(devices_ids=[gpu_uuid(0)])
        running = [asyncio.ensure_future(stub.PreStartContainer(request)) for _ in range(16)]
        await asyncio.sleep(0.5)
        over = await asyncio.gather(
            *(stub.Allocate(allocate_request()) for _ in range(10)), return_exceptions=True
        )
        assert all(isinstance(e, grpc.aio.AioRpcError) for e in over)
        assert {(e.code(), e.details()) for e in over} == {
            (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "Allocate for nvidia.com/gpu: 16 calls are in flight on this socket, the most it "
                "serves at once; retry when one has finished",
            )
        }
        release.set()
        await asyncio.gather(*running)
        assert (await stub.Allocate(allocate_request())).container_responses  # served again
    assert metrics.refused == [("nvidia.com/gpu", "Allocate", "busy")] * 10
    assert len([r for r in caplog.records if "refusing Allocate" in r.getMessage()]) == 1  # once a minute


async def test_stream_opens_are_logged_once_a_minute_per_resource_with_a_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    throttle = LogThrottle(server_module.log, interval_s=60.0, burst=1, clock=lambda: now[0])
    monkeypatch.setattr(server_module, "STREAM_OPENS", throttle)
    caplog.set_level(logging.INFO, logger="kubegpu.plugin.server")

    async def open_and_close(stub: api_pb2_grpc.DevicePluginStub) -> None:
        stream = stub.ListAndWatch(api_pb2.Empty())
        await stream.read()
        await asyncio.sleep(0.05)  # the line is logged after the first message is sent
        stream.cancel()

    async with serving(Refusals()) as (_, target), grpc.aio.insecure_channel(target) as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(10):
            await open_and_close(stub)
        now[0] += 61
        await open_and_close(stub)
    opened = [r.getMessage() for r in caplog.records if "opened ListAndWatch" in r.getMessage()]
    assert opened == [
        "kubelet opened ListAndWatch for nvidia.com/gpu",
        "kubelet opened ListAndWatch for nvidia.com/gpu (9 more like this not logged since the previous one)",
    ]


def test_unary_calls_are_weighed_by_the_ids_they_may_carry_process_wide() -> None:
    # 100 calls listing the 63,680 devices of the largest accepted config peaked over the 256Mi limit with
    # 16 in flight: what runs at once is bounded in device IDs across every server of the process.
    from kubegpu.plugin.admission import UNARY, Admission, IdBudget

    budget = IdBudget(262_144)
    big, small = Admission(budget=budget), Admission(budget=budget)
    admitted = 0
    while big.enter(UNARY, 63_680):
        admitted += 1
    assert admitted == 4  # 4 x 63,680 <= 262,144 < 5 x 63,680
    assert not small.enter(UNARY, 10_000)  # the budget is the process's, not the socket's
    big.leave(UNARY, 63_680)
    assert small.enter(UNARY, 10_000)
    lone = Admission(budget=IdBudget(10))
    assert lone.enter(UNARY, 1_000_000)  # one call always runs, however large its resource
