"""What the driver has prepared, on disk, so Unprepare works after the claim is gone and after a restart.

Two phases per claim, as NVIDIA's checkpoint V2: `PrepareStarted` is written before anything is touched
(the CDI spec), `PrepareCompleted` once Prepare is done. A claim found `PrepareStarted` was cut short (a
crash, a SIGKILL): its leftovers are rolled back before it is prepared again. The node's boot ID is kept:
after a reboot nothing prepared before it exists any more, so the claims are dropped.

The file is JSON with a CRC-32 of its content; it is replaced atomically (write, fsync, rename), and a
second copy (`checkpoint.json.copy`) is written after it, so a torn or damaged file is read from the other
one. When neither can be read the claims are not forgotten: the driver rebuilds them from the per-claim CDI
specs on disk and the API server (`dra/rebuild.py`); a corrupt file is moved aside for a post-mortem.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.common.files import FileProblem, read_bytes, write_atomic

log = logging.getLogger(__name__)

VERSION = "kubegpu.dra/v1"
STARTED = "PrepareStarted"
COMPLETED = "PrepareCompleted"
_LIMIT = 64 * 1024 * 1024  # a node holds at most a few thousand claims; anything bigger is not ours


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a claim, as Prepare answered it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    admin_access: bool = False  # may share the device with the claim that uses it (DRAAdminAccess)
    share_id: str | None = None  # one share of a device several claims hold (ConsumableShares); None: whole


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    state: str  # STARTED or COMPLETED
    devices: tuple[PreparedDevice, ...] = ()
    sharing: dict[str, Any] = field(default_factory=dict)  # the applied config, for logs and `doctor`

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["devices"] = [asdict(d) for d in self.devices]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PreparedClaim:
        devices = tuple(
            PreparedDevice(
                tuple(d["request_names"]),
                d["pool"],
                d["device"],
                tuple(d["cdi_ids"]),
                bool(d.get("admin_access", False)),
                d.get("share_id") or None,
            )
            for d in raw.get("devices", [])
        )
        state = raw["state"]
        if state not in (STARTED, COMPLETED):
            raise CheckpointError(f"claim {raw.get('uid')}: unknown state {state!r}")
        return cls(raw["uid"], raw["namespace"], raw["name"], state, devices, dict(raw.get("sharing", {})))


class Checkpoint:
    """The prepared claims by UID, saved on every change."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.copy_path = path.with_name(f"{path.name}.copy")
        self.boot_id = boot_id
        self.claims: dict[str, PreparedClaim] = {}
        self.stale: dict[str, PreparedClaim] = {}  # claims from before a reboot, for cleanup
        self.lost = False  # the last load found a checkpoint but could read neither copy of it
        self._seen: tuple[int, int, int] | None = (
            None  # (inode, mtime, size) of the file as last read/written
        )

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> bool:
        """Read the file again if someone else (another driver process) replaced it since we last did;
        True when it was read again."""
        if self._signature() == self._seen:
            return False
        self.load()
        return True

    def load(self) -> None:
        """Read the file, or its copy when the file is missing or damaged (then write the file again). None:
        empty. Neither readable: empty with `lost` set, each damaged file moved aside with an error logged;
        the caller rebuilds the claims from what is left on disk."""
        self.claims = {}
        self.lost = False
        problems: list[str] = []
        for path in (self.path, self.copy_path):
            if not path.exists():
                continue
            problem = self._read(path)
            if problem is None:
                if path == self.copy_path:  # the file itself is missing or damaged: write it again
                    why = problems[0] if problems else f"the DRA checkpoint {self.path} is missing"
                    log.error("%s; read its copy %s instead (%d claim(s))", why, path, len(self.claims))
                    self.save()
                self._seen = self._signature()
                return
            problems.append(self._quarantine(path, problem))
        self._seen = self._signature()
        if problems:
            self.lost = True
            log.error(
                "%s; no copy of the DRA checkpoint is readable: rebuilding the prepared claims from the "
                "CDI specs on disk and the API server",
                "; ".join(problems),
            )

    def _read(self, path: Path) -> str | None:
        """Load `path` into `claims`; what is wrong with it, or None."""
        try:
            data = read_bytes(path, limit=_LIMIT, what="DRA checkpoint")
        except FileProblem as err:
            return err.problem
        try:
            self._parse(data)
        except (CheckpointError, ValueError, KeyError, TypeError, AttributeError) as err:
            self.claims = {}
            return str(err)
        return None

    def _parse(self, data: bytes) -> None:
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise CheckpointError(f"not a {VERSION} checkpoint")
        body = raw.get("data")
        if not isinstance(body, str) or zlib.crc32(body.encode()) != raw.get("checksum"):
            raise CheckpointError("checksum mismatch (the file was changed or cut short)")
        content = json.loads(body)
        claims = {c["uid"]: PreparedClaim.from_json(c) for c in content["preparedClaims"]}
        if content.get("nodeBootID") != self.boot_id:
            log.info(
                "the node rebooted since the checkpoint was written (boot ID %s, now %s): forgetting %d "
                "prepared claim(s)",
                content.get("nodeBootID"),
                self.boot_id,
                len(claims),
            )
            self.stale = claims
            self.claims = {}
            self.save()
            return
        self.claims = claims

    def _quarantine(self, path: Path, why: str) -> str:
        """Move a damaged file aside (kept for a post-mortem); the problem, for the log."""
        aside = path.with_name(f"{path.name}.corrupt-{time.time_ns()}")
        try:
            os.replace(path, aside)
        except OSError as err:
            return f"cannot read the DRA checkpoint {path} ({why}) nor move it aside: {err.strerror}"
        return f"cannot read the DRA checkpoint {path} (moved to {aside}): {why}"

    def save(self) -> None:
        encoded = self._encoded()
        self._write_file(encoded)
        self._write_copy(encoded)

    def put(self, claim: PreparedClaim) -> None:
        before = dict(self.claims)
        self.claims[claim.uid] = claim
        self._save_or_undo(before)

    def remove(self, uid: str) -> None:
        if uid in self.claims:
            before = dict(self.claims)
            del self.claims[uid]
            self._save_or_undo(before)

    def _save_or_undo(self, before: dict[str, PreparedClaim]) -> None:
        """save(); when the disk refuses the file itself, the claims in memory go back to what the file
        still holds, and the error is raised: the kubelet's retry must find the claim as it is on disk (an
        entry dropped from memory only would answer the retry of its Unprepare with success, and hold its
        device for the next driver process). Once the file is written the change holds, whatever the copy."""
        encoded = self._encoded()
        try:
            self._write_file(encoded)
        except OSError:
            self.claims.clear()
            self.claims.update(before)
            raise
        self._write_copy(encoded)

    def _encoded(self) -> bytes:
        content = {"nodeBootID": self.boot_id, "preparedClaims": [c.to_json() for c in self.claims.values()]}
        body = json.dumps(content, sort_keys=True, separators=(",", ":"))
        data = {"version": VERSION, "checksum": zlib.crc32(body.encode()), "data": body}
        return json.dumps(data).encode()

    # The file, then its copy. Each is replaced whole (a write cut short leaves the previous one), and the
    # file is durable; the copy, there for a file damaged from outside (or truncated, or deleted), skips the
    # fsync: it costs a Prepare as much as the file's, and should a crash also lose the copy, the file is
    # there, and without either the claims are rebuilt from their specs.
    def _write_file(self, encoded: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, encoded, mode=0o600)
        self._seen = self._signature()

    def _write_copy(self, encoded: bytes) -> None:
        write_atomic(self.copy_path, encoded, mode=0o600, durable=False)

    def holders(self, device: str, except_uid: str) -> Iterator[PreparedClaim]:
        """Other claims that hold `device` (pool-local name) for their own use (not with admin access)."""
        for claim in self.claims.values():
            if claim.uid != except_uid and any(
                d.device == device and not d.admin_access for d in claim.devices
            ):
                yield claim


def read_boot_id(path: Path) -> str:
    """The node's boot ID (/proc/sys/kernel/random/boot_id); "" when unreadable (no reboot detection)."""
    try:
        return path.read_text().strip()
    except OSError as err:
        log.warning("cannot read the boot ID from %s, reboots will not be detected: %s", path, err)
        return ""
