"""The features.d file: atomic replacement, mode 0644, removal, and a full disk reported clearly."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from kubegpu.common import files as files_module
from kubegpu.labels.output import FileOutput, OutputError, StdoutOutput, format_labels, make_output

LABELS = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4", "nvidia.com/cuda.driver.rev": ""}
TEXT = "nvidia.com/cuda.driver.rev=\nnvidia.com/gpu.count=4\nnvidia.com/gpu.product=Tesla-T4\n"


def test_format_is_sorted_key_value_lines() -> None:
    assert format_labels(LABELS).decode() == TEXT
    assert format_labels({}) == b""


def test_file_is_written_with_mode_0644_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "gfd"
    old = os.umask(0o077)
    try:
        FileOutput(path).write(LABELS)
    finally:
        os.umask(old)
    assert path.read_text() == TEXT
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert list((path.parent / "gfd-tmp").iterdir()) == []  # nothing left behind in the temp dir
    assert sorted(p.name for p in path.parent.iterdir()) == ["gfd", "gfd-tmp"]


def test_rewrite_replaces_the_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    out = FileOutput(path)
    out.write(LABELS)
    before = path.stat().st_ino
    with path.open() as reader:  # a reader that opened the old file keeps reading a whole old file
        out.write({"a": "b"})
        assert reader.read() == TEXT
    assert path.read_text() == "a=b\n"
    assert path.stat().st_ino != before


def test_full_disk_keeps_the_old_file_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gfd"
    out = FileOutput(path)
    out.write(LABELS)

    def disk_full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files_module, "_write_fully", disk_full)
    with pytest.raises(OutputError) as caught:
        out.write({"a": "b"})
    message = str(caught.value)
    assert f"error atomically writing file '{path}'" in message
    assert "No space left on device (ENOSPC)" in message
    assert "the filesystem is full" in message
    assert path.read_text() == TEXT
    assert list((tmp_path / "gfd-tmp").iterdir()) == []  # the partial temp file is gone


def test_unwritable_location_is_an_output_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(OutputError, match="Not a directory"):
        FileOutput(blocker / "gfd").write(LABELS)


def test_remove_deletes_file_and_temp_dir_and_tolerates_absence(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    out = FileOutput(path)
    out.write(LABELS)
    (tmp_path / "gfd-tmp" / "gfd-stale").write_text("x")  # e.g. left by a killed writer
    out.remove()
    assert list(tmp_path.iterdir()) == []
    out.remove()  # nothing left to remove: no error


def test_stdout(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    StdoutOutput().write(LABELS)
    StdoutOutput().remove()
    assert capsysbinary.readouterr().out.decode() == TEXT


def test_make_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(make_output(""), StdoutOutput)
    assert isinstance(make_output("-"), StdoutOutput)
    monkeypatch.chdir(tmp_path)
    assert make_output("features.d/gfd") == FileOutput(tmp_path / "features.d" / "gfd")
