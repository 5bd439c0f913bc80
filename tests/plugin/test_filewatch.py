"""The config-file watcher sees every way a config file changes on a node, including a change made before
it was armed (the daemon reads the file, then spends time discovering GPUs before the watch starts)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kubegpu.plugin.filewatch import Identity, file_identity, watch_file


class Changes:
    def __init__(self) -> None:
        self.count = 0
        self.seen = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.seen.set()

    async def next(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self.seen.wait(), timeout)
        self.seen.clear()


@contextlib.asynccontextmanager
async def watching(path: Path, changes: Changes, since: Identity) -> AsyncIterator[None]:
    task = asyncio.create_task(watch_file(path, changes, since=since))
    await asyncio.sleep(0.3)  # armed, and past its first look
    try:
        yield
    finally:
        task.cancel()


@pytest.mark.parametrize(("changed_after_the_read", "reported"), [(True, 1), (False, 0)])
async def test_the_watch_reports_once_armed_what_changed_after_the_read_and_nothing_else(
    tmp_path: Path, changed_after_the_read: bool, reported: int
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    read = file_identity(path)
    if changed_after_the_read:
        path.write_bytes(bytes(range(256)))  # before any watch exists
    changes = Changes()
    async with watching(path, changes, read):
        await asyncio.sleep(0.5)
    assert changes.count == reported


async def test_in_place_writes_renames_and_symlink_swaps_are_each_reported(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    changes = Changes()
    async with watching(path, changes, file_identity(path)):
        path.write_text("version: v1\nflags: {}\n")  # in place
        await changes.next()
        temp = tmp_path / ".config.yaml.swp"
        temp.write_text("version: v1\n# an editor's save\n")
        os.rename(temp, path)  # an editor's write-and-rename
        await changes.next()
        target = tmp_path / "..2026_12_03_a" / "config.yaml"
        target.parent.mkdir()
        target.write_text("version: v1\n# from the ConfigMap\n")
        link = tmp_path / ".config.link"
        link.symlink_to(target)
        os.rename(link, path)  # a symlink swapped in atomically, as config-manager does
        await changes.next()
    assert changes.count == 3
