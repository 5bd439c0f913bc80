"""The kubelet simulator's DRA side against a small in-test DRA driver, over real unix sockets, with claims
served by the simulated API server.

Expected texts are the kubelet's (pluginmanager operation_generator, cm/dra manager and plugin manager,
v1.32 and v1.34), written out here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubegpu.api.pluginregistration.v1 import api_pb2 as reg_pb2
from kubegpu.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.apisim import ApiServerSim
from kubegpu.kubeletsim import (
    Container,
    ContainerClaim,
    DraSettings,
    EventKind,
    KubeletSimulator,
    Pod,
    PodResourceClaim,
    PrepareError,
)
from kubegpu.resourceapi import reserved_status
from tests.dra_objects import claim, gpu, request, resource_slice

DRIVER = "gpu.nvidia.com"
WAIT = 5.0


class FakeDriver:
    """A DRA driver: registration on <registry>/<driver>-reg.sock, the DRA service on its own socket,
    both DRAPlugin versions, and answers the test can change."""

    def __init__(
        self,
        root: Path,
        *,
        name: str = DRIVER,
        versions: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        plugin_type: str = "DRAPlugin",
        serve: tuple[str, ...] = ("v1", "v1beta1"),
        socket_name: str | None = None,
    ) -> None:
        self.name = name
        self.versions = versions
        self.plugin_type = plugin_type
        self.serve_versions = serve
        self.reg_socket = root / "plugins_registry" / (socket_name or f"{name}-reg.sock")
        self.dra_socket = root / "plugins" / name / "dra.sock"
        self.info_delay = 0.0
        self.prepare_delay = 0.0
        self.claim_errors: dict[str, str] = {}  # claim name -> error
        self.leave_out = False
        self.extra_uid = ""
        self.notifications: list[reg_pb2.RegistrationStatus] = []
        self.prepares: list[tuple[str, Any]] = []  # (version, request)
        self.unprepares: list[tuple[str, Any]] = []
        self._server: grpc.aio.Server | None = None

    async def start(self) -> FakeDriver:
        self.reg_socket.parent.mkdir(parents=True, exist_ok=True)
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if "v1" in self.serve_versions:
            dra_v1_grpc.add_DRAPluginServicer_to_server(_Node(self, "v1", dra_v1), server)
        if "v1beta1" in self.serve_versions:
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_Node(self, "v1beta1", dra_v1beta1), server)
        server.add_insecure_port(f"unix:{self.dra_socket}")
        server.add_insecure_port(f"unix:{self.reg_socket}")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        self.reg_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: FakeDriver) -> None:
        self.d = driver

    async def GetInfo(self, request: reg_pb2.InfoRequest, context: object) -> reg_pb2.PluginInfo:
        await asyncio.sleep(self.d.info_delay)
        return reg_pb2.PluginInfo(
            type=self.d.plugin_type,
            name=self.d.name,
            endpoint=str(self.d.dra_socket),
            supported_versions=self.d.versions,
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: object
    ) -> reg_pb2.RegistrationStatusResponse:
        self.d.notifications.append(request)
        return reg_pb2.RegistrationStatusResponse()


class _Node:
    def __init__(self, driver: FakeDriver, version: str, pb: Any) -> None:
        self.d, self.version, self.pb = driver, version, pb

    async def NodePrepareResources(self, request: Any, context: object) -> Any:
        self.d.prepares.append((self.version, request))
        await asyncio.sleep(self.d.prepare_delay)
        response = self.pb.NodePrepareResourcesResponse()
        for i, c in enumerate(request.claims):
            if self.d.leave_out and i == len(request.claims) - 1:
                continue
            answer = response.claims[c.uid]
            if c.name in self.d.claim_errors:
                answer.error = self.d.claim_errors[c.name]
                continue
            for request_name, device in (("gpu", "gpu-0"), ("other", "gpu-1")):
                answer.devices.append(
                    self.pb.Device(
                        request_names=[request_name],
                        pool_name="node-a",
                        device_name=device,
                        cdi_device_ids=[f"k8s.{self.d.name}/claim={c.uid}-{device}"],
                    )
                )
        if self.d.extra_uid:
            response.claims[self.d.extra_uid].SetInParent()
        return response

    async def NodeUnprepareResources(self, request: Any, context: object) -> Any:
        self.d.unprepares.append((self.version, request))
        response = self.pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].SetInParent()
        return response


# ---- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # short: unix socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim() as server:
        server.add_node("node-a")
        yield server


def settings(api: ApiServerSim | None, **overrides: Any) -> DraSettings:
    base: dict[str, Any] = {"node_name": "node-a", "api_url": api.url if api else None, "poll_interval": 0.02}
    return DraSettings(**{**base, **overrides})


@pytest.fixture
async def drivers() -> AsyncIterator[list[FakeDriver]]:
    started: list[FakeDriver] = []
    yield started
    for d in started:
        await d.stop()


async def start_driver(drivers: list[FakeDriver], root: Path, **kwargs: Any) -> FakeDriver:
    driver = await FakeDriver(root, **kwargs).start()
    drivers.append(driver)
    return driver


async def kubelet(root: Path, dra: DraSettings) -> KubeletSimulator:
    sim = KubeletSimulator(root / "device-plugins", dra=dra)
    await sim.start()
    return sim


async def eventually(predicate: Any, timeout: float = WAIT) -> None:
    """Poll for state the fake driver holds (no simulator event marks it)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the fake driver has no event to wait on
            await asyncio.sleep(0.01)


async def registered(sim: KubeletSimulator, driver: str = DRIVER) -> None:
    await sim.wait_for(lambda: bool(sim.dra_plugins(driver)), WAIT)


def allocated_claim(
    api: ApiServerSim, name: str, pod: Pod, *, driver: str = DRIVER, requests: int = 1
) -> dict[str, Any]:
    """A claim as the scheduler leaves it: allocated on node-a and reserved for `pod`."""
    reqs = [request("gpu"), request("other")][:requests]
    created = api.create("resourceclaims", claim(name, reqs))
    results = [
        {"request": r["name"], "driver": driver, "pool": "node-a", "device": f"gpu-{i}"}
        for i, r in enumerate(reqs)
    ]
    created["status"] = reserved_status({"devices": {"results": results}}, pod.name, pod.uid)
    return api.update("resourceclaims", created, status=True)


def gpu_pod(name: str, *claims: str, requests: tuple[str, ...] = ("",)) -> Pod:
    return Pod(
        name,
        containers=[
            Container(f"c{i}", claims=[ContainerClaim(f"pc-{c}", r) for c in claims])
            for i, r in enumerate(requests)
        ],
        resource_claims=[PodResourceClaim(f"pc-{c}", c) for c in claims],
    )


# ---- registration -------------------------------------------------------------------------------------


async def test_a_134_kubelet_takes_the_first_service_the_plugin_lists(
    root: Path, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(None))
    try:
        await registered(sim)
        (plugin,) = sim.dra_plugins(DRIVER)
        assert (plugin.service, plugin.endpoint) == ("v1.DRAPlugin", str(driver.dra_socket))
        await eventually(lambda: len(driver.notifications) == 1)
        assert (driver.notifications[0].plugin_registered, driver.notifications[0].error) == (True, "")
        # the simulator records a call once its answer is back: after the driver saw it
        await eventually(lambda: len(sim.rpc_calls(resource=DRIVER)) == 2)
        assert [r.method for r in sim.rpc_calls(resource=DRIVER)] == ["GetInfo", "NotifyRegistrationStatus"]
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    ("kubelet_version", "versions", "chosen"),
    [
        ("1.34", ("v1beta1.DRAPlugin", "v1.DRAPlugin"), "v1beta1.DRAPlugin"),  # the plugin's order
        ("1.32", ("v1.DRAPlugin", "v1beta1.DRAPlugin"), "v1beta1.DRAPlugin"),
        ("1.32", ("v1.DRAPlugin",), "v1alpha3.NodeService"),  # the silent fallback
    ],
)
async def test_service_choice(
    root: Path, drivers: list[FakeDriver], kubelet_version: str, versions: tuple[str, ...], chosen: str
) -> None:
    await start_driver(drivers, root, versions=versions)
    sim = await kubelet(root, settings(None, kubelet_version=kubelet_version))
    try:
        await registered(sim)
        assert sim.dra_plugins(DRIVER)[0].service == chosen
    finally:
        await sim.stop()


async def test_a_134_kubelet_refuses_a_plugin_without_a_service_it_knows(
    root: Path, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root, versions=("v1alpha3.NodeService",))
    sim = await kubelet(root, settings(None))
    try:
        event = await sim.wait_for_event(EventKind.DRA_PLUGIN_REJECTED, timeout=WAIT)
        expected = (
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of "
            f"DRA driver plugin gpu.nvidia.com at endpoint {driver.dra_socket}: "
            'none of services supported by the plugin (["v1alpha3.NodeService"]) are supported by '
            'the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
        )
        assert event.message == expected
        await eventually(lambda: bool(driver.notifications))
        assert (driver.notifications[0].plugin_registered, driver.notifications[0].error) == (False, expected)
        assert sim.dra_plugins() == []
        # The reconciler tries again (after 0.5 s), as the plugin manager does.
        await sim.wait_for(lambda: len(sim.events(EventKind.DRA_PLUGIN_REJECTED)) >= 2, WAIT)
    finally:
        await sim.stop()


async def test_other_plugin_types_have_no_handler(root: Path, drivers: list[FakeDriver]) -> None:
    driver = await start_driver(drivers, root, plugin_type="CSIPlugin")
    sim = await kubelet(root, settings(None))
    try:
        event = await sim.wait_for_event(EventKind.DRA_PLUGIN_REJECTED, timeout=WAIT)
        assert event.message == (
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin "
            f"at socket {driver.reg_socket}"
        )
    finally:
        await sim.stop()


async def test_get_info_must_answer_within_the_timeout(root: Path, drivers: list[FakeDriver]) -> None:
    driver = await start_driver(drivers, root)
    driver.info_delay = 0.5
    sim = await kubelet(root, settings(None, get_info_timeout=0.2))
    try:
        event = await sim.wait_for_event(EventKind.DRA_PLUGIN_REJECTED, timeout=WAIT)
        assert event.message == (
            "RegisterPlugin error -- failed to get plugin info using RPC GetInfo "
            f"at socket {driver.reg_socket}, "
            "err: rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        )
        driver.info_delay = 0.0
        await registered(sim)  # the retry succeeds
    finally:
        await sim.stop()


async def test_deregistration_wipes_the_drivers_slices_after_the_delay(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(api, wipe_delay=0.3))
    try:
        await registered(sim)
        api.create("resourceslices", resource_slice("node-a", [gpu(0)], name="mine"))
        api.create(
            "resourceslices", resource_slice("node-a", [gpu(1)], name="theirs", driver="other.example.com")
        )
        await driver.stop()
        await sim.wait_for_event(EventKind.DRA_PLUGIN_DEREGISTERED, resource=DRIVER, timeout=WAIT)
        assert [s["metadata"]["name"] for s in api.list("resourceslices")] == ["mine", "theirs"]  # not yet
        event = await sim.wait_for_event(EventKind.DRA_SLICES_WIPED, resource=DRIVER, timeout=WAIT)
        assert (
            event.message == "deleted driver gpu.nvidia.com's ResourceSlices of node node-a (driver gone): 1"
        )
        assert [s["metadata"]["name"] for s in api.list("resourceslices")] == ["theirs"]
        assert api.calls[-1].query == {"fieldSelector": "spec.nodeName=node-a,spec.driver=gpu.nvidia.com"}
    finally:
        await sim.stop()


async def test_a_driver_back_within_the_delay_keeps_its_slices(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(api, wipe_delay=0.5))
    try:
        await registered(sim)
        api.create("resourceslices", resource_slice("node-a", [gpu(0)], name="mine"))
        await driver.stop()
        await sim.wait_for_event(EventKind.DRA_PLUGIN_DEREGISTERED, timeout=WAIT)
        await start_driver(drivers, root)
        mark = sim.last_seq
        await sim.wait_for_event(EventKind.DRA_PLUGIN_REGISTERED, after=mark, timeout=WAIT)
        await asyncio.sleep(0.8)
        assert sim.events(EventKind.DRA_SLICES_WIPED, resource=DRIVER) == []
        assert len(api.list("resourceslices")) == 1
    finally:
        await sim.stop()


async def test_kubelet_start_wipes_every_slice_of_its_node(root: Path, api: ApiServerSim) -> None:
    api.create("resourceslices", resource_slice("node-a", [gpu(0)], name="a1"))
    api.create("resourceslices", resource_slice("node-a", [gpu(1)], name="a2", driver="other.example.com"))
    api.create("resourceslices", resource_slice("node-b", [gpu(0)], name="b1"))
    sim = await kubelet(root, settings(api))
    try:
        (event,) = sim.events(EventKind.DRA_SLICES_WIPED)
        assert event.message == "deleted all ResourceSlices of node node-a (kubelet started): 2"
        assert [s["metadata"]["name"] for s in api.list("resourceslices")] == ["b1"]
    finally:
        await sim.stop()


def _from(driver: FakeDriver) -> Any:
    return lambda event: event.data["socket"] == str(driver.reg_socket)


async def test_a_132_kubelet_replaces_a_registration_a_134_keeps_both(
    root: Path, drivers: list[FakeDriver]
) -> None:
    for version, expected in (("1.32", 1), ("1.34", 2)):
        first = await start_driver(drivers, root, socket_name="one-reg.sock")
        sim = await kubelet(root, settings(None, kubelet_version=version))
        try:
            await registered(sim)
            second = FakeDriver(root, socket_name="two-reg.sock")
            second.dra_socket = root / "plugins" / DRIVER / "dra-2.sock"
            drivers.append(await second.start())
            await sim.wait_for_event(EventKind.DRA_PLUGIN_REGISTERED, where=_from(second), timeout=WAIT)
            assert len(sim.dra_plugins(DRIVER)) == expected
            assert sim.dra_plugins(DRIVER)[-1].endpoint == str(second.dra_socket)
        finally:
            await sim.stop()
            await first.stop()
            await second.stop()


# ---- prepare and unprepare ----------------------------------------------------------------------------


async def test_prepare_unprepare_round_trip_with_cdi_ids_per_container(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(api))
    try:
        await registered(sim)
        pod = gpu_pod("train", "c1", requests=("gpu", "other", ""))
        c1 = allocated_claim(api, "c1", pod, requests=2)
        uid = c1["metadata"]["uid"]
        allocation = await sim.admit(pod)
        ((version, prepare),) = driver.prepares
        assert version == "v1"
        assert [(c.namespace, c.uid, c.name) for c in prepare.claims] == [("default", uid, "c1")]
        cdi = {name: c.run_options.cdi_devices for name, c in allocation.containers.items()}
        assert cdi == {
            "c0": (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",),
            "c1": (f"k8s.gpu.nvidia.com/claim={uid}-gpu-1",),
            "c2": (f"k8s.gpu.nvidia.com/claim={uid}-gpu-0", f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"),
        }
        state = json.loads((root / "dra_manager_state").read_text())
        data = json.loads(state["Data"])
        assert (data["kind"], data["apiVersion"]) == ("DRACheckpoint", "checkpoint.dra.kubelet.k8s.io/v1")
        (entry,) = data["ClaimInfoStateList"]
        assert (entry["ClaimUID"], entry["ClaimName"], entry["Namespace"], entry["PodUIDs"]) == (
            uid,
            "c1",
            "default",
            {pod.uid: {}},
        )
        assert entry["DriverState"]["gpu.nvidia.com"]["Devices"][0] == {
            "PoolName": "node-a",
            "DeviceName": "gpu-0",
            "RequestNames": ["gpu"],
            "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"],
        }
        await sim.terminate_pod("train")
        ((_, unprepare),) = driver.unprepares
        assert [(c.namespace, c.uid, c.name) for c in unprepare.claims] == [("default", uid, "c1")]
        assert (
            json.loads(json.loads((root / "dra_manager_state").read_text())["Data"])["ClaimInfoStateList"]
            is None
        )
        assert [r.method for r in sim.rpc_calls(resource=DRIVER)][-2:] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    finally:
        await sim.stop()


async def test_a_shared_claim_is_prepared_once_and_unprepared_with_its_last_pod(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(api))
    try:
        await registered(sim)
        first, second = gpu_pod("a", "shared"), gpu_pod("b", "shared")
        shared = allocated_claim(api, "shared", first)
        shared["status"]["reservedFor"].append({"resource": "pods", "name": "b", "uid": second.uid})
        api.update("resourceclaims", shared, status=True)
        await sim.admit(first)
        await sim.admit(second)
        assert len(driver.prepares) == 1  # already prepared: skipped
        await sim.terminate_pod("a")
        assert driver.unprepares == []  # pod b still uses it
        await sim.terminate_pod("b")
        assert len(driver.unprepares) == 1
    finally:
        await sim.stop()


async def test_one_call_per_driver_per_pod(root: Path, api: ApiServerSim, drivers: list[FakeDriver]) -> None:
    gpus = await start_driver(drivers, root)
    nics = await start_driver(drivers, root, name="nic.example.com")
    sim = await kubelet(root, settings(api))
    try:
        await registered(sim)
        await registered(sim, "nic.example.com")
        pod = gpu_pod("p", "g1", "g2", "n1")
        allocated_claim(api, "g1", pod)
        allocated_claim(api, "g2", pod)
        allocated_claim(api, "n1", pod, driver="nic.example.com")
        await sim.admit(pod)
        assert [[c.name for c in r.claims] for _, r in gpus.prepares] == [["g1", "g2"]]
        assert [[c.name for c in r.claims] for _, r in nics.prepares] == [["n1"]]
    finally:
        await sim.stop()


async def test_a_claim_error_fails_the_pod_start_and_a_retry_prepares_it(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    driver.claim_errors["c1"] = "GPU-0 is not healthy"
    sim = await kubelet(root, settings(api))
    try:
        await registered(sim)
        pod = gpu_pod("p", "c1")
        allocated_claim(api, "c1", pod)
        with pytest.raises(PrepareError) as err:
            await sim.admit(pod)
        assert (err.value.reason, err.value.message) == (
            "FailedPrepareDynamicResources",
            "Failed to prepare dynamic resources: NodePrepareResources failed for claim default/c1: "
            "GPU-0 is not healthy",
        )
        assert sim.events(EventKind.CONTAINER_STARTED) == []
        assert sim.dra_claims()[0].prepared is False
        driver.claim_errors.clear()
        await sim.prepare_resources("p")  # the kubelet's next sync
        assert sim.dra_claims()[0].prepared is True
        assert len(driver.prepares) == 2
    finally:
        await sim.stop()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("not-reserved", "pod p({uid}) is not allowed to use resource claim c1({claim_uid})"),
        ("not-allocated", "pod p({uid}) is not allowed to use resource claim c1({claim_uid})"),
        (
            "missing",
            "failed to fetch ResourceClaim c1 referenced by pod p: "
            'resourceclaims.resource.k8s.io "c1" not found',
        ),
        ("left-out", "NodePrepareResources left out 1 claims"),
        ("unknown-uid", "NodePrepareResources returned result for unknown claim UID 00000000-dead"),
        (
            "timeout",
            "NodePrepareResources failed: rpc error: code = DeadlineExceeded "
            "desc = context deadline exceeded",
        ),
        (
            "unregistered",
            "failed to get gRPC client for driver other.example.com: "
            "DRA driver other.example.com is not registered",
        ),
    ],
)
async def test_prepare_failures_in_the_kubelets_words(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver], setup: str, message: str
) -> None:
    driver = await start_driver(drivers, root)
    sim = await kubelet(root, settings(api, call_timeout=0.3))
    try:
        await registered(sim)
        pod = gpu_pod("p", "c1")
        claim_uid = ""
        if setup == "not-reserved":
            other = Pod("someone-else")
            claim_uid = allocated_claim(api, "c1", other)["metadata"]["uid"]
        elif setup == "not-allocated":
            claim_uid = api.create("resourceclaims", claim("c1"))["metadata"]["uid"]
        elif setup != "missing":
            claim_uid = allocated_claim(
                api, "c1", pod, driver="other.example.com" if setup == "unregistered" else DRIVER
            )["metadata"]["uid"]
        driver.leave_out = setup == "left-out"
        driver.extra_uid = "00000000-dead" if setup == "unknown-uid" else ""
        driver.prepare_delay = 1.0 if setup == "timeout" else 0.0
        with pytest.raises(PrepareError) as err:
            await sim.admit(pod)
        assert err.value.cause == message.format(uid=pod.uid, claim_uid=claim_uid)
    finally:
        await sim.stop()


async def test_a_132_kubelet_reads_v1beta1_claims_and_calls_v1beta1(
    root: Path, drivers: list[FakeDriver]
) -> None:
    with ApiServerSim(resource_versions=("v1beta1",)) as api:
        driver = await start_driver(drivers, root)
        sim = await kubelet(root, settings(api, kubelet_version="1.32"))
        try:
            await registered(sim)
            pod = gpu_pod("p", "c1")
            allocated_claim(api, "c1", pod)
            await sim.admit(pod)
            assert [v for v, _ in driver.prepares] == ["v1beta1"]
            claim_reads = [c.path for c in api.calls if c.method == "GET" and "resourceclaims" in c.path]
            assert claim_reads == ["/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims/c1"]
        finally:
            await sim.stop()


async def test_the_132_fallback_leaves_a_v1_only_plugin_unimplemented(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    await start_driver(drivers, root, versions=("v1.DRAPlugin",))
    sim = await kubelet(root, settings(api, kubelet_version="1.32"))
    try:
        await registered(sim)
        pod = gpu_pod("p", "c1")
        allocated_claim(api, "c1", pod)
        with pytest.raises(PrepareError) as err:
            await sim.admit(pod)
        assert err.value.cause == (
            "NodePrepareResources failed: rpc error: code = Unimplemented desc = Method not found!"
        )
    finally:
        await sim.stop()


async def test_restart_keeps_the_checkpoint_prepares_again_and_reconciles_gone_pods(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = KubeletSimulator(root / "device-plugins", dra=settings(api))
    await sim.start()
    try:
        await registered(sim)
        kept, gone = gpu_pod("kept", "c1"), gpu_pod("gone", "c2")
        allocated_claim(api, "c1", kept)
        allocated_claim(api, "c2", gone)
        await sim.admit(kept)
        await sim.admit(gone)
        sim.remove_pod("gone")  # vanished without an unprepare
        await sim.restart()
        assert "2 claim(s) from dra_manager_state" in sim.events(EventKind.KUBELET_STARTED)[-1].message
        assert [c.prepared for c in sim.dra_claims()] == [False, False]
        await registered(sim)
        await sim.prepare_resources("kept")  # the pod's next sync prepares again: drivers are idempotent
        assert [[c.name for c in r.claims] for _, r in driver.prepares] == [["c1"], ["c2"], ["c1"]]
        await sim.reconcile_dra()
        assert [[c.name for c in r.claims] for _, r in driver.unprepares] == [["c2"]]
        assert [c.claim_name for c in sim.dra_claims()] == ["c1"]
    finally:
        await sim.stop()


async def test_a_restart_that_loses_the_checkpoint_never_unprepares(
    root: Path, api: ApiServerSim, drivers: list[FakeDriver]
) -> None:
    driver = await start_driver(drivers, root)
    sim = KubeletSimulator(root / "device-plugins", dra=settings(api, keep_checkpoint=False))
    await sim.start()
    try:
        await registered(sim)
        pod = gpu_pod("p", "c1")
        allocated_claim(api, "c1", pod)
        await sim.admit(pod)
        await sim.restart()
        assert sim.dra_claims() == []
        await registered(sim)
        await sim.terminate_pod("p")
        assert driver.unprepares == []  # the driver's own cleanup must catch it
    finally:
        await sim.stop()


def test_kubelet_sim_command_with_dra(root: Path) -> None:
    with ApiServerSim() as api:
        api.create("resourceslices", resource_slice("node-x", [gpu(0)], name="x"))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "kubelet-sim",
                "--dir",
                str(root / "device-plugins"),
                "--json",
                "--dra",
                api.url,
                "--node-name",
                "node-x",
                "--kubelet-version",
                "1.32",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stdout is not None
            kinds = []
            for line in proc.stdout:
                event = json.loads(line)
                kinds.append(event["kind"])
                if event["kind"] == "kubelet-started":
                    assert f"DRA plugins on {root / 'plugins_registry'}" in event["message"]
                    break
            assert kinds == ["dra-slices-wiped", "kubelet-started"]
            assert api.list("resourceslices") == []
            assert any("/resource.k8s.io/v1beta1/resourceslices" in c.path for c in api.calls)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            proc.wait()
