"""ResourceServer over a real unix socket, driven by a plain gRPC client (no kubelet involved)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import stat
import tempfile
import types
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import Resource, build_resources
from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.node.inventory import Health
from kubegpu.plugin import server as server_module
from kubegpu.plugin.server import ResourceServer
from tests.allocation.test_preferred import replicas
from tests.builders import gpu_uuid, make_inventory

INVENTORY = make_inventory(4, {(0, 1): 12, (2, 3): 12}, numa=[0, 0, 1, 1])


@contextlib.asynccontextmanager
async def serving(resource: Resource) -> AsyncIterator[tuple[ResourceServer, api_pb2_grpc.DevicePluginStub]]:
    plugin_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="kg-"))
    server = ResourceServer(resource, plugin_dir, AllocateOptions(), INVENTORY.link_map)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            yield server, api_pb2_grpc.DevicePluginStub(channel)
    finally:
        await server.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    assert not server.socket_path.exists()


@pytest.fixture
async def served() -> AsyncIterator[tuple[ResourceServer, api_pb2_grpc.DevicePluginStub]]:
    async with serving(build_resources(INVENTORY)[0]) as pair:
        yield pair


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
    # More IDs than devices, one of them unknown: NVIDIA's unknown-device check comes first, text and code.
    crowded = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(0)] * 50 + ["GPU-x"])]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(crowded)
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


async def test_an_unknown_id_in_the_second_container_gets_nvidias_text_and_code(served) -> None:
    # Five containers of four IDs on a 4-GPU resource (20 > 4), the last one naming an unknown device: NVIDIA
    # checks each container's IDs before anything else, so the answer is its unknown-device error.
    _, stub = served
    known = [gpu_uuid(i) for i in range(4)]
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=known) for _ in range(4)]
        + [api_pb2.ContainerAllocateRequest(devices_ids=["GPU-not-here"])]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(request)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-not-here'
    )


async def test_an_unknown_device_in_a_later_container_gets_nvidias_refusal(served) -> None:
    # Each container's count is within what the node advertises (4), and so is their sum: whichever
    # check runs first, the only thing wrong is the unknown ID, so NVIDIA's text and code are the answer.
    _, stub = served
    for containers in (
        [[gpu_uuid(0)], ["GPU-not-on-this-node"]],
        [[gpu_uuid(0)], [gpu_uuid(1)], [gpu_uuid(2), "GPU-not-on-this-node"]],
    ):
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(request)
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert err.value.details() == (
            'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: '
            "GPU-not-on-this-node"
        )


async def test_malformed_bytes_get_an_error_not_a_crash(served) -> None:
    server, stub = served
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
        raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")  # no serializers: we send raw bytes
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(b"\xff\xff\xff\xff garbage")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(
            "Allocate for nvidia.com/gpu: the request body (12 bytes) is not a valid "
            "v1beta1.AllocateRequest: Error parsing message with type 'v1beta1.AllocateRequest'"
        )
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available


@pytest.fixture
def fresh_log_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers' log throttles start empty in each test (they are per process)."""
    logger = logging.getLogger(server_module.__name__)
    monkeypatch.setattr(server_module, "REFUSALS", LogThrottle(logger, interval_s=60, burst=5))
    monkeypatch.setattr(server_module, "UNDECODABLE", LogThrottle(logger, interval_s=60, burst=1))


async def test_undecodable_bodies_get_invalid_argument_and_one_warning_line(
    served, caplog: pytest.LogCaptureFixture, fresh_log_limits: None
) -> None:
    # grpcio itself logged an ERROR with a six-line traceback per undecodable body and answered UNKNOWN.
    server, stub = served
    garbage = b"\xff\xff\xff\xff garbage"
    with caplog.at_level(logging.DEBUG):
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            for method in (
                "Allocate",
                "GetPreferredAllocation",
                "PreStartContainer",
                "GetDevicePluginOptions",
            ):
                raw = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}")
                for _ in range(50):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await raw(garbage)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
                    assert f"{method} for nvidia.com/gpu: the request body (12 bytes)" in err.value.details()
            stream = channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch")(garbage)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stream.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    warnings = [r for r in caplog.records if "is not a valid" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "\n" not in warnings[0].getMessage() and warnings[0].exc_info is None
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available


def many_ids(count: int) -> list[str]:
    return [f"GPU-{i:036d}" for i in range(count)]


async def test_a_request_beyond_the_receive_limit_is_resource_exhausted_and_serving_goes_on(served) -> None:
    server, stub = served
    assert server.receive_limit == 65536  # 4 GPUs: the floor of 64 KiB
    four_mb = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=many_ids(95_000))]
    )
    assert four_mb.ByteSize() > 3_900_000  # under gRPC's default 4 MiB: it used to be read and parsed
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(four_mb)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ok = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(0)])]
    )
    assert (await stub.Allocate(ok)).container_responses


async def test_the_largest_request_a_kubelet_sends_is_accepted() -> None:
    # 8 GPUs x 200 replicas: a GetPreferredAllocation listing every device as available and as must-include.
    resource = replicas(200, gpus=8)
    all_ids = [d.id for d in resource.devices]
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=all_ids, must_include_deviceIDs=all_ids, allocation_size=len(all_ids)
            )
        ]
    )
    assert request.ByteSize() > 65536  # beyond the floor: the limit follows the devices served
    async with serving(resource) as (server, stub):
        assert server.receive_limit >= request.ByteSize()
        response = await stub.GetPreferredAllocation(request)
        assert list(response.container_responses[0].deviceIDs) == all_ids


async def test_a_resource_that_outgrows_the_limit_says_so_and_starts_again_with_a_larger_one() -> None:
    small = build_resources(INVENTORY)[0]
    big = replicas(300, gpus=4)
    async with serving(small) as (server, _):
        assert (server.incarnation, server.receive_limit, server.outgrown) == (1, 65536, False)
        told: list[bool] = []
        server.on_outgrown = lambda: told.append(True)
        assert await server.update(big)
        assert server.outgrown and told == [True]  # the registrar restarts it, under its lock
        await server.stop()
        await server.start()
        assert server.incarnation == 2 and not server.outgrown
        ids = [d.id for d in big.devices]
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids, must_include_deviceIDs=ids, allocation_size=len(ids)
                )
            ]
        )
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            response = await api_pb2_grpc.DevicePluginStub(channel).GetPreferredAllocation(request)
        assert len(response.container_responses[0].deviceIDs) == 1200
        assert not await server.update(big) and told == [True]  # the same list again: nothing to do


async def test_streams_beyond_their_limit_are_resource_exhausted_and_unary_calls_go_on(served) -> None:
    _, stub = served
    streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(8)]
    for stream in streams:
        await stream.read()  # each one is open and served
    extra = stub.ListAndWatch(api_pb2.Empty())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await extra.read()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available
    for stream in streams:
        stream.cancel()
    async with asyncio.timeout(10):
        while True:  # the server sees the cancellations on its own schedule
            again = stub.ListAndWatch(api_pb2.Empty())
            try:
                await again.read()
                again.cancel()
                break
            except grpc.aio.AioRpcError as busy:
                assert busy.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await asyncio.sleep(0.05)


async def test_a_refused_request_is_freed_at_once_not_at_the_next_full_collection(served) -> None:
    # context.abort() raises; the traceback held the handler's frame (and the request) in a reference cycle
    # until the next full collection: 100 refused 4 MB requests in flight peaked at over 1 GB.
    _, stub = served
    bad = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
    )
    bad_preferred = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["GPU-nope"], allocation_size=1)
        ]
    )
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    logging.disable(logging.CRITICAL)  # pytest keeps every log record, and a record keeps its arguments
    try:
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Allocate(bad)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetPreferredAllocation(bad_preferred)
        gc.collect()
        ours = [
            o
            for o in gc.garbage
            if isinstance(o, types.FrameType) and o.f_code.co_filename == server_module.__file__
        ]
    finally:
        logging.disable(logging.NOTSET)
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


async def test_the_socket_is_the_owners_alone_whatever_the_umask() -> None:
    previous = os.umask(0)
    try:
        async with serving(build_resources(INVENTORY)[0]) as (server, stub):
            assert stat.S_IMODE(os.stat(server.socket_path).st_mode) == 0o600
            assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available
    finally:
        os.umask(previous)
    assert os.umask(previous) == previous  # the server gave the process its umask back


KNOWN = [gpu_uuid(i) for i in range(4)]
known_ids = st.sampled_from(KNOWN)
ids = known_ids | st.text(max_size=70)
# Requests a kubelet could send (each container non-empty, unique known IDs), with now and then one
# container after the first spoiled: the case a check of the first container alone would answer.
plausible = st.lists(st.lists(known_ids, min_size=1, max_size=2, unique=True), min_size=2, max_size=3)
spoiled = st.tuples(plausible, st.integers(1, 2), ids).map(
    lambda t: [*t[0][: t[1]], [*t[0][t[1] % len(t[0])], t[2]], *t[0][t[1] + 1 :]]
)


def acceptable(requests: list[list[str]]) -> bool:
    """What NVIDIA's plugin (and ours) must answer: every container names known devices, each once."""
    return bool(requests) and all(r and len(set(r)) == len(r) and set(r) <= set(KNOWN) for r in requests)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ids, max_size=6), max_size=3) | plausible | spoiled)
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
        assert not (acceptable(requests) and sum(map(len, requests)) <= len(KNOWN)), err.details()
    else:
        # Only known, unique IDs, and per container exactly the ones it asked for, in its order.
        assert acceptable(requests)
        answered = [r.envs["NVIDIA_VISIBLE_DEVICES"].split(",") for r in response.container_responses]
        assert answered == requests
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ids, max_size=6), st.lists(ids, max_size=3), st.integers(-1, 6))
async def test_any_preferred_request_gets_an_answer_or_invalid_argument(
    served, available: list[str], must: list[str], size: int
) -> None:
    _, stub = served
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    try:
        response = await stub.GetPreferredAllocation(request)
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().isprintable() and len(err.details()) < 400
    else:
        chosen = list(response.container_responses[0].deviceIDs)
        assert len(chosen) == len(set(chosen)) == size
        assert set(must) <= set(chosen) <= set(available)
    assert (await stub.GetDevicePluginOptions(api_pb2.Empty())).get_preferred_allocation_available
