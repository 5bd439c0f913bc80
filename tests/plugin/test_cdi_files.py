"""The CDI root and spec files get their modes whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.plugin.cdi_files import CdiSpecWriter


@pytest.fixture
def umask_000() -> Iterator[None]:
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_a_cdi_root_we_create_is_0755_and_the_specs_0644(tmp_path: Path, umask_000: None) -> None:
    root = tmp_path / "run" / "cdi"
    writer = CdiSpecWriter(root)
    writer.refresh(
        {"gpu": {"cdiVersion": "0.5.0", "kind": "k8s.device-plugin.nvidia.com/gpu", "devices": []}}
    )
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "run", root, writer.path("gpu"))]
    assert modes == [0o755, 0o755, 0o644]  # under umask 000 the directories were 0777


def test_an_existing_cdi_root_keeps_its_mode(tmp_path: Path, umask_000: None) -> None:
    root = tmp_path / "cdi"
    root.mkdir()
    os.chmod(root, 0o700)
    CdiSpecWriter(root).refresh({"gpu": {"cdiVersion": "0.5.0", "kind": "x/gpu", "devices": []}})
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
