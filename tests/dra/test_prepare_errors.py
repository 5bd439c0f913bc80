"""Prepare's error paths, each fault injected on purpose and the whole outcome checked: the claim's answer
and its failure kind (the driver's counters), the log line an SRE reads, the checkpoint and the CDI specs left
on disk, and that the device is free again once the fault is gone. A disk that refuses a write, a claim
config the driver cannot apply, an unfinished Prepare whose claim is gone, an API server that does not
answer, another driver process holding the node lock through a call."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra import checkpoint as checkpoint_module
from kubegpu.dra import claim_cdi
from kubegpu.dra.checkpoint import STARTED, PreparedClaim, PreparedDevice
from kubegpu.dra.claim_calls import ClaimRef
from tests.dra.test_prepare import allocated, make, ref
from tests.dra.test_preparer_setup import HeldReader

RETRY = "the kubelet will retry"
SPEC = "k8s.gpu.nvidia.com-claim_{}.json"


def on_disk(tmp_path: Path) -> dict[str, str]:
    """The checkpoint file as written: each claim's state by UID."""
    raw = json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())
    return {c["uid"]: c["state"] for c in json.loads(raw["data"])["preparedClaims"]}


def specs(tmp_path: Path) -> list[str]:
    root = tmp_path / "cdi"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]


async def test_a_full_disk_under_the_spec_write_fails_the_claim_and_leaves_nothing_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])

    def full(path: Path, data: bytes, **kwargs: Any) -> bool:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as os.write says it: no file name

    with monkeypatch.context() as patch, caplog.at_level(logging.INFO):
        patch.setattr(claim_cdi, "write_atomic", full)
        out = await preparer.prepare([ref("c", "u1")])
    message = "claim default/c: cannot write a file: No space left on device"
    assert (out["u1"].error, out["u1"].kind, out["u1"].devices) == (message, "io", ())
    assert ("ERROR", message) in messages(caplog, "kubegpu.dra.prepare")
    assert preparer.failures.counts == {"io": 1}
    assert on_disk(tmp_path) == {} and specs(tmp_path) == []  # the PrepareStarted entry rolled back

    reader.objects["d"] = allocated("d", "u2", ["gpu-0"])  # the disk has room again: gpu-0 is free
    assert (await preparer.prepare([ref("d", "u2")]))["u2"].error == ""
    assert on_disk(tmp_path) == {"u2": "PrepareCompleted"} and specs(tmp_path) == [SPEC.format("u2")]


async def test_a_checkpoint_on_a_read_only_disk_fails_each_claim_of_the_call_not_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    reader.objects["d"] = allocated("d", "u2", ["gpu-1"])
    path = tmp_path / "plugin" / "checkpoint.json"

    def read_only(target: Path, data: bytes, **kwargs: Any) -> bool:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))

    with monkeypatch.context() as patch, caplog.at_level(logging.INFO):
        patch.setattr(checkpoint_module, "write_atomic", read_only)
        out = await preparer.prepare([ref("c", "u1"), ref("d", "u2")])
    assert {u: (o.error, o.kind) for u, o in out.items()} == {
        "u1": (f"claim default/c: cannot write {path}: Read-only file system", "io"),
        "u2": (f"claim default/d: cannot write {path}: Read-only file system", "io"),
    }
    # Nothing to roll back: an entry the disk refused is not kept in memory either.
    assert messages(caplog, "kubegpu.dra.prepare") == [
        ("ERROR", f"claim default/c: cannot write {path}: Read-only file system"),
        ("ERROR", f"claim default/d: cannot write {path}: Read-only file system"),
    ]
    assert preparer.failures.counts == {"io": 2}
    assert on_disk(tmp_path) == {} and specs(tmp_path) == []

    assert {u: o.error for u, o in (await preparer.prepare([ref("c", "u1"), ref("d", "u2")])).items()} == {
        "u1": "",
        "u2": "",
    }
    assert on_disk(tmp_path) == {"u1": "PrepareCompleted", "u2": "PrepareCompleted"}


@pytest.mark.parametrize("disk", ["read-only", "full"])
async def test_an_unfinished_prepare_that_cannot_be_rolled_back_fails_its_claim_until_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, disk: str
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    preparer.checkpoint.put(
        PreparedClaim("u1", "default", "c", STARTED, (PreparedDevice(("gpu",), "node-a", "gpu-0", ("x",)),))
    )
    path = tmp_path / "plugin" / "checkpoint.json"

    def refused(target: Path, data: bytes, **kwargs: Any) -> bool:
        if disk == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # from os.write: no file name
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))

    with monkeypatch.context() as patch, caplog.at_level(logging.INFO):
        patch.setattr(checkpoint_module, "write_atomic", refused)
        out = await preparer.prepare([ref("c", "u1")])
    why = f"{path}: Read-only file system" if disk == "read-only" else "a file: No space left on device"
    failed = f"claim default/c: cannot roll back an unfinished Prepare: {why}"
    assert (out["u1"].error, out["u1"].kind) == (f"{failed}; {RETRY}", "io")
    assert messages(caplog, "kubegpu.dra.prepare") == [
        ("INFO", "claim default/c (u1): rolling back an unfinished Prepare"),
        ("ERROR", failed),
    ]
    assert reader.gets == 0  # not prepared over what is left of the last attempt
    assert on_disk(tmp_path) == {"u1": "PrepareStarted"}  # a new driver process rolls it back too
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""  # the disk is writable again
    assert on_disk(tmp_path) == {"u1": "PrepareCompleted"} and specs(tmp_path) == [SPEC.format("u1")]


async def test_a_config_the_driver_cannot_apply_or_a_busy_device_fails_only_its_claim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    bogus = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Bogus"},
    }
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": bogus},
        }
    ]
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"], config=config)
    reader.objects["d"] = allocated("d", "u2", ["gpu-1"])
    reader.objects["e"] = allocated("e", "u3", ["gpu-1"])
    with caplog.at_level(logging.WARNING):
        out = await preparer.prepare([ref("c", "u1"), ref("d", "u2"), ref("e", "u3")])
    assert {u: (o.error, o.kind) for u, o in out.items()} == {
        "u1": ("unknown GPU sharing strategy: Bogus; use TimeSlicing or MPS", "config"),
        "u2": ("", ""),
        "u3": ("claim default/e: device gpu-1 is already prepared for claim default/d (u2)", "busy"),
    }
    assert preparer.failures.counts == {"config": 1, "busy": 1}
    assert messages(caplog, "kubegpu.dra.claim_calls") == [
        (
            "WARNING",
            "NodePrepareResources: 2 of 3 claim(s) failed (busy 1, config 1); the first: unknown GPU sharing "
            "strategy: Bogus; use TimeSlicing or MPS",
        )
    ]
    assert on_disk(tmp_path) == {"u2": "PrepareCompleted"} and specs(tmp_path) == [SPEC.format("u2")]


async def test_an_unfinished_prepare_whose_claim_is_gone_is_rolled_back_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, _ = make(tmp_path)
    preparer.checkpoint.put(
        PreparedClaim("u1", "default", "c", STARTED, (PreparedDevice(("gpu",), "node-a", "gpu-0", ("x",)),))
    )
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / SPEC.format("u1")).write_text("{}")
    restarted, reader = make(tmp_path)  # the claim was deleted while no driver ran
    with caplog.at_level(logging.INFO, logger="kubegpu.dra.prepare"):
        out = await restarted.prepare([ref("c", "u1")])
    assert (out["u1"].error, out["u1"].kind) == (
        "claim default/c not found: it was deleted before it could be prepared",
        "gone",
    )
    assert messages(caplog, "kubegpu.dra.prepare") == [
        ("INFO", "claim default/c (u1): rolling back an unfinished Prepare")
    ]
    assert reader.gets == 1
    assert on_disk(tmp_path) == {} and specs(tmp_path) == []
    reader.objects["d"] = allocated("d", "u2", ["gpu-0"])
    assert (await restarted.prepare([ref("d", "u2")]))["u2"].error == ""  # gpu-0 no longer held


async def test_a_prepared_claim_is_answered_from_the_checkpoint_and_a_uid_of_another_claim_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    first = await preparer.prepare([ref("c", "u1")])
    with caplog.at_level(logging.DEBUG, logger="kubegpu.dra.prepare"):
        again = await preparer.prepare([ref("c", "u1")])
        other = await preparer.prepare([ClaimRef("other", "u1", "c")])
    assert again == first and reader.gets == 1
    assert messages(caplog, "kubegpu.dra.prepare") == [("DEBUG", "claim default/c (u1) is already prepared")]
    assert (other["u1"].error, other["u1"].kind) == (
        "claim other/c: UID u1 belongs to claim default/c on this node, not to this one; nothing was "
        "prepared",
        "mismatch",
    )
    assert preparer.failures.counts == {"mismatch": 1}
    assert on_disk(tmp_path) == {"u1": "PrepareCompleted"} and specs(tmp_path) == [SPEC.format("u1")]


async def test_a_claim_the_api_server_does_not_read_in_time_fails_and_the_others_of_the_call_do_not(
    tmp_path: Path,
) -> None:
    preparer, _ = make(tmp_path)
    reader = HeldReader(held={"slow"}, hold_s=10.0)
    reader.timeout = 1.0
    preparer.reader = reader
    reader.objects["c0"] = allocated("c0", "u0", ["gpu-0"])
    reader.objects["c1"] = allocated("c1", "u1", ["gpu-1"])
    reader.objects["slow"] = allocated("slow", "us", ["gpu-1"])
    try:
        out = await preparer.prepare([ref("c0", "u0"), ref("slow", "us"), ref("c1", "u1")])
    finally:
        reader.release.set()
    assert {u: (o.error, o.kind) for u, o in out.items()} == {
        "u0": ("", ""),
        "us": (f"cannot read claim default/slow: the API server did not answer within 1 s; {RETRY}", "api"),
        "u1": ("", ""),
    }
    assert reader.most == 2  # two reads of one call at a time, so other calls find threads free
    assert preparer.failures.counts == {"api": 1}
    assert on_disk(tmp_path) == {"u0": "PrepareCompleted", "u1": "PrepareCompleted"}


def lock_timed_out(lock: Path) -> str:
    return (
        f"timed out after 0.3 s waiting for {lock}: another driver process on this node is preparing or "
        "unpreparing (a rolling update?); the kubelet retries"
    )


@contextmanager
def held_by_another_process(tmp_path: Path) -> Iterator[Path]:
    lock = tmp_path / "plugin" / "pu.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # flock is per open file: the same as another process
    try:
        yield lock
    finally:
        os.close(fd)


async def test_unprepare_while_another_process_holds_the_lock_fails_each_claim_and_keeps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    await preparer.prepare([ref("c", "u1")])
    calls = [ref("c", "u1"), ref("never", "u9"), ref("twice", "u5"), ref("twice", "u5")]
    with held_by_another_process(tmp_path) as lock, caplog.at_level(logging.WARNING):
        answer = await preparer.unprepare(calls)
    timed_out = lock_timed_out(lock)
    twice = (
        "claim UID u5 appears 2 times in one call (claim default/twice, claim default/twice); send each "
        "claim once"
    )
    assert answer == {"u1": timed_out, "u9": timed_out, "u5": twice}
    assert preparer.failures.counts == {"lock": 2, "duplicate": 1}
    assert messages(caplog, "kubegpu.dra.claim_calls") == [
        (
            "WARNING",
            f"NodeUnprepareResources: 3 of 4 claim(s) failed (duplicate 1, lock 2); the first: {twice}",
        )
    ]
    assert on_disk(tmp_path) == {"u1": "PrepareCompleted"} and specs(tmp_path) == [SPEC.format("u1")]
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert on_disk(tmp_path) == {} and specs(tmp_path) == []


async def test_prepare_while_another_process_holds_the_lock_fails_each_claim_as_such(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    with held_by_another_process(tmp_path) as lock, caplog.at_level(logging.WARNING):
        out = await preparer.prepare([ref("c", "u1"), ClaimRef("default", "", "nameless")])
    timed_out = lock_timed_out(lock)
    nameless = "claim default/nameless has no UID; send the claim's metadata.uid"
    assert {u: (o.error, o.kind) for u, o in out.items()} == {
        "u1": (timed_out, "lock"),
        "": (nameless, "no-uid"),
    }
    assert preparer.failures.counts == {"lock": 1, "no-uid": 1}
    assert messages(caplog, "kubegpu.dra.claim_calls") == [
        ("WARNING", f"NodePrepareResources: 2 of 2 claim(s) failed (lock 1, no-uid 1); the first: {nameless}")
    ]
    assert reader.gets == 0 and on_disk(tmp_path) == {} and specs(tmp_path) == []


async def test_a_lock_held_at_start_up_leaves_the_scan_to_the_first_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    await first.prepare([ref("c", "u1")])
    first.checkpoint.remove("u1")  # its entry lost, its spec left: an orphan to the next process
    restarted, _ = make(tmp_path)
    with held_by_another_process(tmp_path) as lock, caplog.at_level(logging.WARNING):
        await restarted.recover()
    assert messages(caplog, "kubegpu.dra.prepare") == [
        ("WARNING", f"the claims on disk are looked at on the first call: {lock_timed_out(lock)}")
    ]
    assert restarted.orphans == {} and restarted.lost is None  # not looked at yet
    assert await restarted.unprepare([ref("other", "u7")]) == {"u7": ""}  # the first call scans
    assert restarted.orphans == {"u1": ("gpu-0",)} and restarted.lost == "other"
