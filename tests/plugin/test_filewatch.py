"""The config-file watcher sees every way a config file changes on a node, including a change made before
it was armed (the daemon reads the file, then spends time discovering GPUs before the watch starts)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from kubegpu.plugin.filewatch import file_identity, watch_file


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


async def watching(path: Path, changes: Changes, since: object) -> asyncio.Task[None]:
    task = asyncio.create_task(watch_file(path, changes, since=since))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)  # armed, and past its first look
    return task


async def test_a_change_made_before_the_watch_was_armed_is_reported_once_armed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    read = file_identity(path)
    path.write_bytes(bytes(range(256)))  # changed after the read, before any watch exists
    changes = Changes()
    task = await watching(path, changes, read)
    try:
        await changes.next()
        assert changes.count == 1
    finally:
        task.cancel()


async def test_an_unchanged_file_raises_nothing_when_the_watch_is_armed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    changes = Changes()
    task = await watching(path, changes, file_identity(path))
    try:
        await asyncio.sleep(0.5)
        assert changes.count == 0
    finally:
        task.cancel()


async def test_in_place_writes_renames_and_symlink_swaps_are_each_reported(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    changes = Changes()
    task = await watching(path, changes, file_identity(path))
    try:
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
    finally:
        task.cancel()
