"""A damaged checkpoint on a disk that will not let it be moved aside (read-only): the load says so once,
the claims are to be rebuilt, and the same damaged file is not read and logged again on every call; a good
file written later (another driver process, the disk back) is read."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from kubegpu.dra.checkpoint import COMPLETED, Checkpoint, PreparedClaim

BOOT = "6e1f0c55-0000-4000-8000-000000000001"
CLAIM = PreparedClaim("u1", "default", "c", COMPLETED)
LOG = "kubegpu.dra.checkpoint"


def test_a_damaged_checkpoint_that_cannot_be_moved_aside_is_logged_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file, copy = tmp_path / "checkpoint.json", tmp_path / "checkpoint.json.copy"
    Checkpoint(file, BOOT).put(CLAIM)
    file.write_text('{"version": "kubegpu.dra/v0"}')
    copy.write_bytes(b"\x00")
    replace = os.replace

    def read_only(src: str | Path, dst: str | Path) -> None:
        if Path(src).name.startswith("checkpoint.json"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(src), None, str(dst))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", read_only)
    checkpoint = Checkpoint(file, BOOT)
    with caplog.at_level(logging.ERROR, logger=LOG):
        checkpoint.load()
        assert (checkpoint.claims, checkpoint.lost) == ({}, True)
        assert not checkpoint.refresh()  # the same damaged file: not read (and logged) again
    assert caplog.messages == [
        f"cannot read the DRA checkpoint {file} (not a kubegpu.dra/v1 checkpoint) nor move it aside: "
        f"Read-only file system; cannot read the DRA checkpoint {copy} (Expecting value: line 1 column 1 "
        "(char 0)) nor move it aside: Read-only file system; no copy of the DRA checkpoint is readable: "
        "rebuilding the prepared claims from the CDI specs on disk and the API server"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.json.copy"]

    monkeypatch.setattr(os, "replace", replace)  # the disk is writable again; another process saves
    Checkpoint(file, BOOT).put(CLAIM)
    assert checkpoint.refresh()
    assert (checkpoint.claims, checkpoint.lost) == ({"u1": CLAIM}, False)
