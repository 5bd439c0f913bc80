"""Prepare/Unprepare without gRPC: per-claim errors, idempotency from the checkpoint, rollback of a Prepare
cut short, the node-wide lock, the reboot rule, and the claim checks (UID, allocation, reservation)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from kubegpu.apisim import ApiServerSim
from kubegpu.dra.checkpoint import COMPLETED, STARTED, Checkpoint, PreparedClaim, PreparedDevice
from kubegpu.dra.claim_calls import ClaimRef
from kubegpu.dra.claim_cdi import ClaimSpecs
from kubegpu.dra.claims import AllocatedClaim, ClaimGone, ClaimReader
from kubegpu.dra.devices import DraDevice, device_table
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.node_lock import NodeLock
from kubegpu.dra.prepare import Preparer
from kubegpu.dra.rebuild import clean_up
from kubegpu.node.inventory import Inventory
from kubegpu.settings.dra_selection import parse_gpu_selection
from kubegpu.settings.kubeaccess import ApiAccess
from tests.builders import make_inventory

BOOT = "6e1f0c55-0000-4000-8000-000000000001"


class Reader(ClaimReader):
    """Claims from a dict instead of the API server; the checks are the real ones."""

    def __init__(self) -> None:
        super().__init__(KubeClient(ApiAccess(server="http://127.0.0.1:1")), "gpu.nvidia.com")
        self.objects: dict[str, dict[str, Any]] = {}
        self.gets = 0

    def get(self, namespace: str, name: str, uid: str) -> AllocatedClaim:
        self.gets += 1
        obj = self.objects.get(name)
        if obj is None:
            raise ClaimGone(f"claim {namespace}/{name} not found: it was deleted before it could be prepared")
        return self.check(obj, namespace, name, uid)


def allocated(
    name: str, uid: str, devices: list[str], *, reserved: bool = True, config: Any = None
) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": d} for d in devices]
    status: dict[str, Any] = {"allocation": {"devices": {"results": results, "config": config or []}}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    return {"metadata": {"name": name, "namespace": "default", "uid": uid}, "status": status}


def make(
    tmp_path: Path,
    inventory: Inventory | None = None,
    boot: str = BOOT,
    *,
    intact: bool = True,
    **options: Any,
) -> tuple[Preparer, Reader]:
    """A Preparer on `tmp_path`; `intact`: a node whose checkpoint is there (written empty if it is not),
    else one that finds its checkpoint lost and must rebuild before it prepares a new claim. `options`:
    the Preparer's optional arguments (gates, timeslicer, shares), as the driver passes them."""
    inventory = inventory or make_inventory(2)
    table = device_table(inventory, parse_gpu_selection("all"))

    def devices() -> tuple[Inventory, dict[str, DraDevice]]:
        return inventory, table

    checkpoint = Checkpoint(tmp_path / "plugin" / "checkpoint.json", boot)
    checkpoint.load()
    if intact and not checkpoint.path.exists():
        checkpoint.save()
    reader = Reader()
    preparer = Preparer(
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        checkpoint=checkpoint,
        specs=ClaimSpecs(tmp_path / "cdi", "gpu.nvidia.com"),
        reader=reader,
        lock=NodeLock(tmp_path / "plugin" / "pu.lock", 0.3),
        devices=devices,
        **options,
    )
    return preparer, reader


def ref(name: str, uid: str) -> ClaimRef:
    return ClaimRef("default", uid, name)


async def test_every_claim_is_answered_with_its_own_error(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["ok"] = allocated("ok", "u1", ["gpu-0"])
    reader.objects["unreserved"] = allocated("unreserved", "u2", ["gpu-1"], reserved=False)
    reader.objects["replaced"] = allocated("replaced", "u3-new", ["gpu-1"])
    reader.objects["elsewhere"] = allocated("elsewhere", "u5", ["gpu-7"])
    out = await preparer.prepare(
        [
            ref("ok", "u1"),
            ref("unreserved", "u2"),
            ref("replaced", "u3"),
            ref("gone", "u4"),
            ref("elsewhere", "u5"),
        ]
    )
    assert {uid: o.error for uid, o in out.items()} == {
        "u1": "",
        "u2": "claim default/unreserved is not reserved for any pod (status.reservedFor is empty)",
        "u3": "claim default/replaced: UID is u3-new, not u3: the claim was deleted and created again",
        "u4": "claim default/gone not found: it was deleted before it could be prepared",
        "u5": "claim default/elsewhere: device gpu-7 is not published by this node "
        "(it publishes gpu-0, gpu-1)",
    }
    assert [(d.device, d.cdi_ids) for d in out["u1"].devices] == [
        ("gpu-0", ("k8s.gpu.nvidia.com/claim=u1-gpu-0",))
    ]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["k8s.gpu.nvidia.com-claim_u1.json"]


async def test_prepare_is_idempotent_and_survives_a_restart(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0", "gpu-1"])
    first = await preparer.prepare([ref("c", "u1")])
    again = await preparer.prepare([ref("c", "u1")])
    assert again == first and reader.gets == 1
    restarted, reader2 = make(tmp_path)  # a new process: the checkpoint answers, the claim is not read
    assert await restarted.prepare([ref("c", "u1")]) == first and reader2.gets == 0


async def test_a_device_held_by_another_claim_is_refused(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["a"] = allocated("a", "ua", ["gpu-0"])
    reader.objects["b"] = allocated("b", "ub", ["gpu-0"])
    await preparer.prepare([ref("a", "ua")])
    out = await preparer.prepare([ref("b", "ub")])
    assert out["ub"].error == "claim default/b: device gpu-0 is already prepared for claim default/a (ua)"


async def test_a_prepare_cut_short_is_rolled_back_and_done_again(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    half = PreparedClaim(
        "u1", "default", "c", STARTED, (PreparedDevice(("gpu",), "node-a", "gpu-1", ("x",)),)
    )
    preparer.checkpoint.put(half)
    leftover = tmp_path / "cdi" / "k8s.gpu.nvidia.com-claim_u1.json"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("{}")
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    out = await preparer.prepare([ref("c", "u1")])
    assert [d.device for d in out["u1"].devices] == ["gpu-0"]
    assert json.loads(leftover.read_text())["devices"][0]["name"] == "u1-gpu-0"
    assert preparer.checkpoint.claims["u1"].state == COMPLETED


async def test_unprepare_unknown_and_after_the_claim_is_gone(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    await preparer.prepare([ref("c", "u1")])
    del reader.objects["c"]
    assert await preparer.unprepare([ref("c", "u1"), ref("never", "u9")]) == {"u1": "", "u9": ""}
    assert list((tmp_path / "cdi").iterdir()) == []
    assert preparer.checkpoint.claims == {}


async def test_another_process_holding_the_lock_fails_the_call_after_the_timeout(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    lock = tmp_path / "plugin" / "pu.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # an old driver pod mid-Prepare (flock is per open file: same effect)
    try:
        out = await preparer.prepare([ref("c", "u1")])
        assert out["u1"].error == (
            f"timed out after 0.3 s waiting for {lock}: another driver process on this node is preparing or "
            "unpreparing (a rolling update?); the kubelet retries"
        )
        assert reader.gets == 0
    finally:
        os.close(fd)
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""


async def test_concurrent_calls_are_serialized(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    for i in range(2):
        reader.objects[f"c{i}"] = allocated(f"c{i}", f"u{i}", ["gpu-0"])
    a, b = await asyncio.gather(preparer.prepare([ref("c0", "u0")]), preparer.prepare([ref("c1", "u1")]))
    assert sorted([a["u0"].error == "", b["u1"].error == ""]) == [False, True]  # one wins, never both


def test_a_reboot_forgets_prepared_claims(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", BOOT)
    checkpoint.put(PreparedClaim("u1", "default", "c", COMPLETED))
    after = Checkpoint(tmp_path / "checkpoint.json", "another-boot")
    after.load()
    assert after.claims == {} and list(after.stale) == ["u1"]


def test_a_corrupt_checkpoint_is_moved_aside_and_read_from_its_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path, BOOT)
    checkpoint.put(PreparedClaim("u1", "default", "c", COMPLETED))
    raw = json.loads(path.read_text())
    raw["data"] = raw["data"].replace("u1", "u2")
    path.write_text(json.dumps(raw))
    again = Checkpoint(path, BOOT)
    again.load()
    assert list(again.claims) == ["u1"] and not again.lost
    assert "checksum mismatch (the file was changed or cut short); read its copy" in caplog.text
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == [
        "checkpoint.json",
        "checkpoint.json.copy",
        "checkpoint.json.corrupt",
    ]
    fresh = Checkpoint(path, BOOT)  # the file was written again from the copy
    fresh.load()
    assert list(fresh.claims) == ["u1"]


def test_a_truncated_file_and_a_damaged_copy_leave_the_checkpoint_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, BOOT).put(PreparedClaim("u1", "default", "c", COMPLETED))
    path.write_bytes(path.read_bytes()[:40])
    copy = tmp_path / "checkpoint.json.copy"
    copy.write_bytes(b"\x00garbage")
    again = Checkpoint(path, BOOT)
    again.load()
    assert again.claims == {} and again.lost
    assert "no copy of the DRA checkpoint is readable: rebuilding the prepared claims" in caplog.text
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir()) == [
        "checkpoint.json.copy.corrupt",
        "checkpoint.json.corrupt",
    ]


async def test_an_old_and_a_new_driver_process_see_each_others_claims(tmp_path: Path) -> None:
    # A rolling update: the old pod prepared the claim, the new pod gets its Unprepare (and vice versa).
    old, old_reader = make(tmp_path)
    new, _ = make(tmp_path)
    old_reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    await old.prepare([ref("c", "u1")])
    assert await new.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert list((tmp_path / "cdi").iterdir()) == []
    old_reader.objects["d"] = allocated("d", "u2", ["gpu-0"])
    assert (await old.prepare([ref("d", "u2")]))["u2"].error == ""  # gpu-0 is free again for the old one too


async def test_cleanup_unprepares_claims_that_are_gone_and_keeps_the_rest(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["kept"] = allocated("kept", "u1", ["gpu-0"])
    reader.objects["deleted"] = allocated("deleted", "u2", ["gpu-1"])
    await preparer.prepare([ref("kept", "u1"), ref("deleted", "u2")])
    del reader.objects["deleted"]
    assert await clean_up(preparer) == ["u2"]
    assert list(preparer.checkpoint.claims) == ["u1"]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["k8s.gpu.nvidia.com-claim_u1.json"]
    reader.objects["kept"] = allocated(
        "kept", "u1", ["gpu-0"], reserved=False
    )  # not reserved: not ours to judge
    assert await clean_up(preparer) == []


async def test_cleanup_through_the_api_server_keeps_claims_when_their_version_stops_being_served(
    tmp_path: Path,
) -> None:
    # The real reader on the API simulator: a claim that was deleted is cleaned up, but a 404 for the path
    # (an upgrade took the version away) is not "every claim was deleted": the claims stay prepared.
    preparer, _ = make(tmp_path)
    with ApiServerSim(resource_versions=("v1", "v1beta1")) as api:
        preparer.reader = ClaimReader(KubeClient(ApiAccess(server=api.url)), "gpu.nvidia.com")
        uids = {}
        for name, device in (("kept", "gpu-0"), ("deleted", "gpu-1")):
            created = api.create("resourceclaims", {**allocated(name, "", [device]), "spec": {"devices": {}}})
            created["status"] = allocated(name, "", [device])["status"]
            uids[name] = api.update("resourceclaims", created, status=True)["metadata"]["uid"]
        prepared = await preparer.prepare([ref(name, uid) for name, uid in uids.items()])
        assert [r.error for r in prepared.values()] == ["", ""]
        api.served["resource.k8s.io"] = ("v1beta1",)
        assert await clean_up(preparer) == []  # the 404 named no claim: the version is looked up again
        assert sorted(preparer.checkpoint.claims) == sorted(uids.values())
        api.delete("resourceclaims", "deleted", namespace="default")
        assert await clean_up(preparer) == [uids["deleted"]]  # now read through v1beta1
        assert list(preparer.checkpoint.claims) == [uids["kept"]]
