"""The node-wide lock that serializes Prepare and Unprepare across driver processes (a rolling update runs
an old and a new driver pod at once): an exclusive flock on <plugin dir>/pu.lock, NVIDIA's name, so an old
NVIDIA driver pod and kubegpu exclude each other too."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "pu.lock"


class LockTimeout(RuntimeError):
    kind = "lock"


class NodeLock:
    """An exclusive flock on <plugin dir>/pu.lock, waited for at most `timeout` seconds.

    The file stays open for the process's life; the lock is taken and dropped per step of a call, never
    held while the API server is asked. Uncontended (the normal case) it is taken at once without leaving
    the event loop."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def try_acquire(self) -> bool:
        try:
            fcntl.flock(self._open(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return False

    def acquire(self) -> None:
        """Blocking (call it in a thread): poll until the lock is ours or the timeout passes."""
        deadline = time.monotonic() + self.timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"timed out after {self.timeout:g} s waiting for {self.path}: another driver process "
                    "on this node is preparing or unpreparing (a rolling update?); the kubelet retries"
                )
            time.sleep(0.02)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
