"""ResourceServer over a real unix socket, driven by a plain gRPC client (no kubelet involved)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.node.inventory import Health
from kubegpu.plugin.server import ResourceServer
from tests.builders import gpu_uuid, make_inventory

INVENTORY = make_inventory(4, {(0, 1): 12, (2, 3): 12}, numa=[0, 0, 1, 1])


@pytest.fixture
async def served() -> AsyncIterator[tuple[ResourceServer, api_pb2_grpc.DevicePluginStub]]:
    plugin_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="kg-"))
    server = ResourceServer(build_resources(INVENTORY)[0], plugin_dir, AllocateOptions(), INVENTORY.link_map)
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        yield server, api_pb2_grpc.DevicePluginStub(channel)
    await server.stop()
    assert not server.socket_path.exists()


async def test_options(served) -> None:
    _, stub = served
    options = await stub.GetDevicePluginOptions(api_pb2.Empty())
    assert options.get_preferred_allocation_available and not options.pre_start_required


async def test_list_and_watch_full_list_then_changes_and_recovery(served) -> None:
    server, stub = served
    stream = stub.ListAndWatch(api_pb2.Empty())
    first = await stream.read()
    assert [(d.ID, d.health, d.topology.nodes[0].ID) for d in first.devices] == [
        (gpu_uuid(i), "Healthy", n) for i, n in enumerate([0, 0, 1, 1])
    ]
    sick = INVENTORY.with_gpu_health({gpu_uuid(2): Health.failed("XID 79", 79)})
    assert await server.update(build_resources(sick)[0])
    second = await asyncio.wait_for(stream.read(), 2)
    assert [d.health for d in second.devices] == ["Healthy", "Healthy", "Unhealthy", "Healthy"]
    assert not await server.update(build_resources(sick)[0])  # no change, nothing sent
    await server.update(build_resources(INVENTORY)[0])
    third = await asyncio.wait_for(stream.read(), 2)
    assert [d.health for d in third.devices] == ["Healthy"] * 4
    stream.cancel()


async def test_preferred_allocation_picks_the_nvlinked_pair(served) -> None:
    _, stub = served
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[gpu_uuid(i) for i in (0, 2, 3)], allocation_size=2
            )
        ]
    )
    response = await stub.GetPreferredAllocation(request)
    assert sorted(response.container_responses[0].deviceIDs) == [gpu_uuid(2), gpu_uuid(3)]


async def test_allocate_and_prestart(served) -> None:
    _, stub = served
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(1)])]
    )
    response = await stub.Allocate(request)
    assert dict(response.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": gpu_uuid(1)}
    await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[gpu_uuid(1)]))


async def test_unknown_device_is_nvidias_error_and_server_keeps_serving(served) -> None:
    _, stub = served
    bad = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-x"])]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(bad)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert (
        err.value.details()
        == 'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-x'
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(api_pb2.AllocateRequest())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ok = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(0)])]
    )
    assert (await stub.Allocate(ok)).container_responses


async def test_malformed_bytes_get_an_error_not_a_crash(served) -> None:
    server, stub = served
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")  # no serializers: we send raw bytes
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\xff\xff\xff\xff garbage")
        # grpcio answers undecodable requests itself, before our handler runs.
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "Error parsing message with type 'v1beta1.AllocateRequest'" in err.value.details()
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available


ids = st.sampled_from([gpu_uuid(i) for i in range(4)]) | st.text(max_size=70)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ids, max_size=6), max_size=3))
async def test_any_allocate_request_gets_a_response_or_a_grpc_error(
    served, requests: list[list[str]]
) -> None:
    _, stub = served
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=r) for r in requests]
    )
    try:
        response = await stub.Allocate(request)
    except grpc.aio.AioRpcError as err:
        assert err.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INVALID_ARGUMENT)
        assert err.details().startswith('invalid allocation request for "nvidia.com/gpu"')
    else:
        assert len(response.container_responses) == len(requests)
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available
