"""Shared state of a fake NVML: the faults and events several processes see through one directory.

The daemon (running the fake) and `kubegpu fake-nvml inject` (another process) meet in a state directory:

- `faults.json`: per-GPU fault flags (lost, ECC counters, pending row remap), replaced atomically
  (temp file + rename) so a reader never sees a half-written file.
- `events.jsonl`: an append-only log of injected NVML events, one JSON object a line. Each event set
  remembers a byte offset and only delivers what was appended after it, like a real event set only
  delivers events raised after it was created.
- `meta.json`: which profile the fake runs, so the injector can check a GPU index.
- `mig.json`: the GPU and compute instances created through NVML (`fake_mig.py`), so that they outlive the
  process that created them, as real ones do, and every process on the node sees the same ones.
- `sysfs/`: the sysfs tree the fake writes (`bus/pci/devices/<busid>/numa_node`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pynvml

from kubegpu.common.files import FileProblem, read_bytes, write_atomic
from kubegpu.node.nvml.pci import WHOLE_GPU
from kubegpu.settings.table import FAKE_NVML_STATE_ENV as STATE_ENV

EVENTS_FILE = "events.jsonl"
FAULTS_FILE = "faults.json"
META_FILE = "meta.json"
MIG_FILE = "mig.json"
SYSFS_DIR = "sysfs"
_LOCK_FILE = ".lock"
STATE_FILE_LIMIT = 16 * 1024 * 1024  # faults of a few GPUs, a profile's name: kilobytes

XID_FALLEN_OFF_BUS = 79


class StateDirError(RuntimeError):
    """The state directory is missing or unusable; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One line of the events log: an NVML event for a GPU, or a one-shot failure of the event wait."""

    kind: Literal["event", "wait_error"]
    gpu: int | None = None
    event_type: int = 0  # pynvml.nvmlEventType* bit
    data: int = 0  # the XID for XID events
    gi: int = WHOLE_GPU
    ci: int = WHOLE_GPU

    def to_line(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> EventRecord:
        return cls(**json.loads(line))


@dataclass(frozen=True, slots=True)
class GpuFaults:
    """Faults injected into one GPU."""

    lost: bool = False
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remap_pending: bool = False  # a row remap (A100+) or page retirement (older) waits for a GPU reset
    flaky: float = 0.0  # probability that any NVML call on the GPU fails with NVML_ERROR_UNKNOWN


_NO_FAULTS = GpuFaults()


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults of every GPU, keyed by GPU index."""

    gpus: Mapping[int, GpuFaults] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuFaults:
        return self.gpus.get(index, _NO_FAULTS)

    def to_json(self) -> bytes:
        body = {str(i): dataclasses.asdict(f) for i, f in sorted(self.gpus.items()) if f != _NO_FAULTS}
        return json.dumps({"gpus": body}, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: Path | str = FAULTS_FILE) -> Faults:
        """Raises StateDirError naming the file when it is not faults as `to_json` writes them."""
        body = state_file_object(raw, path).get("gpus", {})
        try:
            return cls({int(i): GpuFaults(**f) for i, f in body.items()})
        except (AttributeError, TypeError, ValueError) as err:
            raise torn_state_file(path, f"its gpus are not fault flags by GPU index ({err})") from None


def torn_state_file(path: Path | str, problem: str) -> StateDirError:
    return StateDirError(
        f"fake NVML state file {path} {problem}; remove it (the fake NVML and the injector write it again)"
    )


def state_file_object(raw: bytes, path: Path | str) -> dict[str, Any]:
    """A state file's JSON object, or StateDirError naming the file and the fix (a torn or foreign file)."""
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise torn_state_file(path, f"is not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise torn_state_file(
            path, f"is not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    if not isinstance(value, dict):
        raise torn_state_file(path, "is not a JSON object")
    return value


def read_state_file(path: Path) -> bytes:
    try:
        return read_bytes(path, limit=STATE_FILE_LIMIT, what="fake NVML state file")
    except FileProblem as err:
        if not path.exists():
            raise FileNotFoundError(path) from err
        raise StateDirError(str(err)) from err


class StateDir:
    """A fake NVML state directory. Safe to use from several processes and threads at once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._faults_path = os.fspath(self.path / FAULTS_FILE)  # a str: stat()ed on every NVML call
        self._faults_key: tuple[int, int, int] | None = None
        self._faults = Faults()

    @classmethod
    def named(cls, path: Path | None) -> StateDir:
        """The directory --state-dir or KUBEGPU_FAKE_NVML_STATE names (None: neither); it must exist."""
        if path is None:
            raise StateDirError(
                f"{STATE_ENV} is not set: set it to the state directory the fake NVML daemon was "
                f"started with (the daemon's own {STATE_ENV}), or pass --state-dir"
            )
        return cls.existing(path)

    @classmethod
    def existing(cls, path: Path) -> StateDir:
        if not path.is_dir():
            raise StateDirError(
                f"fake NVML state directory {path} does not exist: start the daemon with "
                f"{STATE_ENV}={path} first, or check the path for a typo"
            )
        return cls(path)

    def create(self) -> StateDir:
        (self.path / SYSFS_DIR).mkdir(parents=True, exist_ok=True)
        return self

    @property
    def sysfs_root(self) -> Path:
        return self.path / SYSFS_DIR

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    # -- faults -------------------------------------------------------------------------------------

    def faults(self) -> Faults:
        """Current faults. Every fake NVML device call asks, so it re-reads only a changed file."""
        try:
            st = os.stat(self._faults_path)
        except FileNotFoundError:
            return Faults()
        key = (st.st_ino, st.st_mtime_ns, st.st_size)  # rename gives a new inode, so this sees every write
        if key != self._faults_key:
            self._faults = Faults.from_json(read_state_file(Path(self._faults_path)), self._faults_path)
            self._faults_key = key
        return self._faults

    def update_gpu_faults(self, gpu: int, change: Callable[[GpuFaults], GpuFaults]) -> GpuFaults:
        """Read-modify-write one GPU's faults under the directory lock."""
        with self.locked():
            path = self.path / FAULTS_FILE
            current = Faults.from_json(read_state_file(path), path) if path.exists() else Faults()
            new = change(current.gpu(gpu))
            write_atomic(path, Faults({**current.gpus, gpu: new}).to_json(), durable=False)
            return new

    # -- events -------------------------------------------------------------------------------------

    def append_event(self, record: EventRecord) -> None:
        # One write of one line with O_APPEND: readers see whole lines or nothing of it.
        with self.locked():
            fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, record.to_line())
            finally:
                os.close(fd)

    def events_end(self) -> int:
        """Byte offset of the end of the events log (where the next event will start)."""
        try:
            return os.stat(self.events_path).st_size
        except FileNotFoundError:
            return 0

    def read_events(self, offset: int) -> tuple[list[tuple[int, EventRecord]], int]:
        """Complete records from `offset` on, each with its start offset, and the offset after them."""
        if self.events_end() <= offset:
            return [], offset
        with open(self.events_path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        records = []
        pos = offset
        for line in chunk.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # a writer is mid-line; pick it up on the next read
            records.append((pos, EventRecord.from_line(line)))
            pos += len(line)
        return records, pos

    # -- metadata -----------------------------------------------------------------------------------

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        write_atomic(self.path / META_FILE, json.dumps(meta, indent=2).encode(), durable=False)

    def read_meta(self) -> dict[str, Any] | None:
        path = self.path / META_FILE
        try:
            return state_file_object(read_state_file(path), path)
        except FileNotFoundError:
            return None

    # -- created MIG instances ----------------------------------------------------------------------

    def mig_key(self) -> tuple[int, int, int] | None:
        """Changes whenever `mig.json` is replaced (None: no instance was ever created)."""
        try:
            st = os.stat(self.path / MIG_FILE)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read_mig(self) -> dict[str, Any]:
        path = self.path / MIG_FILE
        try:
            return state_file_object(read_state_file(path), path)
        except FileNotFoundError:
            return {}

    def update_mig(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Read-modify-write `mig.json` under the directory lock: two processes never take one placement."""
        with self.locked():
            new = change(self.read_mig())
            write_atomic(self.path / MIG_FILE, json.dumps(new, indent=2).encode(), durable=False)
            return new

    # -- fault injection ----------------------------------------------------------------------------

    def inject_xid(self, gpu: int, xid: int, gi: int = WHOLE_GPU, ci: int = WHOLE_GPU) -> None:
        self.append_event(EventRecord("event", gpu, pynvml.nvmlEventTypeXidCriticalError, xid, gi=gi, ci=ci))

    def inject_lost(self, gpu: int) -> None:
        """The GPU falls off the bus: every call on it fails from now on, then XID 79 is raised."""
        self.update_gpu_faults(gpu, lambda f: dataclasses.replace(f, lost=True))
        self.inject_xid(gpu, XID_FALLEN_OFF_BUS)

    def inject_ecc(self, gpu: int, kind: Literal["single", "double"]) -> None:
        if kind == "single":
            self.update_gpu_faults(gpu, lambda f: dataclasses.replace(f, ecc_corrected=f.ecc_corrected + 1))
            event_type = pynvml.nvmlEventTypeSingleBitEccError
        else:
            self.update_gpu_faults(
                gpu,
                lambda f: dataclasses.replace(f, ecc_uncorrected=f.ecc_uncorrected + 1, remap_pending=True),
            )
            event_type = pynvml.nvmlEventTypeDoubleBitEccError
        self.append_event(EventRecord("event", gpu, event_type, 0))

    def inject_wait_error(self) -> None:
        """The next nvmlEventSetWait of every existing event set raises NVML_ERROR_UNKNOWN."""
        self.append_event(EventRecord("wait_error"))

    def inject_flaky(self, gpu: int, rate: float) -> None:
        """From now on a fraction `rate` of NVML calls on the GPU fail with NVML_ERROR_UNKNOWN."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"flaky rate {rate} is not between 0 and 1")
        self.update_gpu_faults(gpu, lambda f: dataclasses.replace(f, flaky=rate))

    def recover(self, gpu: int) -> None:
        """As after a GPU reset: back on the bus, no pending remap, no flakiness (ECC counts stay)."""
        self.update_gpu_faults(
            gpu, lambda f: dataclasses.replace(f, lost=False, remap_pending=False, flaky=0.0)
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The directory's lock: writers of its files (faults, events, usage) take it in turn."""
        with open(self.path / _LOCK_FILE, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
