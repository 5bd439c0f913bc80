"""Directories get their mode whatever the umask; existing ones are left alone."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.common.dirs import ensure_dir


@pytest.fixture(params=[0o000, 0o077, 0o022])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_created_directory_gets_the_mode(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert ensure_dir(target, 0o750) == [tmp_path / "a", tmp_path / "a" / "b", target]
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", target)] == [0o750] * 3


def test_existing_directories_are_left_as_they_are(tmp_path: Path, umask: int) -> None:
    (tmp_path / "kubelets").mkdir()
    os.chmod(tmp_path / "kubelets", 0o700)
    assert ensure_dir(tmp_path / "kubelets", 0o755) == []
    assert mode(tmp_path / "kubelets") == 0o700
    assert ensure_dir(tmp_path / "kubelets" / "ours", 0o755) == [tmp_path / "kubelets" / "ours"]
    assert mode(tmp_path / "kubelets") == 0o700


def test_a_file_in_the_way_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        ensure_dir(tmp_path / "file" / "sub", 0o755)
