"""ConsumableShares with `kubegpu dra` as a process against the kubelet simulator and the fake API server.

Claims are allocated by the real structured allocator (`SimulatedDraNode.try_allocate`) from the slices the
driver publishes, so the request policies, shareIDs and consumedCapacity are the scheduler's; only the
DynamicMIG sharers are written by hand (NVIDIA's partitions publish their engines without a request policy,
so the scheduler never gives one to two claims). Expected values are NVIDIA's (docs/reference/
dra-nvidia-features.md §4) and kubegpu's documented env and status, written out."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubegpu.apisim import ApiServerSim
from kubegpu.demo.dranode import DRIVER, NODE, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from kubegpu.kubeletsim import PrepareError
from kubegpu.node.nvml import fake_smi
from kubegpu.resourceapi import reserved_status
from kubegpu.toolkit.cli import explain
from tests.contract.test_dra_dynamic_mig import H100, live_migs
from tests.contract.test_dra_timeslicing import with_fake_smi
from tests.dra_objects import claim, request
from tests.readme_blocks import readme_yaml
from tests.toolkit.test_explain_dra import node as node_object

T4_GPU0 = "GPU-0eaadbe4-c44f-4826-a1a6-b9dd837b9509"
ON_GPU0 = f'device.attributes["gpu.nvidia.com"].uuid == "{T4_GPU0}"'
T4_MEMORY = 15360 * 1024 * 1024  # 15Gi
GIB = 1024**3


def shares(mode: str, *gates: str) -> tuple[str, ...]:
    return ("--feature-gates", ",".join(("ConsumableShares=true", *gates)), "--consumable-shares", mode)


def gpu0(name: str, memory: str | None = None, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    wanted = request("gpu", selectors=[ON_GPU0])
    if memory is not None:
        wanted["exactly"]["capacity"] = {"requests": {"memory": memory}}
    return claim(name, [wanted], config=config or [])


def gpu_config(sharing: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": sharing,
            },
        },
    }


TIME_SLICED = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
MPS = gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})


def spec_env(node: DraNode, uid: str) -> dict[str, str]:
    spec = json.loads((node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
    (entry,) = spec["devices"]
    return dict(e.split("=", 1) for e in entry["containerEdits"].get("env", []))


def kubegpu_env(node: DraNode, uid: str) -> dict[str, str]:
    return {k: v for k, v in spec_env(node, uid).items() if k.startswith("KUBEGPU_")}


def result_of(allocated: dict[str, Any]) -> dict[str, Any]:
    (result,) = allocated["status"]["allocation"]["devices"]["results"]
    return dict(result)


async def started(node: DraNode, *args: str, devices: int = 4) -> None:
    node.start_driver(*args)
    await node.wait_registered()
    await node.wait_published(devices)


def explained(node: DraNode, tmp_path: Path, pending: str) -> list[str]:
    """`kubegpu explain` of a pod waiting for the claim `pending`, on a snapshot of what the driver published
    and the claims the allocator wrote: the lines for the devices it cannot have."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting", "namespace": "default"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": pending}],
                    "containers": [{"name": "main", "image": "cuda",
                                    "resources": {"claims": [{"name": "gpu"}]}}]},
           "status": {"phase": "Pending"}}  # fmt: skip
    items = [node_object(NODE), *node.slices(), *node.api.list("deviceclasses"),
             *node.api.list("resourceclaims"), pod]  # fmt: skip
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    result = CliRunner().invoke(explain, ["default/waiting", "--snapshot", str(path), "--json"])
    report = json.loads(result.output)
    return [d for n in report["dra"]["nodes"] for r in n["requests"] for d in r["devices"]]


# ---- the slices, as NVIDIA publishes them ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "capacity"),
    [
        ("memory", {"memory": {"value": "15Gi", "requestPolicy": {
            "default": "15Gi", "validRange": {"min": "1Mi", "max": "15Gi", "step": "1Mi"}}}}),
        ("unlimited", {"memory": {"value": "15Gi", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "15Gi", "step": "1Mi"}}}}),
        ("4", {"memory": {"value": "15Gi", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "15Gi", "step": "1Mi"}}},
               "shares": {"value": "4", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}}),
    ],
)  # fmt: skip
async def test_every_gpu_is_published_for_several_claims_with_nvidias_request_policy(
    mode: str, capacity: dict[str, Any]
) -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares(mode))
        for name, device in node.published().items():
            assert device["allowMultipleAllocations"] is True, name
            assert device["capacity"] == capacity, name


async def test_one_share_is_published_in_a_shape_the_api_server_accepts() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares("1"))  # NVIDIA's step 1 past max 1 would be refused by the API server
        assert node.published()["gpu-0"]["capacity"]["shares"]["requestPolicy"] == {
            "default": "1", "validRange": {"min": "1", "max": "1"}}  # fmt: skip


async def test_shares_off_publishes_what_it_did_before() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, "--feature-gates", "ConsumableShares=true")  # the flag left at disabled
        device = node.published()["gpu-0"]
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": "15Gi"}}


async def test_a_server_without_consumable_capacity_gets_whole_devices_without_a_rewrite_loop() -> None:
    node = DraNode("t4-pcie")
    node.api = ApiServerSim(feature_gates={"DRAConsumableCapacity": False})  # 1.33, or 1.34 with it off
    async with node:
        await started(node, *shares("memory"))
        await node.wait(lambda: "drops allowMultipleAllocations" in node.log(), "the warning")
        await asyncio.sleep(6)  # more than the publisher's 5 s between rewrites of a slice it disagrees with

        def writes() -> int:
            calls = list(node.api.calls)
            return sum(1 for c in calls if c.method in ("POST", "PUT") and "resourceslices" in c.path)

        settled = writes()
        await asyncio.sleep(6)
        assert writes() == settled <= 3  # the first write, and one without the fields the server drops
        assert node.published()["gpu-0"]["capacity"] == {"memory": {"value": "15Gi"}}


async def test_static_and_dynamic_mig_devices_are_shared_too_and_counters_are_left_alone() -> None:
    async with DraNode("a100-mig") as node:
        node.start_driver(*shares("memory"))
        await node.wait_registered()
        await node.wait(lambda: bool(node.published()), "published devices")
        mig = node.published()["gpu-0-mig-1g5gb-19-0"]
        assert mig["allowMultipleAllocations"] is True
        assert mig["capacity"]["memory"] == {"value": "4864Mi", "requestPolicy": {
            "default": "4864Mi", "validRange": {"min": "1Mi", "max": "4864Mi", "step": "1Mi"}}}  # fmt: skip
        assert mig["capacity"]["memorySlice0"] == {"value": "1"}  # no policy: consumed whole
    async with DraNode("mig-dynamic", env={"FEATURE_GATES": "DynamicMIG=true,ConsumableShares=true",
                                           "CONSUMABLE_SHARES": "2"}) as node:  # fmt: skip
        node.start_driver()
        await node.wait_registered()
        await node.wait_published(4 * 25)
        partition = node.published()["gpu-2-mig-1g10gb-19-3"]
        assert partition["allowMultipleAllocations"] is True
        assert partition["capacity"]["shares"] == {"value": "2", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "2", "step": "1"}}}  # fmt: skip
        assert partition["capacity"]["memory"]["requestPolicy"]["default"] == "0"
        counters = [s["spec"]["sharedCounters"] for s in node.slices() if "sharedCounters" in s["spec"]]
        assert counters and all("allowMultipleAllocations" not in c for sets in counters for c in sets)


# ---- claims sharing one GPU ------------------------------------------------------------------------------


async def test_two_claims_share_a_gpu_by_memory_and_each_sees_what_it_consumed(tmp_path: Path) -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares("memory"))
        assert node.sim is not None
        uids, share_ids = [], []
        for name, memory in (("train", "8Gi"), ("infer", "6Gi")):
            pod = claim_pod(f"pod-{name}", name)
            allocated = node.allocate(gpu0(name, memory), pod)
            result = result_of(allocated)
            assert (result["device"], result["consumedCapacity"]) == ("gpu-0", {"memory": memory})
            uids.append(allocated["metadata"]["uid"])
            share_ids.append(result["shareID"])
            await node.sim.admit(pod)
        assert kubegpu_env(node, uids[0]) == {
            "KUBEGPU_SHARE_ID": share_ids[0],
            "KUBEGPU_CONSUMED_MEMORY_BYTES": str(8 * GIB),
            "KUBEGPU_DEVICE_MEMORY_BYTES": str(T4_MEMORY),
        }
        assert kubegpu_env(node, uids[1])["KUBEGPU_CONSUMED_MEMORY_BYTES"] == str(6 * GIB)
        for name, memory, share_id in (("train", "8Gi", share_ids[0]), ("infer", "6Gi", share_ids[1])):
            assert node.api.get("resourceclaims", name)["status"]["devices"] == [
                {"driver": DRIVER, "pool": NODE, "device": "gpu-0", "shareID": share_id,
                 "data": {"consumedCapacity": {"memory": memory}, "deviceCapacity": {"memory": "15Gi"}}}
            ]  # fmt: skip
        # 1Gi is left on gpu-0: a third claim for 2Gi of it is not allocated
        assert node.try_allocate(gpu0("more", "2Gi"), claim_pod("pod-more", "more")) is None
        assert (
            "gpu.nvidia.com/node-a/gpu-0: capacity (memory: 2Gi wanted, 1Gi left on the shared device "
            "(default/infer 6Gi, default/train 8Gi))"
        ) in explained(node, tmp_path, "more")
        await node.sim.terminate_pod("pod-train")
        assert not (node.cdi / f"k8s.gpu.nvidia.com-claim_{uids[0]}.json").exists()
        assert kubegpu_env(node, uids[1])["KUBEGPU_SHARE_ID"] == share_ids[1]


async def test_in_integer_mode_n_claims_fit_and_the_next_does_not(tmp_path: Path) -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares("3"))
        assert node.sim is not None
        for i in range(3):
            pod = claim_pod(f"pod-{i}", f"c{i}")
            allocated = node.allocate(gpu0(f"c{i}"), pod)
            assert result_of(allocated)["consumedCapacity"] == {"memory": "0", "shares": "1"}
            await node.sim.admit(pod)
            env = kubegpu_env(node, allocated["metadata"]["uid"])
            assert (env["KUBEGPU_CONSUMED_SHARES"], env["KUBEGPU_DEVICE_SHARES"]) == ("1", "3")
            assert env["KUBEGPU_CONSUMED_MEMORY_BYTES"] == "0"
        assert node.try_allocate(gpu0("c3"), claim_pod("pod-3", "c3")) is None
        assert (
            "gpu.nvidia.com/node-a/gpu-0: capacity (shares: 1 wanted, 0 left on the shared device "
            "(default/c0 1, default/c1 1, default/c2 1))"
        ) in explained(node, tmp_path, "c3")


async def test_a_claim_with_another_config_for_a_shared_gpu_is_refused_with_nvidias_text() -> None:
    async with DraNode("t4-pcie") as node:
        with_fake_smi(node)
        await started(node, *shares("unlimited", "TimeSlicingSettings=true"))
        assert node.sim is not None
        first = claim_pod("plain", "c1")
        c1 = node.allocate(gpu0("c1"), first)
        await node.sim.admit(first)
        second = claim_pod("sliced", "c2")
        c2 = node.allocate(gpu0("c2", config=[TIME_SLICED]), second)
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(second)
        assert (
            f"unable to prepare claim {c2['metadata']['uid']}: requested device gpu-0 has conflicting "
            f"configuration with already prepared claim {c1['metadata']['uid']}"
        ) in str(refused.value)
        third = claim_pod("plain-too", "c3")
        node.allocate(gpu0("c3"), third)
        await node.sim.admit(third)  # the same (no) config: shared


async def test_mps_is_refused_with_nvidias_text() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares("memory"))
        assert node.sim is not None
        pod = claim_pod("mps", "c1")
        node.allocate(gpu0("c1", "4Gi", config=[MPS]), pod)
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(pod)
        assert "MPS sharing is not supported when consumable shares is enabled" in str(refused.value)


async def test_the_time_slice_stays_until_the_last_sharer_is_unprepared() -> None:
    async with DraNode("t4-pcie") as node:
        log = with_fake_smi(node)
        await started(node, *shares("memory", "TimeSlicingSettings=true"))
        assert node.sim is not None
        for name in ("a", "b"):
            pod = claim_pod(f"pod-{name}", name)
            node.allocate(gpu0(name, "4Gi", config=[TIME_SLICED]), pod)
            await node.sim.admit(pod)
        set_long = [f"-i {T4_GPU0} -c DEFAULT", f"compute-policy -i {T4_GPU0} --set-timeslice 3"]
        assert fake_smi.calls(log) == set_long * 2
        await node.sim.terminate_pod("pod-a")
        assert fake_smi.calls(log) == set_long * 2  # b still uses gpu-0: no reset
        assert "device gpu-0 is still used by another claim: kept" in node.log()
        await node.sim.terminate_pod("pod-b")
        assert fake_smi.calls(log)[4:] == [
            f"-i {T4_GPU0} -c DEFAULT",
            f"compute-policy -i {T4_GPU0} --set-timeslice 0",
        ]


async def test_a_gpu_prepared_whole_before_shares_were_on_is_not_shared() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node)  # shares off: the claim holds gpu-0 whole
        assert node.sim is not None
        first = claim_pod("pod-a", "a")
        a = node.allocate(gpu0("a"), first)
        assert "shareID" not in result_of(a)
        await node.sim.admit(first)
        assert await node.stop_driver() == 0
        await started(node, *shares("memory"))
        # a scheduler that lost track of a's allocation hands b a share of gpu-0 anyway
        second = claim_pod("pod-b", "b")
        created = node.api.create("resourceclaims", gpu0("b"))
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
                  "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "15Gi"}}  # fmt: skip
        created["status"] = reserved_status({"devices": {"results": [result]}}, second.name, second.uid)
        node.api.update("resourceclaims", created, status=True)
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(second)
        assert f"device gpu-0 is already prepared for claim default/a ({a['metadata']['uid']})" in str(
            refused.value
        )


# ---- restarts and a lost checkpoint ----------------------------------------------------------------------


PARTITIONS_SHARED = {"FEATURE_GATES": "DynamicMIG=true,ConsumableShares=true", "CONSUMABLE_SHARES": "2"}


def share_partition(node: DraNode, name: str, device: str, pod: Any, *more: str) -> str:
    """A claim holding a share of a DynamicMIG partition (and of `more`, one request each), written as the
    scheduler writes one; its UID."""
    devices = (device, *more)
    names = [f"mig{i}" for i in range(len(devices))]
    created = node.api.create("resourceclaims", claim(name, [request(n) for n in names]))
    results = [
        {"request": n, "driver": DRIVER, "pool": NODE, "device": d, "shareID": str(uuid.uuid4()),
         "consumedCapacity": {"shares": "1"}}
        for n, d in zip(names, devices, strict=True)
    ]  # fmt: skip
    allocation = {
        "devices": {"results": results},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
    }  # fmt: skip
    created["status"] = reserved_status(allocation, pod.name, pod.uid)
    return str(node.api.update("resourceclaims", created, status=True)["metadata"]["uid"])


async def test_a_shared_partition_survives_a_restart_and_the_first_sharer_leaving() -> None:
    async with DraNode("mig-dynamic", env=PARTITIONS_SHARED) as node:
        node.start_driver()
        await node.wait_registered()
        assert node.sim is not None
        device = "gpu-2-mig-3g40gb-9-4"
        uids = []
        for name in ("a", "b"):
            pod = claim_pod(f"pod-{name}", name)
            uids.append(share_partition(node, name, device, pod))
            await node.sim.admit(pod)
        (held,) = live_migs(node, H100)  # one MIG device, both claims on it
        specs = [node.cdi / f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in uids]
        written = [spec.read_text() for spec in specs]
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        node.start_driver()
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        assert "Found unexpected MIG device" not in node.log()
        assert [spec.read_text() for spec in specs] == written  # both claims' CDI specs as they were
        await node.sim.terminate_pod("pod-a")
        assert [m.uuid for m in live_migs(node, H100)] == [held.uuid]
        assert not specs[0].exists() and specs[1].exists()
        await node.sim.terminate_pod("pod-b")
        assert live_migs(node, H100) == []


async def test_a_sharer_whose_prepare_fails_leaves_the_partition_it_adopted() -> None:
    async with DraNode("mig-dynamic", env=PARTITIONS_SHARED) as node:
        node.start_driver()
        await node.wait_registered()
        assert node.sim is not None
        first = claim_pod("pod-a", "a")
        share_partition(node, "a", "gpu-2-mig-3g40gb-9-4", first)
        await node.sim.admit(first)
        (held,) = live_migs(node, H100)
        # b shares a's partition and wants one whose placement a's partition covers: NVML refuses that one
        second = claim_pod("pod-b", "b")
        share_partition(node, "b", "gpu-2-mig-3g40gb-9-4", second, "gpu-2-mig-1g10gb-19-5")
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(second)
        assert "Insufficient Resources" in str(refused.value)
        assert [m.uuid for m in live_migs(node, H100)] == [held.uuid]  # a's partition is not b's to undo


async def test_a_lost_checkpoint_rebuilds_both_sharers_and_still_refuses_a_conflicting_third() -> None:
    async with DraNode("t4-pcie") as node:
        with_fake_smi(node)
        args = shares("memory", "TimeSlicingSettings=true")
        await started(node, *args)
        assert node.sim is not None
        uids = []
        for name in ("a", "b"):
            pod = claim_pod(f"pod-{name}", name)
            uids.append(node.allocate(gpu0(name, "4Gi"), pod)["metadata"]["uid"])
            await node.sim.admit(pod)
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for lost in ("checkpoint.json", "checkpoint.json.copy"):
            (node.plugins / DRIVER / lost).unlink()

        node.start_driver(*args)
        await node.wait(
            lambda: node.log().count("registered with the kubelet as DRA driver") == 2, "re-registration"
        )
        checkpoint = node.plugins / DRIVER / "checkpoint.json"
        await node.wait(
            lambda: checkpoint.exists() and all(u in checkpoint.read_text() for u in uids),
            "both sharers rebuilt into the checkpoint",
        )
        third = claim_pod("pod-c", "c")
        c = node.allocate(gpu0("c", "4Gi", config=[TIME_SLICED]), third)
        with pytest.raises(PrepareError) as refused:
            await node.sim.admit(third)
        assert (
            f"unable to prepare claim {c['metadata']['uid']}: requested device gpu-0 has conflicting "
            "configuration with already prepared claim "
        ) in str(refused.value)
        for uid in uids:
            assert kubegpu_env(node, uid)["KUBEGPU_CONSUMED_MEMORY_BYTES"] == str(4 * GIB)


# ---- the README's claim ----------------------------------------------------------------------------------


async def test_the_readme_claim_takes_10gi_of_a_shared_gpu() -> None:
    async with DraNode("t4-pcie") as node:
        await started(node, *shares("memory"))
        assert node.sim is not None
        pod = claim_pod("notebook", "gpu-10gi")
        allocated = node.allocate(readme_yaml("consumable-shares-claim"), pod)
        assert result_of(allocated)["consumedCapacity"] == {"memory": "10Gi"}
        await node.sim.admit(pod)
        env = kubegpu_env(node, allocated["metadata"]["uid"])
        assert env["KUBEGPU_CONSUMED_MEMORY_BYTES"] == str(10 * GIB)
