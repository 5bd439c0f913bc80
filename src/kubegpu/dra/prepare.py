"""NodePrepareResources / NodeUnprepareResources as the kubelet expects them, free of gRPC.

- Every claim of a call is answered; a claim that fails carries its own error, the others go on.
- Prepare is idempotent: a claim already prepared (this process or an earlier one: the checkpoint) gets the
  same devices and CDI IDs back without being prepared again. A claim whose last Prepare was cut short is
  rolled back first.
- Unprepare of a claim the driver does not know succeeds; it works from the checkpoint alone, so the claim
  may already be deleted.
- Calls are serialized: in the process, and across processes by a file lock in the plugin directory, so an
  old and a new driver pod never prepare at the same time during a rolling update. The lock waits a bounded
  time; a call that cannot get it fails every claim with the reason (the kubelet retries).
- The driver is the last line of defence: a device already prepared for another claim is refused (unless
  either claim has admin access).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kubegpu.dra.checkpoint import COMPLETED, STARTED, Checkpoint, PreparedClaim, PreparedDevice
from kubegpu.dra.claim_cdi import ClaimSpecs, cdi_id
from kubegpu.dra.claims import AllocatedClaim, ClaimError, ClaimGone, ClaimReader
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.gpuconfig import (
    GPU_CONFIG,
    MIG_CONFIG,
    ConfigError,
    DeviceConfig,
    Sharing,
    configs_for_results,
)
from kubegpu.node.inventory import Inventory

log = logging.getLogger(__name__)

LOCK_FILE = "pu.lock"  # NVIDIA's name, so an old NVIDIA driver pod and kubegpu exclude each other too


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class Outcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class LockTimeout(RuntimeError):
    pass


class NodeLock:
    """An exclusive flock on <plugin dir>/pu.lock, waited for at most `timeout` seconds.

    The file stays open for the process's life; the lock is taken and dropped per call. Uncontended (the
    normal case) it is taken at once without leaving the event loop."""

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


class Preparer:
    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        checkpoint: Checkpoint,
        specs: ClaimSpecs,
        reader: ClaimReader,
        lock: NodeLock,
        devices: Callable[[], tuple[Inventory, dict[str, DraDevice]]],
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.checkpoint = checkpoint
        self.specs = specs
        self.reader = reader
        self.lock = lock
        self.devices = devices
        self._serial = asyncio.Lock()

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        async with self._serial:
            try:
                await self._lock()
            except LockTimeout as err:
                return {c.uid: Outcome(error=str(err)) for c in claims}
            try:
                return {c.uid: await self._prepare_one(c) for c in claims}
            finally:
                self.lock.release()

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        async with self._serial:
            try:
                await self._lock()
            except LockTimeout as err:
                return {c.uid: str(err) for c in claims}
            try:
                return {c.uid: self._unprepare_one(c) for c in claims}
            finally:
                self.lock.release()

    async def _lock(self) -> None:
        """The node-wide lock, then the checkpoint as the last holder left it: another driver process (a
        rolling update) may have prepared or unprepared claims since this one last looked."""
        if not self.lock.try_acquire():
            await asyncio.to_thread(self.lock.acquire)
        self.checkpoint.refresh()

    # ---- one claim ---------------------------------------------------------------------------------------

    async def _prepare_one(self, ref: ClaimRef) -> Outcome:
        known = self.checkpoint.claims.get(ref.uid)
        if known is not None and known.state == COMPLETED:
            log.debug("claim %s/%s (%s) is already prepared", ref.namespace, ref.name, ref.uid)
            return Outcome(known.devices)
        if known is not None:  # cut short earlier: undo what it may have done, then start over
            log.info("claim %s/%s (%s): rolling back an unfinished Prepare", ref.namespace, ref.name, ref.uid)
            self.specs.remove(ref.uid)
            self.checkpoint.remove(ref.uid)
        try:
            claim = await asyncio.to_thread(self.reader.get, ref.namespace, ref.name, ref.uid)
            return self._prepare_allocated(claim)
        except (ClaimError, ConfigError) as err:
            log.warning("cannot prepare claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, err)
            return Outcome(error=str(err))
        except OSError as err:  # the CDI root or the checkpoint cannot be written
            self.specs.remove(ref.uid)
            self.checkpoint.remove(ref.uid)
            message = (
                f"claim {ref.namespace}/{ref.name}: cannot write {err.filename or 'a file'}: {err.strerror}"
            )
            log.error("%s", message)
            return Outcome(error=message)

    def _prepare_allocated(self, claim: AllocatedClaim) -> Outcome:
        what = f"claim {claim.namespace}/{claim.name}"
        inventory, table = self.devices()
        picked: list[DraDevice] = []
        for result in claim.results:
            if result.pool != self.node_name:
                raise ClaimError(
                    f"{what}: device {result.device} was allocated from pool {result.pool}, this node's pool "
                    f"is {self.node_name}"
                )
            device = table.get(result.device)
            if device is None:
                raise ClaimError(
                    f"{what}: device {result.device} is not published by this node (it publishes "
                    f"{', '.join(table) or 'no devices'})"
                )
            if not result.admin_access:
                for other in self.checkpoint.holders(result.device, claim.uid):
                    raise ClaimError(
                        f"{what}: device {result.device} is already prepared for claim "
                        f"{other.namespace}/{other.name} ({other.uid})"
                    )
            picked.append(device)
        sharing = self._sharing(claim, picked)
        prepared = tuple(
            PreparedDevice(
                (result.request_name,),
                result.pool,
                result.device,
                (cdi_id(self.driver_name, claim.uid, result.device),),
            )
            for result in claim.results
        )
        summary = {name: s.summary() for name, s in sharing.items() if s is not None}
        started = PreparedClaim(claim.uid, claim.namespace, claim.name, STARTED, prepared, summary)
        self.checkpoint.put(started)
        unique = list({d.name: d for d in picked}.values())
        self.specs.write(claim.uid, unique, inventory, sharing)
        self.checkpoint.put(
            PreparedClaim(claim.uid, claim.namespace, claim.name, COMPLETED, prepared, summary)
        )
        log.info(
            "prepared %s (%s): %s",
            what,
            claim.uid,
            ", ".join(f"{d.device} for {d.request_names[0]}" for d in prepared),
        )
        for name, config in summary.items():
            log.info("%s: device %s shared by %s", what, name, config)
        return Outcome(prepared)

    def _sharing(self, claim: AllocatedClaim, picked: list[DraDevice]) -> dict[str, Sharing | None]:
        """The sharing config of each picked device (by device name); ConfigError for a config that does
        not fit the device it applies to."""
        configs = configs_for_results(claim.configs, self.driver_name, [r.request for r in claim.results])
        out: dict[str, Sharing | None] = {}
        for result, device in zip(claim.results, picked, strict=True):
            config: DeviceConfig | None = configs.get(result.request) or configs.get(result.request_name)
            if config is None:
                out.setdefault(device.name, None)
                continue
            wanted = MIG_CONFIG if device.mig else GPU_CONFIG
            if config.kind != wanted:
                raise ConfigError(
                    f"claim {claim.namespace}/{claim.name}: a {config.kind} cannot configure "
                    f"{device.kind.upper()} "
                    f"device {device.name} (request {result.request}): use {wanted}"
                )
            out[device.name] = config.sharing
        return out

    async def clean_up(self) -> list[str]:
        """Unprepare the checkpointed claims whose ResourceClaim is gone (deleted, or replaced under the same
        name) while nobody told this driver, e.g. while it was down and the kubelet's state was wiped, as
        NVIDIA's checkpoint cleanup does. A claim that cannot be read for another reason is kept. Returns the
        UIDs cleaned up."""
        async with self._serial:
            try:
                await self._lock()
            except LockTimeout as err:
                log.info("checkpoint cleanup skipped: %s", err)
                return []
            try:
                known = list(self.checkpoint.claims.values())
            finally:
                self.lock.release()
        gone = []
        for claim in known:
            try:
                await asyncio.to_thread(self.reader.get, claim.namespace, claim.name, claim.uid)
            except ClaimGone as err:
                gone.append(claim)
                log.info("claim %s (%s) is gone (%s): unpreparing it", claim.name, claim.uid, err)
            except ClaimError:
                continue  # not allocated any more, API errors: the kubelet decides, not us
        if not gone:
            return []
        errors = await self.unprepare([ClaimRef(c.namespace, c.uid, c.name) for c in gone])
        return [uid for uid, error in errors.items() if not error]

    def _unprepare_one(self, ref: ClaimRef) -> str:
        known = self.checkpoint.claims.get(ref.uid)
        if known is None:
            log.debug(
                "unprepare of unknown claim %s/%s (%s): nothing to do", ref.namespace, ref.name, ref.uid
            )
            return ""
        try:
            self.specs.remove(ref.uid)
            self.checkpoint.remove(ref.uid)
        except OSError as err:
            message = (
                f"claim {ref.namespace}/{ref.name}: cannot remove {err.filename or 'a file'}: {err.strerror}"
            )
            log.error("%s", message)
            return message
        log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
        return ""
