"""NodePrepareResources / NodeUnprepareResources as the kubelet expects them, free of gRPC.

- Every claim of a call is answered; a claim that fails carries its own error (what failed, and that the
  kubelet retries), the others go on. Nothing a claim, the API server or a disk that refuses a write does
  fails the whole call.
- Prepare is idempotent: a claim already prepared (this process or an earlier one: the checkpoint) gets the
  same devices and CDI IDs back without being prepared again, and without asking the API server, so
  prepared claims are served through an API server outage. A claim whose last Prepare was cut short is
  rolled back first.
- Unprepare works from the checkpoint alone (the claim may already be deleted); it succeeds for a claim the
  driver does not know, and refuses a known UID sent with another namespace or name.
- Calls are serialized step by step: in the process, and across processes by a file lock in the plugin
  directory (`node_lock`), so an old and a new driver pod never prepare at the same time during a rolling
  update. The lock is held to look at and change the checkpoint, never while the API server is asked: the
  claims of a call are read concurrently, within a time budget, with the lock free, so a call with many
  slow or unknown claims does not hold up another call.
- The driver is the last line of defence: a device prepared for another claim is refused unless one of the
  two has admin access, and so is a device named by a CDI spec on disk that no checkpoint entry accounts
  for (an orphan: the checkpoint was lost) until the claim is matched with the API server (`rebuild`).
  With ConsumableShares (`shares`), NVIDIA's rule instead: claims may share a device when their configs
  for it are the same, MPS is refused (beyond NVIDIA, with MPSSupport on: one MPS daemon per device,
  shared by its sharers), and Unprepare leaves a device's time slice, partition and MPS daemon to the
  claims that still use it. What a shared allocation consumed goes to the workload's env and the claim's
  status (`dra.consumed`).

What is done to the node for one claim (at Prepare, once it is read: its devices checked and set up, its CDI
spec and checkpoint entry written; at Unprepare: all of it undone) is `dra.claim_devices`' `ClaimDevices`, a
part of the Preparer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubegpu.common.quoting import plain_id
from kubegpu.dra.checkpoint import COMPLETED, Checkpoint
from kubegpu.dra.claim_calls import ClaimRef, Failure, FailureCounts, screen
from kubegpu.dra.claim_cdi import ClaimSpecs
from kubegpu.dra.claim_devices import ClaimDevices, Outcome, not_this_claim
from kubegpu.dra.claims import RETRY, AllocatedClaim, ClaimError, ClaimReader
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.dynamic_mig import DynamicMig
from kubegpu.dra.gpuconfig import ConfigError
from kubegpu.dra.mps_daemon import MpsDaemons
from kubegpu.dra.node_lock import LockTimeout, NodeLock
from kubegpu.dra.timeslicing import TimeSlicer
from kubegpu.node.inventory import Inventory
from kubegpu.settings.feature_gates import DEFAULT_GATES, FeatureGates

log = logging.getLogger(__name__)

READ_THREADS = 8  # API reads in flight, all calls together (within the client's pool of 5 per CPU)
READS_PER_CALL = 2  # so that one call with many claims leaves threads for the others

StatusWriter = Callable[[AllocatedClaim, list[dict[str, Any]]], None]


def _failed(failure: Failure) -> Outcome:
    return Outcome(error=failure.message, kind=failure.kind)


def _named(claim: AllocatedClaim) -> str:
    """`claim <namespace>/<name> (<uid>)`, for a log line."""
    return f"claim {plain_id(claim.namespace)}/{plain_id(claim.name)} ({plain_id(claim.uid)})"


class Preparer(ClaimDevices):
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
        gates: FeatureGates = DEFAULT_GATES,
        timeslicer: TimeSlicer | None = None,
        shares: str | int | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.checkpoint = checkpoint
        self.specs = specs
        self.reader = reader
        self.lock = lock
        self.devices = devices
        self.gates = gates
        self.timeslicer = timeslicer  # TimeSlicingSettings on: time slices set and reset with nvidia-smi
        self.shares = shares  # ConsumableShares' mode (consumable_shares.shares_mode), None when off
        # Shared allocations' status.devices entries to write once the lock is free (`write_statuses`).
        self.status_writer: StatusWriter | None = None
        self._statuses: dict[str, tuple[AllocatedClaim, list[dict[str, Any]]]] = {}
        self.failures = FailureCounts()
        # Specs on disk that no checkpoint entry names, by claim UID, with the devices each names: claims
        # prepared before the checkpoint was lost. Their devices stay held until `rebuild` settles them.
        self.orphans: dict[str, tuple[str, ...]] = {}
        # With shares: an orphan's configs by device (checkpoint summaries), once the API server told them
        # (`rebuild`); an orphan whose configs are known shares its devices by NVIDIA's rule.
        self.orphan_sharing: dict[str, dict[str, Any]] = {}
        self.orphans_found = asyncio.Event()  # set when there is something to rebuild (`rebuild_forever`)
        # Why the claims prepared here must be rebuilt from the API server (`events.REBUILD_REASONS`), until
        # it answered once: the checkpoint is unreadable or missing (a spec may be lost with it, so only the
        # API server knows every claim allocated here), or specs on disk are not in it. Meanwhile new claims
        # are refused, not risked on a device a claim nobody knows of may hold.
        self.lost: str | None = None
        # Asked once before such a refusal: the rebuild itself (rebuild.py; wired by the daemon).
        self.confirm: Callable[[], Awaitable[int]] | None = None
        # Claims the kubelet unprepared while `lost`: the API server may still list them as reserved (the
        # reservation goes when the pod is gone), and they must not be prepared again from it.
        self.released: set[str] = set()
        self._scanned = False
        self.settled: Counter[str] = Counter()  # orphans "rebuilt" or "removed" (`rebuild`), for metrics
        self._serial = asyncio.Lock()
        self.partitions: DynamicMig | None = None  # DynamicMIG's partitions, when the gate is on
        self.mps: MpsDaemons | None = None  # MPSSupport's control daemons, when the gate is on
        self._reads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="claim-read")

    def close(self) -> None:
        """Drop the reads not started yet (a read in flight ends within the reader's timeout)."""
        self._reads.shutdown(wait=False, cancel_futures=True)

    # ---- the node-wide lock, one step at a time -----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """The node-wide lock, with the checkpoint as the last holder left it: another driver process (a
        rolling update) may have prepared or unprepared claims since this one last looked. LockTimeout when
        another process holds it too long."""
        async with self._serial:
            if not self.lock.try_acquire():
                await asyncio.to_thread(self.lock.acquire)
            try:
                if self.checkpoint.refresh() or not self._scanned:
                    self._find_orphans()
                yield
            finally:
                self.lock.release()

    def _find_orphans(self) -> None:
        self._scanned = True
        self.orphans = self.specs.on_disk(known=self.checkpoint.claims)
        how = self._lost_how()
        if how is not None and self.lost is None:
            self.lost = how
            self.orphans_found.set()
        if self.orphans:
            log.warning(
                "%d CDI spec(s) on disk belong to claims the checkpoint does not name (%s): their devices "
                "stay held until the API server confirms the claims",
                len(self.orphans),
                ", ".join(
                    f"{uid}: {', '.join(d) or 'no readable devices'}"
                    for uid, d in sorted(self.orphans.items())
                ),
            )
            self.orphans_found.set()

    def _lost_how(self) -> str | None:
        """Why claims must be rebuilt (`events.REBUILD_REASONS`), or None."""
        if self.checkpoint.lost:
            return "unreadable"
        if not (self.checkpoint.path.exists() or self.checkpoint.copy_path.exists()):
            return "missing"
        return "other" if self.orphans else None

    def rebuilding(self, reason: str) -> None:
        """Claims prepared before the checkpoint was lost were rebuilt (counted by `MeteredPreparer`)."""

    async def recover(self) -> None:
        """At start-up, before serving: find the orphans (the checkpoint was loaded by the caller). When
        another driver process holds the lock too long, the first call finds them instead."""
        try:
            async with self.locked():
                pass
        except LockTimeout as err:
            log.warning("the claims on disk are looked at on the first call: %s", err)

    # ---- Prepare -----------------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        refused = screen(claims)
        out = {uid: _failed(f) for uid, f in refused.items()}
        todo = [c for c in claims if c.uid not in refused]
        try:
            if todo:
                await self._prepare_all(todo, out)
        except LockTimeout as err:
            for ref in todo:
                out.setdefault(ref.uid, Outcome(error=str(err), kind=err.kind))
        self.failures.report(
            "NodePrepareResources",
            len(claims),
            {uid: Failure(o.kind, o.error) for uid, o in out.items() if o.error},
        )
        return out

    async def _prepare_all(self, todo: list[ClaimRef], out: dict[str, Outcome]) -> None:
        async with self.locked():
            unread = [ref for ref in todo if not self._answered_from_checkpoint(ref, out)]
        if not unread:
            return
        if self.lost is not None and not await self._confirmed(unread, out):
            return
        read = await self._read_all(unread)
        async with self.locked():
            for ref in unread:  # another call may have prepared it meanwhile: look again
                if not self._answered_from_checkpoint(ref, out):
                    out[ref.uid] = await self._prepare_read(ref, read[ref.uid])
        await self.write_statuses()

    async def write_statuses(self) -> None:
        """Write the status.devices entries of the shared allocations prepared since the last time, with the
        lock free and within the reader's timeout; a failure is logged, never the claim's: the status only
        shows what the driver did."""
        pending, self._statuses = self._statuses, {}
        if self.status_writer is None or not pending:
            return
        loop = asyncio.get_running_loop()
        writer = self.status_writer
        tasks = {loop.run_in_executor(self._reads, writer, c, e): c for c, e in pending.values()}
        _, late = await asyncio.wait(tasks, timeout=self.reader.timeout)
        for task, claim in tasks.items():
            if task in late:
                task.cancel()
            elif task.exception() is not None:
                log.warning("cannot write the status.devices of %s: %s", _named(claim), task.exception())
        if late:
            log.warning(
                "%d claim status write(s) did not finish within %g s: %s",
                len(late),
                self.reader.timeout,
                ", ".join(_named(claim) for task, claim in tasks.items() if task in late),
            )

    async def _confirmed(self, refs: list[ClaimRef], out: dict[str, Outcome]) -> bool:
        """After a lost checkpoint, rebuild first; False (each claim refused, the kubelet retries) while the
        API server cannot say which claims this node holds."""
        why = "the API server has not been asked yet"
        if self.confirm is not None:
            try:
                await asyncio.wait_for(self.confirm(), self.reader.timeout)
            except (ClaimError, LockTimeout, TimeoutError) as err:
                why = str(err).removesuffix(f"; {RETRY}") or (
                    f"the API server did not answer within {self.reader.timeout:g} s"
                )
        if self.lost is None:
            return True
        for ref in refs:
            out[ref.uid] = Outcome(
                error=f"{ref.describe()}: not prepared yet: the driver's checkpoint was lost and the claims "
                f"prepared on this node are not yet rebuilt from the API server ({why}); {RETRY}",
                kind="rebuilding",
            )
        return False

    def _answered_from_checkpoint(self, ref: ClaimRef, out: dict[str, Outcome]) -> bool:
        known = self.checkpoint.claims.get(ref.uid)
        if known is None:
            return False
        if (known.namespace, known.name) != (ref.namespace, ref.name):
            out[ref.uid] = _failed(not_this_claim(ref, known, "nothing was prepared"))
            return True
        if known.state == COMPLETED:
            log.debug("%s (%s) is already prepared", ref.describe(), ref.uid)
            out[ref.uid] = Outcome(known.devices)
            return True
        # Cut short earlier (PrepareStarted): undo what it may have done, then start over.
        log.info("%s (%s): rolling back an unfinished Prepare", ref.describe(), ref.uid)
        failed = self._roll_back(ref)
        if failed is None:
            return False
        out[ref.uid] = Outcome(error=f"{failed}; {RETRY}", kind="io")
        return True

    def _roll_back(self, ref: ClaimRef) -> str | None:
        """Remove what an unfinished Prepare of the claim left (its spec, its checkpoint entry); what failed
        (logged), or None. A disk that refuses may leave the entry PrepareStarted on disk: the next Prepare
        of the claim starts over, and a new driver process rolls the entry back first."""
        try:
            self.specs.remove(ref.uid)
            self.checkpoint.remove(ref.uid)
        except OSError as err:
            failed = (
                f"{ref.describe()}: cannot roll back an unfinished Prepare: {err.filename or 'a file'}: "
                f"{err.strerror}"
            )
            log.error("%s", failed)
            return failed
        return None

    async def _read_all(self, refs: list[ClaimRef]) -> dict[str, AllocatedClaim | Failure]:
        """Each claim from the API server, a few at a time, all within the reader's timeout: a claim not
        read by then is answered with that, whatever the API server does."""
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(READS_PER_CALL)

        async def read(ref: ClaimRef) -> AllocatedClaim:
            async with gate:
                return await loop.run_in_executor(
                    self._reads, self.reader.get, ref.namespace, ref.name, ref.uid
                )

        tasks = {ref.uid: asyncio.ensure_future(read(ref)) for ref in refs}
        _, pending = await asyncio.wait(tasks.values(), timeout=self.reader.timeout)
        for task in pending:
            task.cancel()
        out: dict[str, AllocatedClaim | Failure] = {}
        for ref in refs:
            task = tasks[ref.uid]
            if task in pending:
                out[ref.uid] = Failure(
                    "api",
                    f"cannot read {ref.describe()}: the API server did not answer within "
                    f"{self.reader.timeout:g} s; {RETRY}",
                )
            elif isinstance(task.exception(), ClaimError):
                err = task.exception()
                assert isinstance(err, ClaimError)
                out[ref.uid] = Failure(err.kind, str(err))
            else:
                out[ref.uid] = task.result()  # anything else is a bug: it fails the call with its traceback
        return out

    async def _prepare_read(self, ref: ClaimRef, read: AllocatedClaim | Failure) -> Outcome:
        if isinstance(read, Failure):
            return _failed(read)
        try:
            staged = self._stage(read)
            if staged.daemons and self.mps is not None:  # NVIDIA's readiness wait, the loop left free
                await asyncio.to_thread(self._wait_ready, self.mps, staged)
            return self._complete(staged)
        except (ClaimError, ConfigError) as err:
            return Outcome(error=str(err), kind=getattr(err, "kind", "config"))
        except OSError as err:  # the CDI root or the checkpoint cannot be written
            message = f"{ref.describe()}: cannot write {err.filename or 'a file'}: {err.strerror}"
            log.error("%s", message)
            self._roll_back(ref)  # a disk that refused the write may refuse this too: logged, not raised
            return Outcome(error=message, kind="io")

    def prepare_allocated(self, claim: AllocatedClaim) -> Outcome:
        """Prepare a claim read from the API server; under `locked()`. ClaimError, ConfigError or OSError
        when it cannot be. Its MPS daemons are started (kept when there) without waiting for them: this
        re-prepares claims whose pods already run (`rebuild`)."""
        return self._complete(self._stage(claim))

    # ---- Unprepare ---------------------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        refused = screen(claims)
        failures = dict(refused)
        todo = [c for c in claims if c.uid not in refused]
        try:
            if todo:
                async with self.locked():
                    for ref in todo:
                        failure = self._unprepare_one(ref)
                        if failure is not None:
                            failures[ref.uid] = failure
        except LockTimeout as err:
            for ref in todo:
                failures.setdefault(ref.uid, Failure(err.kind, str(err)))
        self.failures.report("NodeUnprepareResources", len(claims), failures)
        return {c.uid: failures[c.uid].message if c.uid in failures else "" for c in claims}

    def forget_orphan(self, uid: str, why: str) -> None:
        """Remove an orphan's spec: the API server says its claim is not (any more) prepared here."""
        self.specs.remove(uid)
        self.orphans.pop(uid, None)
        self.orphan_sharing.pop(uid, None)
        self.settled["removed"] += 1
        log.info("removed the CDI spec of claim %s, prepared before the checkpoint was lost: %s", uid, why)
