"""Replacing a file so that readers see the old content or the new, never a mix or nothing."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    tmp_dir: Path | None = None,
    skip_unchanged: bool = False,
    durable: bool = True,
) -> bool:
    """Write `data` to a temporary file and rename it over `path`. Returns False when skipped as unchanged.

    `mode` is set explicitly (mkstemp creates 0600, and the umask must not decide what others may read).
    `tmp_dir` must be on the same file system as `path` (rename is atomic only there); it defaults to
    `path`'s directory. `durable` fsyncs before the rename, so a crash cannot leave an empty file behind.
    The modification time is set from a precise clock, so readers may cache on (inode, mtime).
    """
    if skip_unchanged:
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return False
    directory = tmp_dir or path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            _write_fully(fd, data)
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        now = time.time_ns()
        os.utime(tmp, ns=(now, now))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
