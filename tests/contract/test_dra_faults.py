"""`kubegpu dra` as a process under faults, against the kubelet simulator and the simulated API server: a lost
checkpoint with claims running, an API server that refuses, hangs, or answers 500 and 429 during Prepare and
Unprepare, undecodable bodies on every socket, and calls far bigger than a kubelet sends.

After every fault nothing may be lost: each running claim still has its devices (checkpoint) and its CDI
spec, no device is held by two claims, and no spec is left without a claim. Expected texts are written out.
"""

from __future__ import annotations

import asyncio
import json
import signal
import zlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubegpu.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.apisim import Fault
from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from tests.dra_objects import claim, request

RETRY = "the kubelet will retry"


def specs_on_disk(node: DraNode) -> dict[str, list[str]]:
    """Claim UID -> the devices its CDI spec names."""
    out = {}
    prefix = "k8s.gpu.nvidia.com-claim_"
    for path in node.cdi.glob(f"{prefix}*.json"):
        uid = path.name[len(prefix) : -len(".json")]
        spec = json.loads(path.read_text())
        out[uid] = sorted(d["name"].removeprefix(f"{uid}-") for d in spec["devices"])
    return out


def checkpointed(node: DraNode) -> dict[str, list[str]]:
    """Claim UID -> devices of every PrepareCompleted claim in the checkpoint (its checksum checked)."""
    raw = json.loads((node.plugins / DRIVER / "checkpoint.json").read_text())
    assert zlib.crc32(raw["data"].encode()) == raw["checksum"]
    claims = json.loads(raw["data"])["preparedClaims"]
    assert all(c["state"] == "PrepareCompleted" for c in claims)
    return {c["uid"]: sorted(d["device"] for d in c["devices"]) for c in claims}


def assert_nothing_lost(node: DraNode, running: dict[str, list[str]]) -> None:
    assert specs_on_disk(node) == running  # each running claim has its spec, no spec without a claim
    assert checkpointed(node) == running  # ...and its devices in the checkpoint
    held = [d for devices in running.values() for d in devices]
    assert len(held) == len(set(held))  # no device held by two claims


def allocate_on(node: DraNode, name: str, pod_name: str, device: str) -> dict[str, Any]:
    """A claim allocated `device` and reserved for a pod, as a scheduler with a stale view would write it."""
    pod = claim_pod(pod_name, name)
    created = node.api.create("resourceclaims", claim(name, [request("gpu")]))
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
    }
    return node.api.update("resourceclaims", created, status=True)


async def call(node: DraNode, rpc: str, claims: list[tuple[str, str, str]], timeout: float = 20) -> Any:
    """NodePrepareResources / NodeUnprepareResources on the driver's socket, claims as (namespace, uid,
    name)."""
    async with grpc.aio.insecure_channel(f"unix:{node.plugins / DRIVER / 'dra.sock'}") as channel:
        stub = dra_v1_grpc.DRAPluginStub(channel)
        pb = [dra_v1.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        if rpc == "prepare":
            return await stub.NodePrepareResources(
                dra_v1.NodePrepareResourcesRequest(claims=pb), timeout=timeout
            )
        return await stub.NodeUnprepareResources(
            dra_v1.NodeUnprepareResourcesRequest(claims=pb), timeout=timeout
        )


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


async def started(node: DraNode, times: int = 1) -> None:
    await node.wait(
        lambda: node.log().count("registered with the kubelet as DRA driver") >= times, "registration"
    )


async def with_a_running_claim(node: DraNode, *flags: str) -> str:
    """Start the driver (with `flags`), let the kubelet run pod `job` with claim c1 (gpu-0); c1's UID."""
    node.start_driver(*flags)
    await started(node)
    await node.wait_published(4)
    assert node.sim is not None
    job = claim_pod("job", "c1")
    c1 = uid_of(node.allocate(claim("c1", [request("gpu")]), job))
    await node.sim.admit(job)
    return c1


def damage(path: Path, how: str) -> None:
    if not path.exists():
        return
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_bytes(b"\x00\xffgarbage over the checkpoint\n")


async def test_garbage_over_the_checkpoint_is_read_from_its_copy_with_the_claim_kept() -> None:
    # The scenario: garbage written over checkpoint.json while a claim runs, then a restart.
    async with DraNode("t4-pcie") as node:
        c1 = await with_a_running_claim(node)
        assert node.sim is not None
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        damage(node.plugins / DRIVER / "checkpoint.json", "corrupt")
        node.start_driver()
        await started(node, 2)
        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        answer = await call(node, "prepare", [("default", c2, "c2")])
        assert answer.claims[c2].error == (
            f"claim default/c2: device gpu-0 is already prepared for claim default/c1 ({c1})"
        )
        assert "read its copy" in node.log() and "rebuil" not in node.log()
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        await node.sim.terminate_pod("job")
        assert_nothing_lost(node, {})


@pytest.mark.parametrize("how", ["corrupt", "truncated", "missing"])
async def test_a_lost_checkpoint_is_rebuilt_and_the_running_gpu_is_not_prepared_for_another_claim(
    how: str,
) -> None:
    async with DraNode("t4-pcie") as node:
        c1 = await with_a_running_claim(node)
        assert node.sim is not None
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for name in ("checkpoint.json", "checkpoint.json.copy"):
            damage(node.plugins / DRIVER / name, how)
        node.start_driver()
        await started(node, 2)
        await node.wait(lambda: "rebuilt claim default/c1" in node.log(), "the claim rebuilt")
        assert_nothing_lost(node, {c1: ["gpu-0"]})

        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        answer = await call(node, "prepare", [("default", c2, "c2")])
        assert (
            answer.claims[c2].error
            == f"claim default/c2: device gpu-0 is already prepared for claim default/c1 ({c1})"
        )
        again = await call(node, "prepare", [("default", c1, "c1")])  # the same answer as before the loss
        assert [(d.device_name, list(d.cdi_device_ids)) for d in again.claims[c1].devices] == [
            ("gpu-0", [f"k8s.gpu.nvidia.com/claim={c1}-gpu-0"])
        ]
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        await node.sim.terminate_pod("job")  # Unprepare of the rebuilt claim removes its spec
        assert_nothing_lost(node, {})
        assert "Traceback" not in node.log()


async def test_a_checkpoint_lost_under_a_running_driver_is_noticed_at_the_next_call() -> None:
    async with DraNode("t4-pcie") as node:
        c1 = await with_a_running_claim(node)
        assert node.sim is not None
        for name in ("checkpoint.json", "checkpoint.json.copy"):
            damage(node.plugins / DRIVER / name, "missing")
        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        answer = await call(node, "prepare", [("default", c2, "c2")])
        # Held by the spec on disk, or (if the rebuild already ran) by the rebuilt entry: never prepared.
        assert answer.claims[c2].error in (
            f"claim default/c2: device gpu-0 may be in use by claim {c1}: its CDI spec is on disk but the "
            f"checkpoint entry is lost and the API server has not yet confirmed the claim; {RETRY}",
            f"claim default/c2: device gpu-0 is already prepared for claim default/c1 ({c1})",
        )
        await node.wait(lambda: "rebuilt claim default/c1" in node.log(), "the claim rebuilt")
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        await node.sim.terminate_pod("job")
        assert_nothing_lost(node, {})


async def test_a_lost_checkpoint_with_the_api_server_down_holds_the_gpus_and_unprepares() -> None:
    async with DraNode("t4-pcie", env={"KUBEGPU_DRA_API_TIMEOUT_SECONDS": "1"}) as node:
        await with_a_running_claim(node)
        assert node.sim is not None
        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        damage(node.plugins / DRIVER / "checkpoint.json", "corrupt")
        damage(node.plugins / DRIVER / "checkpoint.json.copy", "missing")
        node.api.stop()
        node.start_driver()
        await started(node, 2)
        await node.wait(lambda: "stay held until the API server confirms" in node.log(), "the orphan found")
        await node.wait(lambda: node.log().count("publishing 4 device(s)") == 2, "the publisher started")
        answer = await call(node, "prepare", [("default", c2, "c2")])
        assert answer.claims[c2].error == (  # gpu-0's claim cannot be confirmed: no new claim is risked
            "claim default/c2: not prepared yet: the driver's checkpoint was lost and the claims prepared on "
            "this node are not yet rebuilt from the API server (cannot list the resourceclaims: the API "
            f"server refused the connection (is it down?)); {RETRY}"
        )
        await node.sim.terminate_pod("job")  # offline: the spec found on disk is removed by UID
        assert specs_on_disk(node) == {}
        node.api.start()
        answer = await call(node, "prepare", [("default", c2, "c2")])  # gpu-0 is free now
        assert answer.claims[c2].error == ""
        assert_nothing_lost(node, {c2: ["gpu-0"]})
        assert "Traceback" not in node.log()


CLAIMS = "/resourceclaims/"
FAULTS = {
    "refused": (None, "the API server refused the connection (is it down?)"),
    "hangs": (Fault(hang_s=3.0, path_contains=CLAIMS), "the API server did not answer within 1 s"),
    "500": (
        Fault(status=500, path_contains=CLAIMS),
        'the API server answered 500 Internal Server Error: an error on the server ("injected") has '
        "prevented the request from succeeding",
    ),
    "429": (
        Fault(status=429, path_contains=CLAIMS),
        "the API server answered 429 Too Many Requests: the server has received too many requests and has "
        "asked us to try again later",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_an_api_server_in_trouble_fails_only_the_claims_it_must_read(fault: str) -> None:
    injected, why = FAULTS[fault]
    async with DraNode("t4-pcie", env={"KUBEGPU_DRA_API_TIMEOUT_SECONDS": "1"}) as node:
        c1 = await with_a_running_claim(node)
        assert node.sim is not None
        later = claim_pod("later", "c2")
        c2 = uid_of(node.allocate(claim("c2", [request("gpu")]), later))
        if injected is None:
            node.api.stop()
        else:
            node.api.fault = injected
        answer = await call(node, "prepare", [("default", c1, "c1"), ("default", c2, "c2")])
        assert answer.claims[c1].error == ""  # prepared before: served from the checkpoint
        assert [d.device_name for d in answer.claims[c1].devices] == ["gpu-0"]
        assert answer.claims[c2].error == f"cannot read claim default/c2: {why}; {RETRY}"
        assert list(answer.claims[c2].devices) == []
        await node.sim.terminate_pod("job")  # Unprepare needs no API server
        assert_nothing_lost(node, {})
        if injected is None:
            node.api.start()
        node.api.fault = None
        await node.sim.admit(later)
        assert_nothing_lost(node, {c2: ["gpu-1"]})
        log = node.log()
        assert "Traceback" not in log and "Unexpected" not in log


def garbage_calls(node: DraNode) -> list[tuple[Path, str, bytes]]:
    dra, reg = node.plugins / DRIVER / "dra.sock", node.registry / f"{DRIVER}-reg.sock"
    good = dra_v1.NodePrepareResourcesRequest(
        claims=[dra_v1.Claim(namespace="default", uid="u" * 36, name="c1")]
    ).SerializeToString()
    cut = good[: len(good) - 5]  # truncated inside the claim
    return [
        (dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", b"\xff\xff\xff\xff"),
        (dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", cut),
        (dra, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources", cut),
        (dra, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources", b"\x0a\xff"),
        (reg, "/pluginregistration.Registration/GetInfo", b"\xff\xff"),
        (reg, "/pluginregistration.Registration/NotifyRegistrationStatus", b"\x12\x05ab"),
    ]


async def test_undecodable_bodies_on_every_socket_are_invalid_argument_with_one_warning() -> None:
    async with DraNode("t4-pcie") as node:
        node.start_driver()
        await started(node)
        await node.wait_published(4)
        codes = []
        for _ in range(3):
            for socket, method, body in garbage_calls(node):
                async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
                    rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await rpc(body, timeout=5)
                    codes.append(err.value.code())
        assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT} and len(codes) == 18
        assert node.sim is not None
        job = claim_pod("job", "c1")
        c1 = uid_of(node.allocate(claim("c1", [request("gpu")]), job))
        await node.sim.admit(job)  # still serving
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        log = node.log()
        assert log.count("WARNING kubegpu.dra.service: refusing ") == 1, log
        assert "Traceback" not in log and "ERROR" not in log


async def test_huge_and_slow_calls_do_not_hold_up_a_good_prepare() -> None:
    async with DraNode("t4-pcie", env={"KUBEGPU_DRA_API_TIMEOUT_SECONDS": "2"}) as node:
        node.start_driver()
        await started(node)
        await node.wait_published(4)
        c1 = uid_of(node.allocate(claim("c1", [request("gpu")]), claim_pod("job", "c1")))
        node.api.fault = Fault(hang_s=1.0, path_contains="/resourceclaims/bad-")  # unknown claims, slowly
        huge = asyncio.ensure_future(
            call(node, "prepare", [("default", f"uid-{i}", f"bad-{i}") for i in range(2000)])
        )
        slow = asyncio.ensure_future(
            call(node, "prepare", [("default", f"uid-s{i}", f"bad-s{i}") for i in range(128)])
        )
        await asyncio.sleep(0.3)
        good = await call(node, "prepare", [("default", c1, "c1")])
        assert not slow.done()  # the good call was answered while the slow one was still reading
        assert [d.device_name for d in good.claims[c1].devices] == ["gpu-0"]

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await huge
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "the call names 2000 claims, more than the 128 one call may hold (a kubelet sends one pod's "
            "claims for a driver per call); no claim of it was handled"
        )
        errors = [c.error for c in (await slow).claims.values()]
        assert len(errors) == 128
        gone = {
            f"claim default/bad-s{i} not found: it was deleted before it could be prepared"
            for i in range(128)
        }
        late = {
            f"cannot read claim default/bad-s{i}: the API server did not answer within 2 s; {RETRY}"
            for i in range(128)
        }
        assert all(e in gone | late for e in errors)
        assert sum(e in late for e in errors) >= 100  # 2 reads at a time, 1 s each, 2 s budget
        node.api.fault = None

        twice = await call(node, "prepare", [("default", "u-dup", "d1"), ("default", "u-dup", "d2")])
        assert twice.claims["u-dup"].error == (
            "claim UID u-dup appears 2 times in one call (claim default/d1, claim default/d2); send each "
            "claim once"
        )
        wrong = await call(node, "unprepare", [("other", c1, "c9")])
        assert wrong.claims[c1].error == (
            f"claim other/c9: UID {c1} belongs to claim default/c1 on this node, not to this one; nothing "
            "was unprepared"
        )
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        log = node.log()
        assert log.count("claim(s) failed") <= 5 and sum("bad-" in line for line in log.splitlines()) <= 5
        assert "Traceback" not in log


async def test_a_checkpoint_lost_with_the_running_claims_spec_is_rebuilt_from_the_api_server() -> None:
    # The plugin directory and the CDI root both wiped under a running pod: no orphan spec says gpu-0 is
    # held, only the API server does (c1 allocated here, reserved for job). While it cannot be asked, a new
    # claim is refused per claim; once it answers, c1 is prepared again (spec rewritten) and holds gpu-0.
    async with DraNode("t4-pcie", env={"KUBEGPU_DRA_API_TIMEOUT_SECONDS": "1"}) as node:
        c1 = await with_a_running_claim(node)
        c2 = uid_of(allocate_on(node, "c2", "thief", "gpu-0"))
        assert await node.stop_driver(signal.SIGKILL) == -signal.SIGKILL
        for name in ("checkpoint.json", "checkpoint.json.copy"):
            damage(node.plugins / DRIVER / name, "missing")
        for spec in node.cdi.glob("k8s.gpu.nvidia.com-claim_*.json"):
            spec.unlink()
        node.api.stop()
        node.start_driver()
        await started(node, 2)
        refused = await call(node, "prepare", [("default", c2, "c2")])
        assert refused.claims[c2].error == (
            "claim default/c2: not prepared yet: the driver's checkpoint was lost and the claims prepared on "
            "this node are not yet rebuilt from the API server (cannot list the resourceclaims: the API "
            f"server refused the connection (is it down?)); {RETRY}"
        )
        assert specs_on_disk(node) == {}
        node.api.start()
        await node.wait(lambda: "rebuilt claim default/c1" in node.log(), "c1 rebuilt from the API server")
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        answer = await call(node, "prepare", [("default", c2, "c2")])
        assert (
            answer.claims[c2].error
            == f"claim default/c2: device gpu-0 is already prepared for claim default/c1 ({c1})"
        )
        assert_nothing_lost(node, {c1: ["gpu-0"]})
        assert "Traceback" not in node.log()
