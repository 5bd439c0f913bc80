"""Where labels go with --use-node-feature-api=false: NFD's features.d file (written atomically) or stdout.
(The NodeFeature object, GFD's default output, is `nodefeature.py`.)

The file holds one `key=value` line per label, sorted by key (GFD writes Go map order, i.e. any order;
NFD does not care). It is written as GFD does: into a temporary file in a `gfd-tmp` directory next to it,
then renamed over it, mode 0644, so NFD never reads half a file and never mistakes the temporary file for
a feature file (it does not descend into directories). `remove()` deletes the file and `gfd-tmp`, as GFD
does when it exits.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kubegpu.common.files import write_atomic

log = logging.getLogger(__name__)

TMP_DIR_NAME = "gfd-tmp"
FILE_MODE = 0o644
STDOUT = ""  # GFD's spelling of "print the labels"; "-" is accepted for it too


class OutputError(Exception):
    """Labels could not be written. The message names the target, the cause and what to do about it.

    `transient`: likely to pass by itself (the API server restarting, a lost connection), so worth retrying
    soon, with back-off. `fatal`: a setup problem no retry fixes (no CRD, no permission), so the labeller
    exits, as GFD does on any output error. Neither: retried at the next interval (a full disk).
    """

    def __init__(self, message: str, *, transient: bool = False, fatal: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        self.fatal = fatal


def format_labels(labels: Mapping[str, str]) -> bytes:
    return "".join(f"{key}={labels[key]}\n" for key in sorted(labels)).encode()


class LabelOutput(Protocol):
    def write(self, labels: Mapping[str, str]) -> None: ...

    def remove(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StdoutOutput:
    def write(self, labels: Mapping[str, str]) -> None:
        try:
            sys.stdout.buffer.write(format_labels(labels))
            sys.stdout.buffer.flush()
        except OSError as err:
            raise OutputError(f"cannot write the labels to stdout: {err}") from err

    def remove(self) -> None:
        """Nothing to remove."""


_HINTS = {
    errno.ENOSPC: "the filesystem is full: free space on it",
    errno.EDQUOT: "the disk quota is exhausted: free space or raise the quota",
    errno.EROFS: "the filesystem is read-only: mount the features.d directory read-write",
    errno.EACCES: "permission denied: run as a user that may write there (GFD runs as root)",
    errno.EPERM: "permission denied: run as a user that may write there (GFD runs as root)",
}


def _describe(path: Path, err: OSError) -> str:
    cause = err.strerror or str(err)
    name = errno.errorcode.get(err.errno or 0)
    if name:
        cause = f"{cause} ({name})"
    hint = _HINTS.get(err.errno or 0)
    text = f"error atomically writing file '{path}': {cause}"
    return f"{text}; {hint}" if hint else text


@dataclass(frozen=True, slots=True)
class FileOutput:
    path: Path

    @property
    def tmp_dir(self) -> Path:
        return self.path.parent / TMP_DIR_NAME

    def write(self, labels: Mapping[str, str]) -> None:
        """Replace the file atomically. On failure the previous file is left as it was."""
        try:
            # FILE_MODE, not mkstemp's 0600: NFD may run as another user.
            write_atomic(self.path, format_labels(labels), mode=FILE_MODE, tmp_dir=self.tmp_dir)
        except OSError as err:
            raise OutputError(_describe(self.path, err)) from err
        log.info("Wrote %d labels to %s", len(labels), self.path)

    def remove(self) -> None:
        """Delete the file and the gfd-tmp directory; problems are logged, not raised (we are exiting)."""
        try:
            shutil.rmtree(self.tmp_dir)
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("Error removing output file: failed to remove temporary output directory: %s", err)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:
            log.warning("Error removing output file: failed to remove output file: %s", err)
        else:
            log.info("Removed %s", self.path)


def make_output(output_file: str) -> LabelOutput:
    """stdout for "" or "-", else the file (made absolute, as GFD resolves it, so a chdir cannot move it)."""
    if output_file in (STDOUT, "-"):
        return StdoutOutput()
    return FileOutput(Path(os.path.abspath(output_file)))
