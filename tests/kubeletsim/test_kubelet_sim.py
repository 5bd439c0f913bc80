"""The kubelet simulator against a small in-test device plugin, over real unix sockets."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from kubegpu.api.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.kubeletsim import (
    AdmissionError,
    Container,
    ContainerStartError,
    DeviceState,
    EventKind,
    ExtendedResourceClaim,
    KubeletSimulator,
    Pod,
    RequestMapping,
)
from kubegpu.kubeletsim.poddevices import PodDevices, ResourceAllocation

RES = "example.com/gpu"
WAIT = 5.0


def device(id_: str, health: str = "Healthy", numa: int | None = None) -> api_pb2.Device:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    return api_pb2.Device(ID=id_, health=health, topology=topology)


FOUR = [device(f"dev{i}") for i in range(4)]


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin that records what the kubelet asked and answers predictably."""

    def __init__(
        self, devices: list[api_pb2.Device], *, preferred: bool = False, prestart: bool = False
    ) -> None:
        self.devices = devices
        self.options = api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=preferred, pre_start_required=prestart
        )
        self.options_error: str | None = None
        self.allocate_error: str | None = None
        self.empty_allocate = False
        self.preferred_answer: list[str] | None = None  # None: the highest IDs available
        self.preferred_requests: list[api_pb2.PreferredAllocationRequest] = []
        self.allocate_requests: list[api_pb2.AllocateRequest] = []
        self.prestart_requests: list[api_pb2.PreStartContainerRequest] = []
        self._updates: asyncio.Queue[list[api_pb2.Device] | None] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None

    async def serve(self, socket: Path) -> None:
        self._server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    def send(self, devices: list[api_pb2.Device]) -> None:
        self._updates.put_nowait(devices)

    def end_stream(self) -> None:
        self._updates.put_nowait(None)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        if self.options_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.options_error)
        return self.options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        devices: list[api_pb2.Device] | None = self.devices
        while devices is not None:
            yield api_pb2.ListAndWatchResponse(devices=devices)
            devices = await self._updates.get()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        self.preferred_requests.append(request)
        (req,) = request.container_requests
        chosen = list(req.must_include_deviceIDs)
        for d in sorted(req.available_deviceIDs, reverse=True):
            if len(chosen) < req.allocation_size and d not in chosen:
                chosen.append(d)
        answer = self.preferred_answer if self.preferred_answer is not None else chosen
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=answer)]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        self.allocate_requests.append(request)
        if self.allocate_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        if self.empty_allocate:
            return api_pb2.AllocateResponse()
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs={"FAKE_VISIBLE_DEVICES": ",".join(sorted(r.devices_ids))},
                    devices=[
                        api_pb2.DeviceSpec(container_path=f"/dev/{d}", host_path=f"/dev/{d}")
                        for d in r.devices_ids
                    ],
                )
                for r in request.container_requests
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        self.prestart_requests.append(request)
        return api_pb2.PreStartContainerResponse()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short: a unix socket path must fit in 108 bytes.
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="ksim-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def sim(plugin_dir: Path) -> AsyncIterator[KubeletSimulator]:
    simulator = KubeletSimulator(plugin_dir, dial_timeout=0.3)
    await simulator.start()
    yield simulator
    await simulator.stop()


async def register(
    plugin_dir: Path,
    resource: str = RES,
    endpoint: str = "fake.sock",
    version: str = "v1beta1",
    options: api_pb2.DevicePluginOptions | None = None,
) -> None:
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/kubelet.sock") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version=version, endpoint=endpoint, resource_name=resource, options=options
            )
        )


async def register_error(plugin_dir: Path, **kwargs: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await register(plugin_dir, **kwargs)
    return caught.value


async def plugged_in(sim: KubeletSimulator, plugin: FakePlugin, endpoint: str = "fake.sock") -> FakePlugin:
    """Serve `plugin`, register it and wait until the kubelet has read this registration's device list.

    Waiting for the list itself (not for a capacity, which an earlier registration may already show): a
    first list still in flight could otherwise land after whatever the test does next.
    """
    await plugin.serve(sim.plugin_dir / endpoint)
    mark = sim.last_seq
    await register(sim.plugin_dir, endpoint=endpoint)
    await sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=RES, after=mark, timeout=WAIT)
    return plugin


@pytest.fixture
async def plugin() -> AsyncIterator[FakePlugin]:
    fake = FakePlugin(list(FOUR), preferred=True)
    yield fake
    await fake.stop()


# ---- registration ---------------------------------------------------------------------------------


async def test_unsupported_version_is_rejected_with_the_kubelets_text(sim: KubeletSimulator) -> None:
    err = await register_error(sim.plugin_dir, version="v1alpha1")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == (
        'requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]'
    )
    assert sim.rpc_calls() == []  # rejected before dialling back
    assert [e.kind for e in sim.events()][-1] == EventKind.REGISTRATION_REJECTED


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "example.com/", "example.com/-x"])
async def test_invalid_resource_name_is_rejected_with_the_kubelets_text(
    sim: KubeletSimulator, name: str
) -> None:
    err = await register_error(sim.plugin_dir, resource=name)
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == f'the ResourceName "{name}" is invalid'


async def test_registration_fails_when_the_kubelet_cannot_dial_back(sim: KubeletSimulator) -> None:
    err = await register_error(sim.plugin_dir, endpoint="missing.sock")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == "failed to dial device plugin: context deadline exceeded"
    assert not sim.registered(RES)


async def test_registration_fails_when_options_fail(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    plugin.options_error = "not today"
    await plugin.serve(sim.plugin_dir / "fake.sock")
    err = await register_error(sim.plugin_dir)
    assert err.details() == "failed to get device plugin options: rpc error: code = Unknown desc = not today"
    assert not sim.registered(RES)


async def test_options_come_from_get_device_plugin_options(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugin.serve(sim.plugin_dir / "fake.sock")
    # The RegisterRequest claims pre-start, GetDevicePluginOptions does not: the kubelet goes by the latter.
    await register(sim.plugin_dir, options=api_pb2.DevicePluginOptions(pre_start_required=True))
    await sim.wait_for(lambda: sim.capacity().get(RES) == 4, WAIT)
    options = sim.options(RES)
    assert options is not None
    assert (options.pre_start_required, options.get_preferred_allocation_available) == (False, True)
    assert [r.method for r in sim.rpc_calls()] == ["GetDevicePluginOptions", "ListAndWatch"]
    (registered,) = sim.events(EventKind.REGISTERED)
    assert registered.message == (
        "registered example.com/gpu (endpoint fake.sock, preferred allocation: yes, pre-start: no)"
    )


# ---- ListAndWatch, capacity, allocatable ------------------------------------------------------------


async def test_capacity_counts_every_device_allocatable_only_healthy(sim: KubeletSimulator) -> None:
    fake = FakePlugin(
        [device("dev0", numa=0), device("dev1", numa=1), device("dev2"), device("dev3", "Unhealthy")]
    )
    try:
        await plugged_in(sim, fake)
        assert sim.capacity() == {RES: 4}
        assert sim.allocatable() == {RES: 3}
        assert sim.devices(RES) == {
            "dev0": DeviceState("Healthy", (0,)),
            "dev1": DeviceState("Healthy", (1,)),
            "dev2": DeviceState("Healthy", ()),
            "dev3": DeviceState("Unhealthy", ()),
        }
        assert sim.events(EventKind.DEVICES_UPDATED)[-1].message == (
            "example.com/gpu: capacity 4, allocatable 3 (dev3 Unhealthy)"
        )

        # Every message is the whole list: dev0 disappears, and any health but "Healthy" is unhealthy.
        mark = sim.last_seq
        fake.send([device("dev1"), device("dev2", "unhealthy"), device("dev3")])
        seen = await sim.wait_for_event(
            EventKind.DEVICES_UPDATED, after=mark, where=lambda e: "dev2" in e.data["unhealthy"], timeout=WAIT
        )
        assert seen.data == {"devices": 3, "healthy": 2, "unhealthy": ["dev2"]}
        assert sim.capacity() == {RES: 3}
        assert sim.allocatable() == {RES: 2}
        checkpoint = json.loads((sim.plugin_dir / "kubelet_internal_checkpoint").read_text())
        assert checkpoint == {
            "Data": {"PodDeviceEntries": None, "RegisteredDevices": {RES: ["dev1", "dev3"]}},
            "Checksum": 0,
        }
    finally:
        await fake.stop()


async def test_stream_end_makes_every_device_unhealthy(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugged_in(sim, plugin)
    plugin.end_stream()
    ended = await sim.wait_for_event(EventKind.STREAM_ENDED, resource=RES, timeout=WAIT)
    assert "ListAndWatch ended unexpectedly: EOF" in ended.message
    assert sim.capacity() == {RES: 4}
    assert sim.allocatable() == {RES: 0}
    assert not sim.registered(RES)
    with pytest.raises(AdmissionError) as rejected:
        await sim.admit(Pod("p", containers=[Container("c", {RES: 1})]))
    assert str(rejected.value) == (
        "Allocate failed due to no healthy devices present; "
        "cannot allocate unhealthy devices example.com/gpu, which is unexpected"
    )


async def test_plugin_server_going_away_ends_the_stream(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugged_in(sim, plugin)
    await plugin.stop()
    await sim.wait_for(lambda: sim.allocatable() == {RES: 0}, WAIT)
    assert sim.capacity() == {RES: 4}


async def test_old_registrations_stream_end_drops_the_new_one(sim: KubeletSimulator) -> None:
    # kubelet v1.32 looks the client up by resource name when a stream ends: re-registering before the old
    # server is stopped leaves the resource unhealthy once the old stream goes. (`plugged_in` waits for the
    # new stream's first list: read after the old stream's end, it would make the devices healthy again,
    # as in the real kubelet, and this test failed about 1 run in 50.)
    old, new = FakePlugin(list(FOUR)), FakePlugin(list(FOUR))
    try:
        await plugged_in(sim, old, "old.sock")
        await plugged_in(sim, new, "new.sock")
        assert sim.registered(RES)
        assert "replacing example.com/gpu (old.sock)" in sim.events(EventKind.REGISTERED)[-1].message
        old.end_stream()
        await sim.wait_for(lambda: sim.allocatable() == {RES: 0}, WAIT)
        assert not sim.registered(RES)
    finally:
        await old.stop()
        await new.stop()


async def test_stopped_resource_drops_to_zero_after_the_grace_period(
    plugin_dir: Path, plugin: FakePlugin
) -> None:
    async with KubeletSimulator(plugin_dir, stop_grace_period=0.2) as sim:
        await plugged_in(sim, plugin)
        await sim.admit(Pod("holder", containers=[Container("c", {RES: 1})]))
        plugin.end_stream()
        await sim.wait_for_event(EventKind.RESOURCE_REMOVED, resource=RES, timeout=WAIT)
        assert sim.capacity() == {RES: 0}
        assert sim.allocatable() == {RES: 0}

        # A pod still holds devices of the resource, so the device manager handles it and finds it gone.
        with pytest.raises(AdmissionError, match=r"cannot allocate unregistered device example\.com/gpu"):
            await sim.admit(Pod("second", containers=[Container("c", {RES: 1})]))

        # Once nobody holds any, the node's capacity of 0 rejects the pod.
        sim.remove_pod("holder")
        with pytest.raises(AdmissionError) as rejected:
            await sim.admit(Pod("third", containers=[Container("c", {RES: 1})]))
        assert rejected.value.reason == "OutOfexample.com/gpu"
        assert str(rejected.value) == (
            "Node didn't have enough resource: example.com/gpu, requested: 1, used: 0, capacity: 0"
        )


# ---- kubelet restart ------------------------------------------------------------------------------


async def test_kubelet_stop_disconnects_every_plugin(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugged_in(sim, plugin)
    await sim.stop()
    assert sim.capacity() == {RES: 4}
    assert sim.allocatable() == {RES: 0}
    assert [e.resource for e in sim.events(EventKind.DISCONNECTED)] == [RES]
    assert not sim.socket_path.exists()


async def test_restart_wipes_the_directory_and_waits_for_reregistration(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    await sim.admit(Pod("before", containers=[Container("c", {RES: 2})]))
    (sim.plugin_dir / "stray.txt").write_text("x")
    (sim.plugin_dir / "link").symlink_to(sim.plugin_dir / "stray.txt")
    (sim.plugin_dir / "subdir").mkdir()

    await sim.restart()

    assert sorted(os.listdir(sim.plugin_dir)) == ["kubelet.sock", "kubelet_internal_checkpoint", "subdir"]
    assert sim.capacity() == {RES: 0}
    assert sim.allocatable() == {RES: 0}
    assert not sim.registered(RES)
    assert sim.events(EventKind.KUBELET_STARTED)[-1].data["waiting"] == [RES]

    # The plugin notices, serves a fresh socket and registers again.
    await plugin.stop()
    again = FakePlugin(list(FOUR), preferred=True)
    try:
        await plugged_in(sim, again)
        assert sim.allocatable() == {RES: 4}
        # The pod admitted before the restart still holds its 2 devices (restored from the checkpoint).
        with pytest.raises(AdmissionError, match=r"Requested: 3, Available: 2"):
            await sim.admit(Pod("after", containers=[Container("c", {RES: 3})]))
    finally:
        await again.stop()


async def test_a_restart_that_keeps_plugin_sockets_leaves_them_serving(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    kubelet_socket = sim.socket_path.stat()
    await sim.restart(keep_plugin_sockets=True)

    assert sorted(os.listdir(sim.plugin_dir)) == ["fake.sock", "kubelet.sock", "kubelet_internal_checkpoint"]
    assert (sim.socket_path.stat().st_ino, sim.socket_path.stat().st_ctime_ns) != (
        kubelet_socket.st_ino,
        kubelet_socket.st_ctime_ns,
    )  # only kubelet.sock's identity tells the plugin
    assert sim.allocatable() == {RES: 0} and not sim.registered(RES)
    assert sim.events(EventKind.KUBELET_STARTED)[-1].data["kept_plugin_sockets"] is True

    # The plugin, still serving on its old socket, registers again and is dialed there.
    mark = sim.last_seq
    await register(sim.plugin_dir)
    await sim.wait_for_event(EventKind.DEVICES_UPDATED, resource=RES, after=mark, timeout=WAIT)
    assert sim.allocatable() == {RES: 4}
    allocation = await sim.admit(Pod("after", containers=[Container("c", {RES: 2})]))
    assert len(allocation.containers["c"].devices[RES]) == 2


async def test_a_second_kubelet_on_the_same_directory_is_refused(sim: KubeletSimulator) -> None:
    with pytest.raises(RuntimeError, match="already serves"):
        await KubeletSimulator(sim.plugin_dir).start()


# ---- admission ------------------------------------------------------------------------------------


async def test_admission_asks_for_a_preferred_allocation_then_allocates_per_container(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    pod = Pod("train", containers=[Container("a", {RES: 2}), Container("b", {RES: 1, "cpu": 4})])
    allocation = await sim.admit(pod)

    asked = [r.container_requests for r in plugin.preferred_requests]
    assert [len(r) for r in asked] == [1, 1]
    assert sorted(asked[0][0].available_deviceIDs) == ["dev0", "dev1", "dev2", "dev3"]
    assert list(asked[0][0].must_include_deviceIDs) == []
    assert asked[0][0].allocation_size == 2
    # The second container is offered only what the first did not get.
    assert sorted(asked[1][0].available_deviceIDs) == ["dev0", "dev1"]
    assert asked[1][0].allocation_size == 1

    allocated = [r.container_requests for r in plugin.allocate_requests]
    assert [len(r) for r in allocated] == [1, 1]
    assert sorted(allocated[0][0].devices_ids) == ["dev2", "dev3"]  # the plugin's preference
    assert list(allocated[1][0].devices_ids) == ["dev1"]

    assert allocation.containers["a"].devices == {RES: ("dev2", "dev3")}
    assert allocation.containers["b"].devices == {RES: ("dev1",)}
    options = allocation.containers["a"].run_options
    assert options is not None
    assert options.envs == {"FAKE_VISIBLE_DEVICES": "dev2,dev3"}
    assert [d.container_path for d in options.devices] == ["/dev/dev2", "/dev/dev3"]
    recorded = sim.rpc_calls("GetPreferredAllocation")
    assert [r.response.container_responses[0].deviceIDs for r in recorded] == [["dev3", "dev2"], ["dev1"]]

    entries = json.loads((sim.plugin_dir / "kubelet_internal_checkpoint").read_text())["Data"][
        "PodDeviceEntries"
    ]
    assert [(e["PodUID"], e["ContainerName"], e["ResourceName"], e["DeviceIDs"]) for e in entries] == [
        (pod.uid, "a", RES, {"-1": ["dev2", "dev3"]}),
        (pod.uid, "b", RES, {"-1": ["dev1"]}),
    ]
    kept = api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(entries[0]["AllocResp"]))
    assert kept == allocation.containers["a"].responses[RES]


async def test_no_preferred_allocation_call_unless_offered(sim: KubeletSimulator) -> None:
    fake = FakePlugin(list(FOUR), preferred=False)
    try:
        await plugged_in(sim, fake)
        allocation = await sim.admit(Pod("p", containers=[Container("c", {RES: 2})]))
        assert fake.preferred_requests == []
        assert len(fake.allocate_requests) == 1
        assert len(allocation.devices(RES)) == 2
    finally:
        await fake.stop()


async def test_a_preferred_answer_is_checked_and_topped_up(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugged_in(sim, plugin)
    plugin.preferred_answer = ["bogus", "dev3"]
    allocation = await sim.admit(Pod("p", containers=[Container("c", {RES: 2})]))
    devices = allocation.devices(RES)
    assert "dev3" in devices and "bogus" not in devices and len(devices) == 2


async def test_without_a_preference_devices_are_picked_by_numa_node(sim: KubeletSimulator) -> None:
    fake = FakePlugin(
        [device("dev0", numa=1), device("dev1", numa=0), device("dev2", numa=1), device("dev3", numa=0)]
    )
    try:
        await plugged_in(sim, fake)
        allocation = await sim.admit(Pod("p", containers=[Container("c", {RES: 2})]))
        assert allocation.devices(RES) == {"dev1", "dev3"}
    finally:
        await fake.stop()


async def test_a_short_preference_is_topped_up_on_the_same_numa_node(sim: KubeletSimulator) -> None:
    fake = FakePlugin(
        [device("dev0", numa=1), device("dev1", numa=0), device("dev2", numa=1), device("dev3", numa=0)],
        preferred=True,
    )
    fake.preferred_answer = ["dev2"]
    try:
        await plugged_in(sim, fake)
        allocation = await sim.admit(Pod("p", containers=[Container("c", {RES: 2})]))
        assert allocation.devices(RES) == {"dev0", "dev2"}
    finally:
        await fake.stop()


async def test_init_container_devices_are_reused_by_app_containers(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    pod = Pod("p", init_containers=[Container("setup", {RES: 1})], containers=[Container("app", {RES: 2})])
    allocation = await sim.admit(pod)
    (setup_device,) = allocation.containers["setup"].devices[RES]
    app_request = plugin.preferred_requests[1].container_requests[0]
    assert list(app_request.must_include_deviceIDs) == [setup_device]
    assert setup_device in app_request.available_deviceIDs
    assert app_request.allocation_size == 2
    assert setup_device in allocation.containers["app"].devices[RES]


async def test_too_many_devices_requested_rolls_the_pod_back(sim: KubeletSimulator) -> None:
    fake = FakePlugin([*FOUR[:3], device("dev3", "Unhealthy")])
    try:
        await plugged_in(sim, fake)
        pod = Pod("greedy", containers=[Container("a", {RES: 2}), Container("b", {RES: 5})])
        with pytest.raises(AdmissionError) as rejected:
            await sim.admit(pod)
        assert rejected.value.reason == "UnexpectedAdmissionError"
        # Container a took 2 of the 3 healthy devices before b failed.
        assert str(rejected.value) == (
            "Allocate failed due to requested number of devices unavailable for example.com/gpu. "
            "Requested: 5, Available: 1, which is unexpected"
        )
        assert len(fake.allocate_requests) == 1
        # Rolled back: all 3 healthy devices are available again.
        allocation = await sim.admit(Pod("fits", containers=[Container("c", {RES: 3})]))
        assert allocation.devices(RES) == {"dev0", "dev1", "dev2"}
        assert sim.events(EventKind.POD_REJECTED)[-1].data["pod"] == "greedy"
    finally:
        await fake.stop()


async def test_an_allocate_response_without_containers_is_an_error(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    plugin.empty_allocate = True
    with pytest.raises(AdmissionError) as rejected:
        await sim.admit(Pod("p", containers=[Container("c", {RES: 1})]))
    assert str(rejected.value) == (
        "Allocate failed due to no containers return in allocation response "
        "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}, which is unexpected"
    )
    assert sim.pods == {}


async def test_an_allocate_rpc_error_rejects_the_pod(sim: KubeletSimulator, plugin: FakePlugin) -> None:
    await plugged_in(sim, plugin)
    plugin.allocate_error = "out of luck"
    with pytest.raises(AdmissionError) as rejected:
        await sim.admit(Pod("p", containers=[Container("c", {RES: 1})]))
    assert str(rejected.value) == (
        "Allocate failed due to rpc error: code = Unknown desc = out of luck, which is unexpected"
    )


async def test_unknown_extended_resources_are_left_to_the_cluster(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    await plugged_in(sim, plugin)
    allocation = await sim.admit(Pod("p", containers=[Container("c", {"other.io/thing": 1})]))
    assert allocation.containers["c"].devices == {}
    assert plugin.allocate_requests == []


async def test_pre_start_container_runs_before_every_start(sim: KubeletSimulator) -> None:
    fake = FakePlugin(list(FOUR), prestart=True)
    try:
        await plugged_in(sim, fake)
        allocation = await sim.admit(Pod("p", containers=[Container("c", {RES: 2})]))
        held = sorted(allocation.devices(RES))
        assert [sorted(r.devices_ids) for r in fake.prestart_requests] == [held]

        await sim.start_container("p", "c")  # a container restart
        assert len(fake.prestart_requests) == 2

        fake.end_stream()
        await sim.wait_for(lambda: not sim.registered(RES), WAIT)
        with pytest.raises(ContainerStartError) as failed:
            await sim.start_container("p", "c")
        assert str(failed.value) == (
            "device plugin PreStartContainer rpc failed with err: endpoint example.com/gpu (fake.sock) "
            "has been stopped"
        )
        assert "p" in sim.pods  # still admitted, still holding its devices
    finally:
        await fake.stop()


def test_run_options_merge_first_value_wins() -> None:
    first = api_pb2.ContainerAllocateResponse(
        envs={"A": "1", "B": "1"},
        devices=[api_pb2.DeviceSpec(container_path="/dev/x", host_path="/dev/x1")],
        mounts=[api_pb2.Mount(container_path="/m", host_path="/h1")],
        annotations={"k": "1"},
        cdi_devices=[api_pb2.CDIDevice(name="vendor.com/gpu=0")],
    )
    second = api_pb2.ContainerAllocateResponse(
        envs={"B": "2", "C": "2"},
        devices=[
            api_pb2.DeviceSpec(container_path="/dev/x", host_path="/dev/x2"),
            api_pb2.DeviceSpec(container_path="/dev/y", host_path="/dev/y2"),
        ],
        mounts=[api_pb2.Mount(container_path="/m", host_path="/h2")],
        annotations={"k": "2"},
        cdi_devices=[api_pb2.CDIDevice(name="vendor.com/gpu=0"), api_pb2.CDIDevice(name="vendor.com/gpu=1")],
    )
    pod_devices = PodDevices()
    pod_devices.insert("uid", "c", "a.io/x", ResourceAllocation({-1: ("x",)}, first))
    pod_devices.insert("uid", "c", "b.io/y", ResourceAllocation({-1: ("y",)}, second))
    options = pod_devices.run_container_options("uid", "c")
    assert options.envs == {"A": "1", "B": "1", "C": "2"}
    assert [(d.container_path, d.host_path) for d in options.devices] == [
        ("/dev/x", "/dev/x1"),
        ("/dev/y", "/dev/y2"),
    ]
    assert [m.host_path for m in options.mounts] == ["/h1"]
    assert options.annotations == {"k": "1"}
    assert options.cdi_devices == ("vendor.com/gpu=0", "vendor.com/gpu=1")


# ---- waiting and the command ----------------------------------------------------------------------


async def test_wait_for_gives_up_with_the_last_event(sim: KubeletSimulator) -> None:
    with pytest.raises(TimeoutError, match="kubelet serving"):
        await sim.wait_for(lambda: sim.registered(RES), 0.05)


def test_kubelet_sim_command_restarts_on_sighup_and_stops_on_sigterm(plugin_dir: Path) -> None:
    command = [sys.executable, "-c", "from kubegpu.kubeletsim.cli import kubelet_sim; kubelet_sim()"]
    proc = subprocess.Popen(
        [*command, "--dir", str(plugin_dir), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None

    def next_kind() -> str:
        line = stdout.readline()
        assert line, stderr.read()
        return json.loads(line)["kind"]

    try:
        assert next_kind() == "kubelet-started"
        proc.send_signal(signal.SIGHUP)
        assert [next_kind(), next_kind()] == ["kubelet-stopped", "kubelet-started"]
        proc.send_signal(signal.SIGTERM)
        assert next_kind() == "kubelet-stopped"
        assert proc.wait(timeout=WAIT) == 0
    finally:
        proc.kill()
        proc.wait()


async def test_a_resource_the_bridge_claim_serves_takes_no_device_plugin_device(
    sim: KubeletSimulator, plugin: FakePlugin
) -> None:
    """The pod's extendedResourceClaimStatus maps the resource to a DRA claim: the device manager leaves it
    alone even though a device plugin advertises it (the kubelet's extendedResourceAllocationModeForPod)."""
    await plugged_in(sim, plugin)
    bridged = ExtendedResourceClaim(
        "p-extended-resources-x7k9p", [RequestMapping("c", RES, "container-0-request-0")]
    )
    allocation = await sim.admit(
        Pod("p", containers=[Container("c", {RES: 1})], extended_claim=bridged), start=False
    )
    assert allocation.containers["c"].devices == {}
    assert sim.rpc_calls("Allocate") == []
