"""The ResourceSlice publisher against the simulated API server, through the driver's light client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kubegpu.apisim import ApiServerSim
from kubegpu.common.backoff import Backoff
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.publisher import SlicePublisher
from kubegpu.settings.kubeaccess import ApiAccess

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def gpu(minor: int, *, taint: str | None = None) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{minor:08x}-1111-2222-3333-{minor:012x}"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        },
        "capacity": {"memory": {"value": "40Gi"}},
    }
    if taint:
        device["taints"] = [{"key": f"{DRIVER}/{taint}", "effect": "NoSchedule"}]
    return device


def fast_backoff() -> Backoff:
    return Backoff(initial=0.05, maximum=0.2)


async def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time (a generous ceiling, not a budget)")
        await asyncio.sleep(0.02)


def slices_of(api: ApiServerSim) -> list[dict[str, Any]]:
    """Our slices as stored (v1 shape), by name."""
    found = api.list("resourceslices", field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}")
    return sorted(found, key=lambda o: o["metadata"]["name"])


def pool_devices(api: ApiServerSim) -> list[str]:
    return [d["name"] for s in slices_of(api) for d in s["spec"].get("devices") or []]


def generations(api: ApiServerSim) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices_of(api)}


@pytest.fixture
def api() -> Iterator[ApiServerSim]:
    with ApiServerSim() as server:
        server.add_node(NODE)
        yield server


class Running:
    def __init__(self, api: ApiServerSim, **kwargs: Any) -> None:
        self.api_client = KubeClient(ApiAccess(server=api.url))
        self.publisher = SlicePublisher(
            self.api_client, driver_name=DRIVER, node_name=NODE, backoff=fast_backoff, **kwargs
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SlicePublisher:
        self.task = asyncio.create_task(self.publisher.run())
        return self.publisher

    async def __aexit__(self, *exc: object) -> None:
        await self.publisher.stop()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)
        self.api_client.close()


@pytest.fixture
async def running(api: ApiServerSim) -> AsyncIterator[SlicePublisher]:
    async with Running(api) as publisher:
        yield publisher


async def test_publishes_one_pool_named_after_the_node_owned_by_the_node(
    api: ApiServerSim, running: SlicePublisher
) -> None:
    running.update([gpu(0), gpu(1)])
    await eventually(lambda: len(slices_of(api)) == 1)
    (obj,) = slices_of(api)
    node_uid = api.get("nodes", NODE)["metadata"]["uid"]
    assert obj["metadata"]["name"].startswith("node-a-gpu.nvidia.com-")
    assert obj["metadata"]["generateName"] == "node-a-gpu.nvidia.com-"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": node_uid, "controller": True}
    ]
    assert obj["spec"] == {
        "driver": "gpu.nvidia.com",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": [gpu(0), gpu(1)],
    }
    assert running.version == "v1"
    await eventually(lambda: running.published_generation == 1)


async def test_every_change_bumps_the_generation_in_place(api: ApiServerSim, running: SlicePublisher) -> None:
    running.update([gpu(0), gpu(1)])
    await eventually(lambda: generations(api) == {1})
    (first,) = slices_of(api)
    running.update([gpu(0), gpu(1, taint="xid")])
    await eventually(lambda: generations(api) == {2})
    (second,) = slices_of(api)
    assert second["metadata"]["name"] == first["metadata"]["name"]  # replaced, not re-created
    assert second["spec"]["devices"][1]["taints"] == [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
    running.update([gpu(0), gpu(1)])
    await eventually(lambda: generations(api) == {3})
    assert "taints" not in slices_of(api)[0]["spec"]["devices"][1]
    assert running.last_publish_seconds is not None and running.last_publish_seconds >= 0


async def test_the_same_devices_again_write_nothing(api: ApiServerSim, running: SlicePublisher) -> None:
    running.update([gpu(0)])
    await eventually(lambda: running.published_generation == 1)
    writes = len([c for c in api.calls if c.method in ("POST", "PUT")])
    running.update([gpu(0)])
    await asyncio.sleep(0.3)
    assert len([c for c in api.calls if c.method in ("POST", "PUT")]) == writes
    assert generations(api) == {1}


async def test_large_pools_split_to_the_api_limit_and_shrink_again(api: ApiServerSim) -> None:
    async with Running(api) as publisher:
        publisher.update([gpu(i) for i in range(300)])
        await eventually(lambda: len(pool_devices(api)) == 300)
        assert sorted(len(s["spec"]["devices"]) for s in slices_of(api)) == [44, 128, 128]
        pools = {
            (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices_of(api)
        }
        assert pools == {(1, 3)}
        # one tainted device: its slice may hold only 64 (the API's limit with taints)
        publisher.update([gpu(i, taint="xid" if i == 0 else None) for i in range(300)])
        await eventually(lambda: generations(api) == {2})
        assert sorted(len(s["spec"]["devices"]) for s in slices_of(api)) == [64, 108, 128]
        assert sorted(pool_devices(api)) == sorted(f"gpu-{i}" for i in range(300))
        publisher.update([gpu(i) for i in range(10)])
        await eventually(lambda: len(slices_of(api)) == 1 and generations(api) == {3})
        assert pool_devices(api) == [f"gpu-{i}" for i in range(10)]


async def test_a_lower_limit_per_slice(api: ApiServerSim) -> None:
    async with Running(api, max_devices_per_slice=2) as publisher:
        publisher.update([gpu(i) for i in range(5)])
        await eventually(lambda: len(pool_devices(api)) == 5)
        assert sorted(len(s["spec"]["devices"]) for s in slices_of(api)) == [1, 2, 2]


async def test_a_deleted_slice_and_a_wiped_node_are_published_again(
    api: ApiServerSim, running: SlicePublisher
) -> None:
    running.update([gpu(0)])
    await eventually(lambda: generations(api) == {1})
    (obj,) = slices_of(api)
    api.delete("resourceslices", obj["metadata"]["name"])
    await eventually(
        lambda: len(slices_of(api)) == 1 and slices_of(api)[0]["metadata"]["name"] != obj["metadata"]["name"]
    )
    assert generations(api) == {2} and pool_devices(api) == ["gpu-0"]
    # the kubelet at start: DELETE on the collection with the node's field selector
    api_client = client.ApiClient(client.Configuration(host=api.url))
    client.ResourceV1Api(api_client).delete_collection_resource_slice(field_selector=f"spec.nodeName={NODE}")
    api_client.close()
    await eventually(lambda: generations(api) == {3})
    assert pool_devices(api) == ["gpu-0"]


async def test_someone_elses_edit_is_undone(api: ApiServerSim, running: SlicePublisher) -> None:
    running.update([gpu(0), gpu(1)])
    await eventually(lambda: generations(api) == {1})
    name = slices_of(api)[0]["metadata"]["name"]
    api.patch("resourceslices", name, {"spec": {"devices": [gpu(0)]}})
    await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"] and generations(api) == {2})


async def test_a_restarted_publisher_takes_its_slices_over(api: ApiServerSim) -> None:
    async with Running(api, max_devices_per_slice=1) as publisher:
        publisher.update([gpu(0), gpu(1)])
        await eventually(lambda: len(pool_devices(api)) == 2)
    names = [s["metadata"]["name"] for s in slices_of(api)]
    assert generations(api) == {1}
    writes = len([c for c in api.calls if c.method in ("POST", "PUT", "DELETE")])
    async with Running(api, max_devices_per_slice=1) as publisher:
        publisher.update([gpu(0), gpu(1)])  # what is published already: nothing to write
        await eventually(lambda: publisher.published_generation == 1)
        assert len([c for c in api.calls if c.method in ("POST", "PUT", "DELETE")]) == writes
        publisher.update([gpu(0), gpu(1, taint="xid")])
        await eventually(lambda: generations(api) == {2})
        assert [s["metadata"]["name"] for s in slices_of(api)] == names  # no duplicates, same objects


async def test_someone_who_keeps_editing_is_undone_at_a_bounded_rate(api: ApiServerSim) -> None:
    async with Running(api, foreign_edit_delay=2.0) as publisher:
        publisher.update([gpu(0), gpu(1)])
        await eventually(lambda: generations(api) == {1})
        name = slices_of(api)[0]["metadata"]["name"]
        api.patch("resourceslices", name, {"spec": {"devices": [gpu(0)]}})
        await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])  # the first edit: at once
        api.patch("resourceslices", name, {"spec": {"devices": [gpu(1)]}})
        await asyncio.sleep(0.5)
        assert pool_devices(api) == ["gpu-1"]  # the second, within the delay: not yet
        await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])


@pytest.mark.parametrize(
    ("served", "expected"), [(("v1beta2", "v1beta1"), "v1beta2"), (("v1beta1",), "v1beta1")]
)
async def test_older_servers_get_their_own_version_and_shape(served: tuple[str, ...], expected: str) -> None:
    with ApiServerSim(resource_versions=served, kubernetes_version="1.33.0") as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0)])
            await eventually(lambda: len(slices_of(api)) == 1)
            assert publisher.version == expected
        (post,) = [c for c in api.calls if c.method == "POST" and "resourceslices" in c.path]
        assert post.path == f"/apis/resource.k8s.io/{expected}/resourceslices"
        device = post.body["spec"]["devices"][0]
        if expected == "v1beta1":
            assert device == {
                "name": "gpu-0",
                "basic": {"attributes": gpu(0)["attributes"], "capacity": {"memory": {"value": "40Gi"}}},
            }
        else:
            assert device == gpu(0)
        assert slices_of(api)[0]["spec"]["devices"] == [gpu(0)]  # stored once, whatever the version


async def test_without_device_taints_a_tainted_device_leaves_the_slice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kubegpu.dra.publisher")
    with ApiServerSim(feature_gates={"DRADeviceTaints": False}) as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0), gpu(1, taint="xid")])
            await eventually(lambda: len(slices_of(api)) == 1)
            assert pool_devices(api) == ["gpu-0"]
            assert publisher.taints_served is False
            assert any(c.query.get("dryRun") == "All" for c in api.calls if c.method == "POST")
            publisher.update([gpu(0), gpu(1)])  # recovered: back in the slice
            await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])
    assert (
        "the API server drops device taints (feature gate DRADeviceTaints is off): unhealthy devices are "
        "left out of the ResourceSlices instead of being tainted; enable the gate on the API server and "
        "scheduler to keep them listed with their taint"
    ) in caplog.messages
    assert "left out of the ResourceSlices while tainted: gpu-1" in caplog.messages


async def test_with_device_taints_the_dry_run_says_so_and_the_taint_is_kept(api: ApiServerSim) -> None:
    async with Running(api) as publisher:
        publisher.update([gpu(0, taint="gpu-lost")])
        await eventually(lambda: len(slices_of(api)) == 1)
        assert publisher.taints_served is True
        assert slices_of(api)[0]["spec"]["devices"][0]["taints"] == [
            {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
        ]


async def test_no_dra_api_is_retried_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "kubegpu.dra.publisher")
    with ApiServerSim(resource_versions=()) as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0)])
            await eventually(lambda: publisher.publish_errors >= 2)
    line = caplog.messages[0]
    assert line.startswith(
        "cannot publish ResourceSlices of pool node-a (driver gpu.nvidia.com): the API server does not serve "
        "resource.k8s.io v1, v1beta2 or v1beta1: DRA needs Kubernetes 1.32 or later with the resource.k8s.io "
        "API enabled (GA and on by default from 1.34); retrying in "
    )
    assert "\n" not in line


async def test_a_missing_node_is_named_and_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "kubegpu.dra.publisher")
    with ApiServerSim() as api:
        async with Running(api) as publisher:
            publisher.update([gpu(0)])
            await eventually(lambda: publisher.publish_errors >= 1)
            api.add_node(NODE)
            await eventually(lambda: len(slices_of(api)) == 1)
    assert any(
        "node 'node-a' not found: the slices are owned by their Node; check --node-name (NODE_NAME, usually "
        "from the pod's spec.nodeName)" in m
        for m in caplog.messages
    )


async def test_an_api_server_down_at_start_is_waited_for() -> None:
    api = ApiServerSim()
    api.start()
    api.stop()  # the port is known; nothing listens
    try:
        async with Running(api) as publisher:
            publisher.update([gpu(0)])
            await eventually(lambda: publisher.publish_errors >= 2)
            api.start()
            api.add_node(NODE)
            await eventually(lambda: len(slices_of(api)) == 1)
            api.close_streams()  # a dropped watch: resumed, nothing duplicated
            publisher.update([gpu(0), gpu(1)])
            await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])
            assert len(slices_of(api)) == 1
    finally:
        api.stop()


async def test_update_is_safe_from_other_threads_and_the_latest_wins(
    api: ApiServerSim, running: SlicePublisher
) -> None:
    await asyncio.gather(*(asyncio.to_thread(running.update, [gpu(i)]) for i in range(8)))
    running.update([gpu(42)])
    await eventually(lambda: pool_devices(api) == ["gpu-42"])


async def test_a_deletion_missed_while_the_watch_was_down_is_caught_by_the_relist(
    api: ApiServerSim, running: SlicePublisher
) -> None:
    running.update([gpu(0)])
    await eventually(lambda: generations(api) == {1})
    (obj,) = slices_of(api)
    lists_before = len(api.lists("resourceslices"))
    api.delete("resourceslices", obj["metadata"]["name"])
    api.compact()  # the watch history is gone: resuming from the old resourceVersion is 410 Gone
    api.close_streams()
    await eventually(lambda: len(slices_of(api)) == 1 and generations(api) == {2})
    assert len(api.lists("resourceslices")) > lists_before


async def test_a_node_deleted_and_registered_again_gets_its_slices_back_under_the_new_uid(
    api: ApiServerSim, running: SlicePublisher
) -> None:
    running.update([gpu(0)])
    await eventually(lambda: generations(api) == {1})
    api.delete_node(NODE)  # the garbage collector takes the node's slices
    assert slices_of(api) == []
    new_uid = api.add_node(NODE)["metadata"]["uid"]
    await eventually(lambda: len(slices_of(api)) == 1)
    assert slices_of(api)[0]["metadata"]["ownerReferences"][0]["uid"] == new_uid


async def test_a_server_that_stops_serving_v1_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.dra.publisher")
    with ApiServerSim(resource_versions=("v1", "v1beta1")) as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0)])
            await eventually(lambda: generations(api) == {1})
            api.served["resource.k8s.io"] = ("v1beta1",)  # a downgrade to 1.32's API
            publisher.update([gpu(0), gpu(1)])
            await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])
            assert publisher.version == "v1beta1"
            assert len(slices_of(api)) == 1  # the same slice, taken over in the other version
    assert "publishing ResourceSlices through resource.k8s.io/v1beta1" in caplog.messages


async def test_an_idle_publisher_whose_watch_gets_404_asks_the_version_again_and_restores_its_slice() -> None:
    # Nothing to write, so only the watch sees the version go; the node's slice deleted afterwards (the
    # kubelet's wipe) must still come back, through the version now served.
    with ApiServerSim(resource_versions=("v1", "v1beta1")) as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0), gpu(1)])
            await eventually(lambda: len(pool_devices(api)) == 2)
            api.served["resource.k8s.io"] = ("v1beta1",)
            api.close_streams()  # the watch reconnects, to a version no longer served
            await eventually(lambda: publisher.version == "v1beta1")
            api.delete("resourceslices", slices_of(api)[0]["metadata"]["name"])
            await eventually(lambda: pool_devices(api) == ["gpu-0", "gpu-1"])


async def test_a_132_server_has_no_device_taints_so_a_tainted_device_leaves_the_slice() -> None:
    with ApiServerSim(resource_versions=("v1beta1",), kubernetes_version="1.32.4") as api:
        api.add_node(NODE)
        async with Running(api) as publisher:
            publisher.update([gpu(0), gpu(1, taint="gpu-lost")])
            await eventually(lambda: len(slices_of(api)) == 1)
            assert pool_devices(api) == ["gpu-0"] and publisher.taints_served is False
