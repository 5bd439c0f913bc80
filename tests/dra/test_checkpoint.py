"""The DRA driver's checkpoint file, field by field: its format on disk, what each damage says in the log,
a reboot, another process's save, and who holds a device."""

from __future__ import annotations

import errno
import json
import logging
import stat
import zlib
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra import checkpoint as checkpoint_module
from kubegpu.dra.checkpoint import (
    COMPLETED,
    STARTED,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    read_boot_id,
)

BOOT = "6e1f0c55-0000-4000-8000-000000000001"
GPU0 = PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=u1-gpu-0",))
CLAIM = PreparedClaim("u1", "default", "c", COMPLETED, (GPU0,), {"strategy": "TimeSlicing"})
LOG = "kubegpu.dra.checkpoint"
# The file as written for CLAIM: the content as compact JSON with sorted keys, under its CRC-32 (a device
# held whole has no shareID: ConsumableShares).
BODY = (
    '{"nodeBootID":"6e1f0c55-0000-4000-8000-000000000001","preparedClaims":[{"devices":[{"admin_access":false,'
    '"cdi_ids":["k8s.gpu.nvidia.com/claim=u1-gpu-0"],"device":"gpu-0","pool":"node-a","request_names":["gpu"],'
    '"share_id":null}],'
    '"name":"c","namespace":"default","sharing":{"strategy":"TimeSlicing"},"state":"PrepareCompleted","uid":"u1"}]}'
)


def saved(tmp_path: Path, *claims: PreparedClaim) -> Checkpoint:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", BOOT)
    for claim in claims:
        checkpoint.put(claim)
    return checkpoint


def loaded(tmp_path: Path, boot: str = BOOT) -> Checkpoint:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", boot)
    checkpoint.load()
    return checkpoint


def test_the_file_and_its_copy_on_disk(tmp_path: Path) -> None:
    saved(tmp_path, CLAIM)
    for name in ("checkpoint.json", "checkpoint.json.copy"):
        path = tmp_path / name
        assert json.loads(path.read_bytes()) == {
            "version": "kubegpu.dra/v1",
            "checksum": zlib.crc32(BODY.encode()),
            "data": BODY,
        }
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # claims name pods: not for every user
    assert loaded(tmp_path).claims == {"u1": CLAIM}


def test_a_claims_optional_fields_have_their_defaults() -> None:
    raw = {"uid": "u2", "namespace": "ns", "name": "n", "state": STARTED}
    assert PreparedClaim.from_json(raw) == PreparedClaim("u2", "ns", "n", STARTED, (), {})
    device = {"request_names": ["r"], "pool": "p", "device": "gpu-1", "cdi_ids": []}
    shared = PreparedDevice(("r",), "p", "gpu-1", (), admin_access=True)
    assert PreparedClaim.from_json({**raw, "devices": [device]}).devices == (
        PreparedDevice(("r",), "p", "gpu-1", ()),
    )
    back = PreparedClaim.from_json({**raw, "devices": [{**device, "admin_access": True}]})
    assert back.devices == (shared,)
    with pytest.raises(CheckpointError) as err:
        PreparedClaim.from_json({**raw, "state": "Prepared"})
    assert str(err.value) == "claim u2: unknown state 'Prepared'"


def test_a_damaged_file_is_read_from_its_copy_and_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved(tmp_path, CLAIM)
    file = tmp_path / "checkpoint.json"
    good = file.read_bytes()
    file.write_bytes(good.replace(b"gpu-0", b"gpu-9", 1))  # the checksum no longer matches
    with caplog.at_level(logging.ERROR, logger=LOG):
        checkpoint = loaded(tmp_path)
    assert checkpoint.claims == {"u1": CLAIM} and checkpoint.lost is False
    (aside,) = tmp_path.glob("checkpoint.json.corrupt-*")
    assert caplog.messages == [
        f"cannot read the DRA checkpoint {file} (moved to {aside}): checksum mismatch (the file was changed "
        f"or cut short); read its copy {file}.copy instead (1 claim(s))"
    ]
    assert file.read_bytes() == good  # written again from the copy
    assert not checkpoint.refresh()  # what it wrote is what it knows


def test_a_missing_file_is_read_from_its_copy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved(tmp_path, CLAIM)
    file = tmp_path / "checkpoint.json"
    file.unlink()
    with caplog.at_level(logging.ERROR, logger=LOG):
        assert loaded(tmp_path).claims == {"u1": CLAIM}
    assert caplog.messages == [
        f"the DRA checkpoint {file} is missing; read its copy {file}.copy instead (1 claim(s))"
    ]
    assert file.exists()


def test_neither_copy_readable_says_so_and_is_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved(tmp_path, CLAIM)
    file = tmp_path / "checkpoint.json"
    file.write_text('{"version": "kubegpu.dra/v0"}')
    (tmp_path / "checkpoint.json.copy").write_text("[]")
    with caplog.at_level(logging.ERROR, logger=LOG):
        checkpoint = loaded(tmp_path)
    assert checkpoint.claims == {} and checkpoint.lost
    first = next(tmp_path.glob("checkpoint.json.corrupt-*"))
    second = next(tmp_path.glob("checkpoint.json.copy.corrupt-*"))
    assert caplog.messages == [
        f"cannot read the DRA checkpoint {file} (moved to {first}): not a kubegpu.dra/v1 checkpoint; "
        f"cannot read the DRA checkpoint {file}.copy (moved to {second}): not a kubegpu.dra/v1 checkpoint; "
        "no copy of the DRA checkpoint is readable: rebuilding the prepared claims from the CDI specs "
        "on disk and the API server"
    ]
    again = loaded(tmp_path)  # nothing left to read: empty, and not lost
    assert again.claims == {} and not again.lost


def test_a_file_that_cannot_be_moved_aside_says_so(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "gone" / "checkpoint.json", BOOT)
    assert checkpoint._quarantine(checkpoint.path, "bad") == (
        f"cannot read the DRA checkpoint {checkpoint.path} (bad) nor move it aside: No such file or directory"
    )


def test_after_a_reboot_the_claims_are_stale_and_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved(tmp_path, CLAIM)
    with caplog.at_level(logging.INFO, logger=LOG):
        checkpoint = loaded(tmp_path, boot="after-reboot")
    assert checkpoint.claims == {} and checkpoint.stale == {"u1": CLAIM}
    assert caplog.messages == [
        f"the node rebooted since the checkpoint was written (boot ID {BOOT}, now after-reboot): "
        "forgetting 1 prepared claim(s)"
    ]
    # Written again at once: the next start does not find the old claims a second time.
    assert json.loads(json.loads((tmp_path / "checkpoint.json").read_text())["data"]) == {
        "nodeBootID": "after-reboot",
        "preparedClaims": [],
    }


def test_refresh_reads_what_another_process_saved(tmp_path: Path) -> None:
    mine = saved(tmp_path, CLAIM)
    assert not mine.refresh()
    other = loaded(tmp_path)
    other.put(PreparedClaim("u2", "default", "d", STARTED))
    assert mine.refresh()
    assert sorted(mine.claims) == ["u1", "u2"]
    assert not mine.refresh()


def test_holders_are_the_other_claims_using_the_device_for_themselves(tmp_path: Path) -> None:
    admin = PreparedClaim(
        "u3", "default", "admin", COMPLETED, (PreparedDevice(("g",), "node-a", "gpu-0", (), True),)
    )
    other = PreparedClaim(
        "u4", "default", "other", COMPLETED, (PreparedDevice(("g",), "node-a", "gpu-1", ()),)
    )
    checkpoint = saved(tmp_path, CLAIM, admin, other)
    assert [c.uid for c in checkpoint.holders("gpu-0", except_uid="u9")] == ["u1"]
    assert list(checkpoint.holders("gpu-0", except_uid="u1")) == []
    checkpoint.remove("u9")  # not there: nothing to do
    checkpoint.remove("u1")
    assert sorted(loaded(tmp_path).claims) == ["u3", "u4"]


def test_the_boot_id_is_read_trimmed_or_empty_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "boot_id").write_text(f"{BOOT}\n")
    assert read_boot_id(tmp_path / "boot_id") == BOOT
    with caplog.at_level(logging.WARNING, logger=LOG):
        assert read_boot_id(tmp_path / "missing") == ""
    assert caplog.messages == [
        f"cannot read the boot ID from {tmp_path / 'missing'}, reboots will not be detected: "
        f"[Errno 2] No such file or directory: '{tmp_path / 'missing'}'"
    ]


def test_a_first_save_makes_its_directories_and_a_first_load_is_empty(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "plugins" / "gpu.nvidia.com" / "checkpoint.json", BOOT)
    assert not checkpoint.refresh()  # no file, none read before: nothing to read
    checkpoint.load()
    assert (checkpoint.claims, checkpoint.stale, checkpoint.lost) == ({}, {}, False)
    checkpoint.put(CLAIM)
    again = Checkpoint(checkpoint.path, BOOT)
    again.load()
    assert (again.claims, again.stale, again.lost) == ({"u1": CLAIM}, {}, False)


def test_a_change_the_disk_refuses_leaves_the_claims_as_the_file_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is in memory answers the kubelet's retries: it must stay what the file says. Once the file is
    # written, a copy that cannot be written does not undo the change.
    checkpoint = saved(tmp_path, CLAIM)
    other = PreparedClaim("u2", "default", "d", STARTED, (GPU0,))

    def full(path: Path, data: bytes, **kwargs: Any) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module, "write_atomic", full)
        with pytest.raises(OSError, match="No space left"):
            checkpoint.put(other)
        assert checkpoint.claims == {"u1": CLAIM}
        with pytest.raises(OSError, match="No space left"):
            checkpoint.remove("u1")
        assert checkpoint.claims == {"u1": CLAIM}
    assert loaded(tmp_path).claims == {"u1": CLAIM}

    write = checkpoint_module.write_atomic

    def copy_refused(path: Path, data: bytes, **kwargs: Any) -> bool:
        if path.name.endswith(".copy"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, data, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint_module, "write_atomic", copy_refused)
        with pytest.raises(OSError, match="No space left"):
            checkpoint.remove("u1")
    assert checkpoint.claims == {} and loaded(tmp_path).claims == {}
