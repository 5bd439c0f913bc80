"""PodResources v1: the kubelet simulator's server (the kubelet's rules) and our client, over unix sockets."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.resources import build_resources
from kubegpu.api.podresources.v1 import api_pb2, api_pb2_grpc
from kubegpu.kubeletsim import Container, KubeletSimulator, Pod
from kubegpu.node.inventory import Health
from kubegpu.plugin.metrics import PluginMetrics
from kubegpu.plugin.podresources_client import (
    DeviceHolder,
    PodResourcesClient,
    PodResourcesError,
    device_holders,
)
from kubegpu.plugin.registrar import Registrar
from kubegpu.plugin.server import ResourceServer
from tests.builders import make_inventory

GPU = "nvidia.com/gpu"
NUMA = [0, 0, 1, None]  # the last GPU reports no topology
INVENTORY = make_inventory(4, numa=NUMA)
NUMA_BY_UUID = {g.uuid: g.numa_node for g in INVENTORY.gpus}


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kg-pr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Node:
    sim: KubeletSimulator
    server: ResourceServer
    client: PodResourcesClient


@pytest.fixture
async def node(root: Path) -> AsyncIterator[Node]:
    """The simulator in the kubelet's layout, with our real ResourceServer registered on it."""
    plugin_dir = root / "device-plugins"
    sim = KubeletSimulator(plugin_dir)
    registrar = Registrar(plugin_dir, plugin_dir / "kubelet.sock")
    server = ResourceServer(build_resources(INVENTORY)[0], plugin_dir, AllocateOptions(), INVENTORY.link_map)
    await sim.start()
    await registrar.start()
    try:
        await registrar.set_servers([server])
        await sim.wait_for(lambda: sim.allocatable().get(GPU) == 4, timeout=5)
        assert sim.pod_resources_socket == root / "pod-resources" / "kubelet.sock"
        yield Node(sim, server, PodResourcesClient(sim.pod_resources_socket))
    finally:
        await registrar.close()
        await sim.stop()


TRAIN = Pod(
    "train",
    namespace="ml",
    init_containers=[
        Container("setup", {GPU: 1}),  # runs to completion first: not listed
        Container("proxy", {GPU: 1}, restartable=True),  # a sidecar: listed, first
    ],
    containers=[Container("main", {GPU: 3}), Container("log")],  # with setup's GPU again: all four
)


async def test_list_reports_what_the_kubelet_allocated_in_its_shape(node: Node) -> None:
    allocation = await node.sim.admit(TRAIN)
    (pod,) = (await node.client.list()).pod_resources
    assert (pod.name, pod.namespace) == ("train", "ml")
    assert [c.name for c in pod.containers] == ["proxy", "main", "log"]
    for container in pod.containers:
        held = allocation.containers[container.name].devices.get(GPU, ())
        assert sorted(d for entry in container.devices for d in entry.device_ids) == sorted(held)
        for entry in container.devices:
            (device_id,) = entry.device_ids  # one device per entry, as the kubelet sends them
            assert entry.resource_name == GPU
            numa = NUMA_BY_UUID[device_id]
            expected = [] if numa is None else [numa]
            assert [n.ID for n in entry.topology.nodes] == expected
            assert entry.HasField("topology") == (numa is not None)
    assert [d.device_ids for d in pod.containers[2].devices] == []
    entries = [e for c in pod.containers for e in c.devices]
    assert {e.HasField("topology") for e in entries} == {True, False}  # both shapes were exercised


async def test_device_holders_flatten_the_answer(node: Node) -> None:
    allocation = await node.sim.admit(Pod("a", containers=[Container("c", {GPU: 3})]))
    await node.sim.admit(Pod("idle", namespace="web", containers=[Container("c")]))
    holders = sorted(device_holders(await node.client.list()), key=lambda h: h.device_id)
    assert holders == [DeviceHolder("default", "a", "c", GPU, d) for d in sorted(allocation.devices(GPU))]


async def test_a_removed_pod_is_no_longer_listed(node: Node) -> None:
    await node.sim.admit(Pod("a", containers=[Container("c", {GPU: 1})]))
    node.sim.remove_pod("a")
    assert list((await node.client.list()).pod_resources) == []


async def test_allocatable_lists_healthy_devices_only(node: Node) -> None:
    sick = INVENTORY.gpus[1].uuid
    mark = node.sim.last_seq
    await node.server.update(build_resources(INVENTORY.with_gpu_health({sick: Health.failed("XID 79")}))[0])
    await node.sim.wait_for(lambda: node.sim.allocatable()[GPU] == 3 and node.sim.last_seq > mark, timeout=5)
    async with grpc.aio.insecure_channel(f"unix://{node.client.socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest())
        listed = {d for entry in response.devices for d in entry.device_ids}
        assert listed == {g.uuid for g in INVENTORY.gpus} - {sick}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(api_pb2.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"))
        assert (
            err.value.code() == grpc.StatusCode.UNKNOWN
            and err.value.details() == "PodResources API Get method disabled"
        )  # the kubelet's text


async def test_allocations_survive_a_kubelet_restart_and_the_socket_comes_back(node: Node) -> None:
    allocation = await node.sim.admit(Pod("a", containers=[Container("c", {GPU: 2})]))
    await node.sim.restart()
    holders = list(device_holders(await node.client.list()))
    assert {h.device_id for h in holders} == allocation.devices(GPU)


async def test_a_stopped_kubelet_is_a_missing_socket_that_says_what_to_mount(node: Node) -> None:
    await node.sim.stop()
    with pytest.raises(PodResourcesError) as err:
        await node.client.list()
    assert err.value.reason == "socket_missing"
    assert str(node.client.socket) in str(err.value) and "mount the kubelet's" in str(err.value)


async def test_a_socket_nobody_listens_on_is_unavailable(root: Path) -> None:
    path = root / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # a socket file left behind by a kubelet that died
    with pytest.raises(PodResourcesError) as err:
        await PodResourcesClient(path).list()
    assert err.value.reason == "unavailable"


async def test_a_plain_file_is_not_a_socket(root: Path) -> None:
    (root / "kubelet.sock").write_text("")
    with pytest.raises(PodResourcesError, match="is not a unix socket") as err:
        await PodResourcesClient(root / "kubelet.sock").list()
    assert err.value.reason == "socket_missing"


class SlowLister(api_pb2_grpc.PodResourcesListerServicer):
    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        await asyncio.sleep(2)
        return api_pb2.ListPodResourcesResponse()


async def test_a_slow_kubelet_times_out_and_an_old_one_is_an_rpc_error(root: Path) -> None:
    path = root / "kubelet.sock"
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(SlowLister(), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        with pytest.raises(PodResourcesError, match=r"within 0\.1 s") as err:
            await PodResourcesClient(path, timeout_s=0.1).list()
        assert err.value.reason == "timeout"
    finally:
        await server.stop(None)
    server = grpc.aio.server()  # serves nothing: like a kubelet without the v1 API
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        with pytest.raises(PodResourcesError, match="UNIMPLEMENTED") as err:
            await PodResourcesClient(path).list()
        assert err.value.reason == "rpc_error"
    finally:
        await server.stop(None)


async def test_only_the_kubelet_layout_gets_a_pod_resources_socket_by_default(root: Path) -> None:
    assert KubeletSimulator(root / "dp").pod_resources_socket is None
    explicit = root / "pr" / "kubelet.sock"
    sim = KubeletSimulator(root / "dp", pod_resources_socket=explicit)
    await sim.start()
    try:
        assert list((await PodResourcesClient(explicit).list()).pod_resources) == []
    finally:
        await sim.stop()
    assert not explicit.exists()


async def test_metrics_end_to_end_through_the_simulator(node: Node) -> None:
    allocation = await node.sim.admit(TRAIN)
    metrics = PluginMetrics(pod_resources=node.client, process_metrics=False)
    metrics.update_resources(build_resources(INVENTORY))
    body, _ = await metrics.render()
    text = body.decode()
    for container in ("proxy", "main"):
        for device_id in allocation.containers[container].devices[GPU]:
            assert (
                f'kubegpu_pod_device_info{{container="{container}",device_id="{device_id}",namespace="ml",'
                f'pod="train",resource="{GPU}",uuid="{device_id}"}} 1.0'
            ) in text
    assert "kubegpu_pod_resources_up 1.0" in text
    await node.sim.stop()
    body, _ = await metrics.render()
    assert "kubegpu_pod_resources_up 0.0" in body.decode()
    assert 'kubegpu_pod_resources_errors_total{reason="socket_missing"} 1.0' in body.decode()
