"""Directories we create get the mode we choose, whatever the process umask.

`mkdir(mode=...)` is masked by the umask (under umask 077 a 0755 CDI root becomes 0700 and the container
runtime cannot read the specs; under umask 000 parents become world-writable), and `os.makedirs` gives the
mode to the last directory only. `ensure_dir` sets it on every directory it creates and leaves existing
ones alone: a directory the kubelet made is the kubelet's.
"""

from __future__ import annotations

import os
from pathlib import Path


def ensure_dir(path: Path, mode: int) -> list[Path]:
    """Create `path` and its missing parents, each with exactly `mode`; return the ones created."""
    missing = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    created = []
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            if directory.is_dir():
                continue  # someone else made it meanwhile: theirs, left as it is
            raise
        os.chmod(directory, mode)
        created.append(directory)
    return created
