"""What the driver has prepared, on disk, so Unprepare works after the claim is gone and after a restart.

Two phases per claim, as NVIDIA's checkpoint V2: `PrepareStarted` is written before anything is touched
(the CDI spec), `PrepareCompleted` once Prepare is done. A claim found `PrepareStarted` was cut short (a
crash, a SIGKILL): its leftovers are rolled back before it is prepared again. The node's boot ID is kept:
after a reboot nothing prepared before it exists any more, so the claims are dropped.

The file is JSON with a CRC-32 of its content; it is replaced atomically (write, fsync, rename).
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
            PreparedDevice(tuple(d["request_names"]), d["pool"], d["device"], tuple(d["cdi_ids"]))
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
        self.boot_id = boot_id
        self.claims: dict[str, PreparedClaim] = {}
        self.stale: dict[str, PreparedClaim] = {}  # claims from before a reboot, for cleanup

    def load(self) -> None:
        """Read the file (none yet: empty). A corrupt file is moved aside with an error logged: the driver
        starts empty rather than not at all (Unprepare of an unknown claim succeeds anyway)."""
        if not self.path.exists():
            return
        try:
            data = read_bytes(self.path, limit=_LIMIT, what="DRA checkpoint")
        except FileProblem as err:
            self._quarantine(str(err))
            return
        try:
            self._parse(data)
        except (CheckpointError, ValueError, KeyError, TypeError) as err:
            self._quarantine(f"{self.path}: {err}")

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

    def _quarantine(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        log.error(
            "cannot read the DRA checkpoint, starting without it (moved to %s; claims prepared before are "
            "unprepared as unknown): %s",
            aside,
            why,
        )
        os.replace(self.path, aside)

    def save(self) -> None:
        content = {"nodeBootID": self.boot_id, "preparedClaims": [c.to_json() for c in self.claims.values()]}
        body = json.dumps(content, sort_keys=True, separators=(",", ":"))
        data = {"version": VERSION, "checksum": zlib.crc32(body.encode()), "data": body}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(data).encode(), mode=0o600)

    def put(self, claim: PreparedClaim) -> None:
        self.claims[claim.uid] = claim
        self.save()

    def remove(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self.save()

    def holders(self, device: str, except_uid: str) -> Iterator[PreparedClaim]:
        """Other claims that hold `device` (pool-local name)."""
        for claim in self.claims.values():
            if claim.uid != except_uid and any(d.device == device for d in claim.devices):
                yield claim


def read_boot_id(path: Path) -> str:
    """The node's boot ID (/proc/sys/kernel/random/boot_id); "" when unreadable (no reboot detection)."""
    try:
        return path.read_text().strip()
    except OSError as err:
        log.warning("cannot read the boot ID from %s, reboots will not be detected: %s", path, err)
        return ""
