"""Watch one file for changes, the way config files change on Kubernetes nodes.

A ConfigMap volume swaps a `..data` symlink; config-manager swaps the `config.yaml` symlink; editors write
a temp file and rename it over. Watching the file itself misses all of these (its inode goes away), so we
watch its directory, and report when the file's resolved content identity (device, inode, size, mtime)
changes. Events are coalesced: a burst of renames yields one callback.

A change made before the watch is armed (between reading the config at start and arming inotify, which
can be seconds on a node whose NVML is slow to initialise) would raise no event, so the identity of what
was read is passed in, and compared again once the watch is armed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from asyncinotify import Inotify, Mask

log = logging.getLogger(__name__)

DEBOUNCE_S = 0.2
Identity = tuple[int, int, int, int] | None


def file_identity(path: Path) -> Identity:
    try:
        st = os.stat(path)  # follows symlinks: the identity of what the path resolves to now
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


async def watch_file(path: Path, on_change: Callable[[], Awaitable[None]], *, since: Identity) -> None:
    """Call `on_change` whenever what `path` resolves to changes; runs until cancelled.

    `since` is `file_identity(path)` taken before the caller read the file it is running with.
    """
    directory = path.parent
    last = since
    mask = Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE | Mask.ATTRIB
    while True:
        if not directory.is_dir():
            await asyncio.sleep(1.0)
            continue
        with Inotify() as inotify:
            try:
                inotify.add_watch(directory, mask)
            except OSError as err:
                log.warning("cannot watch %s for config changes (%s); retrying", directory, err)
                await asyncio.sleep(1.0)
                continue
            # Armed: anything that changed before now raised no event, so look once.
            current = file_identity(path)
            if current != last:
                last = current
                await on_change()
            async for _ in inotify:
                # Let a burst of events (symlink swaps, temp-file renames) settle before looking.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DEBOUNCE_S):
                        async for _ in inotify:
                            pass
                current = file_identity(path)
                if current != last:
                    last = current
                    await on_change()
