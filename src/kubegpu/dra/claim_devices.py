"""One claim's devices set up and torn down: the part of Prepare and Unprepare that touches the node.

`ClaimDevices` is a part of `dra.prepare.Preparer` (its state is the Preparer's), split off at the seam
between serving the kubelet's calls (the lock, the checkpoint answers, the API reads, the failure counts:
`prepare`) and what is done for one claim, under the lock. Prepare, once the claim is read: its devices
looked up and checked free (`_check_free`, with ConsumableShares' rule), `PrepareStarted` recorded with the
MIG devices created and MPS daemons started (`_stage`), then the CDI spec written and `PrepareCompleted`
recorded (`_complete`). Unprepare (`_unprepare_one`): the time slices reset, the MPS daemons stopped, the
MIG devices destroyed, the spec and the entry removed, except what another claim still holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubegpu.common.quoting import plain_id
from kubegpu.dra.checkpoint import COMPLETED, STARTED, Checkpoint, PreparedClaim, PreparedDevice
from kubegpu.dra.claim_calls import ClaimRef, Failure
from kubegpu.dra.claim_cdi import ClaimSpecs, cdi_id
from kubegpu.dra.claims import RETRY, AllocatedClaim, ClaimError, Result
from kubegpu.dra.consumable_shares import MPS_WITH_SHARES, conflict
from kubegpu.dra.consumed import Consumed, consumed_by, mps_client_limits, per_device, status_entry
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.dynamic_mig import DynamicMig
from kubegpu.dra.gpuconfig import MPS, ConfigError, Sharing, sharing_of
from kubegpu.dra.mps_daemon import SUMMARY_KEY, MpsDaemons, config_of, daemon_specs, held_daemons
from kubegpu.dra.mps_deployment import DaemonSpec, deployment_name
from kubegpu.dra.sharing_gates import check_strategy
from kubegpu.dra.timeslicing import TimeSliceError, TimeSlicer, time_sliced_uuids
from kubegpu.node.inventory import Inventory
from kubegpu.settings.feature_gates import FeatureGates

log = logging.getLogger(__name__)


class DeviceBusy(ClaimError):
    kind = "busy"


@dataclass(frozen=True, slots=True)
class Outcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    kind: str = ""  # the class of failure (a Failure kind) when `error` is set


@dataclass(frozen=True, slots=True)
class _Staged:
    """A claim half-way through Prepare: recorded PrepareStarted, its MIG devices and MPS daemons started;
    left: (the daemons' readiness,) the CDI spec and PrepareCompleted."""

    claim: AllocatedClaim
    what: str
    inventory: Inventory
    devices: list[DraDevice]
    prepared: tuple[PreparedDevice, ...]
    summary: dict[str, Any]
    daemons: tuple[DaemonSpec, ...] = ()
    consumed: list[tuple[Result, Consumed]] = field(default_factory=list)


class ClaimDevices:
    """The Preparer's state these steps use (set by `Preparer.__init__`)."""

    driver_name: str
    node_name: str
    checkpoint: Checkpoint
    specs: ClaimSpecs
    devices: Callable[[], tuple[Inventory, dict[str, DraDevice]]]
    gates: FeatureGates
    timeslicer: TimeSlicer | None
    shares: str | int | None
    orphans: dict[str, tuple[str, ...]]
    orphan_sharing: dict[str, dict[str, Any]]
    lost: str | None
    released: set[str]
    partitions: DynamicMig | None
    mps: MpsDaemons | None
    _statuses: dict[str, tuple[AllocatedClaim, list[dict[str, Any]]]]

    @staticmethod
    def _wait_ready(mps: MpsDaemons, staged: _Staged) -> None:
        try:
            for daemon in staged.daemons:
                mps.wait_ready(daemon.id)
        except ClaimError as err:  # the Deployment stays: the kubelet's retry finds it further along
            raise type(err)(f"{staged.what}: {err}") from None

    def _stage(self, claim: AllocatedClaim) -> _Staged:
        what = f"claim {plain_id(claim.namespace)}/{plain_id(claim.name)}"
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
            picked.append(device)
        sharing = sharing_of(claim, picked, self.driver_name)
        for chosen in sharing.values():
            if chosen is not None:
                if self.shares is not None and chosen.strategy == MPS and self.mps is None:
                    raise ConfigError(MPS_WITH_SHARES)  # NVIDIA's; with MPSSupport, a daemon per device
                check_strategy(chosen, self.gates)  # NVIDIA's gates: MPS and time-slicing need theirs
        for result in claim.results:
            if not result.admin_access:
                config = _summary(sharing.get(result.device))
                self._check_free(what, claim.uid, result.device, config, result.share_id)
        if self.timeslicer is not None:  # before anything is recorded: a failure leaves nothing behind
            self.timeslicer.apply(claim.uid, [r.request for r in claim.results], picked, sharing)
        prepared = tuple(
            PreparedDevice(
                (result.request_name,),
                result.pool,
                result.device,
                (cdi_id(self.driver_name, claim.uid, result.device),),
                result.admin_access,
                result.share_id,
            )
            for result in claim.results
        )
        summary = {name: s.summary() for name, s in sharing.items() if s is not None}
        unique = list({d.name: d for d in picked}.values())
        shared = [r.device for r in claim.results if r.share_id is not None and self.shares is not None]
        daemons = daemon_specs(claim.uid, unique, sharing, shared) if self.mps is not None else ()
        for daemon in daemons:  # recorded with the claim: Unprepare and a restarted driver find them
            for name in daemon.devices:
                summary[name] = {**summary[name], SUMMARY_KEY: daemon.id}
        started = PreparedClaim(claim.uid, claim.namespace, claim.name, STARTED, prepared, summary)
        if self.partitions is not None:  # DynamicMIG: its MIG devices created (a crash leaves them unheld)
            unique = self.partitions.prepare(what, unique)
        consumed = consumed_by(claim.results, {d.name: d for d in unique}, self.shares)
        self.checkpoint.put(started)
        if self.mps is not None:
            for daemon in daemons:
                self.mps.start(daemon)
        return _Staged(claim, what, inventory, unique, prepared, summary, tuple(daemons), consumed)

    def _complete(self, staged: _Staged) -> Outcome:
        claim, what, prepared, summary = staged.claim, staged.what, staged.prepared, staged.summary
        consumed = staged.consumed
        edits: dict[str, dict[str, list[Any]]] = {
            name: {"env": list(c.env())} for name, c in per_device(consumed).items()
        }
        if self.mps is not None:
            shares = per_device(consumed)
            for daemon in staged.daemons:
                for name, uuid in zip(daemon.devices, daemon.uuids, strict=True):
                    share = shares.get(name)  # beyond NVIDIA: a sharer is kept to what it consumed
                    limits = mps_client_limits(share, uuid) if share is not None else {}
                    client = [f"{key}={v}" for key, v in limits.items()]
                    for key, more in self.mps.cdi_edits(daemon.id, client).items():
                        edits.setdefault(name, {}).setdefault(key, []).extend(more)
        self.specs.write(claim.uid, staged.devices, staged.inventory, edits)
        self.checkpoint.put(
            PreparedClaim(claim.uid, claim.namespace, claim.name, COMPLETED, prepared, summary)
        )
        self.orphans.pop(claim.uid, None)
        self.orphan_sharing.pop(claim.uid, None)
        if consumed:
            entries = [status_entry(self.driver_name, r.pool, r.device, c) for r, c in consumed]
            self._statuses[claim.uid] = (claim, entries)
        log.info(
            "prepared %s (%s): %s",
            what,
            claim.uid,
            ", ".join(f"{d.device} for {d.request_names[0]}" for d in prepared),
        )
        for name, config in summary.items():
            log.info("%s: device %s shared by %s", what, name, config)
        return Outcome(prepared)

    def sharing_summary(self, claim: AllocatedClaim) -> dict[str, Any]:
        """The claim's configs by device, as its checkpoint entry records them; ConfigError."""
        _, table = self.devices()
        picked = [table[r.device] for r in claim.results if r.device in table]
        if len(picked) != len(claim.results):
            raise ConfigError(f"claim {claim.namespace}/{claim.name}: a device is not published here")
        summaries = {n: _summary(s) for n, s in sharing_of(claim, picked, self.driver_name).items()}
        return {name: summary for name, summary in summaries.items() if summary is not None}

    def _check_free(
        self, what: str, uid: str, device: str, config: dict[str, Any] | None, share_id: str | None
    ) -> None:
        """DeviceBusy when another claim holds `device`: prepared for it (checkpoint), or named by its
        CDI spec while the checkpoint that recorded it is lost (an orphan). With ConsumableShares, NVIDIA's
        rule: another claim may hold it when its config for the device (`config`: a checkpoint summary, None
        without one) is the same; an orphan only once its config is known. Beyond NVIDIA, only shares share:
        a device allocated whole (no shareID, e.g. before the mode was turned on) is never shared."""
        for other in self.checkpoint.holders(device, uid):
            if self.shares is not None and share_id is not None and _shared(other, device):
                if config_of(other.sharing.get(device)) == config:
                    continue
                raise DeviceBusy(conflict(uid, device, other.uid))
            raise DeviceBusy(
                f"{what}: device {device} is already prepared for claim {other.namespace}/{other.name} "
                f"({other.uid})"
            )
        for other_uid, held in self.orphans.items():
            if other_uid != uid and device in held:
                known = self.orphan_sharing.get(other_uid)
                if self.shares is not None and share_id is not None and known is not None:
                    if config_of(known.get(device)) == config:
                        continue
                    raise DeviceBusy(conflict(uid, device, other_uid))
                raise DeviceBusy(
                    f"{what}: device {device} may be in use by claim {other_uid}: its CDI spec is on disk "
                    f"but the checkpoint entry is lost and the API server has not yet confirmed the claim; "
                    f"{RETRY}"
                )

    # ---- Unprepare ---------------------------------------------------------------------------------------

    def _unprepare_one(self, ref: ClaimRef) -> Failure | None:
        known = self.checkpoint.claims.get(ref.uid)
        if known is not None and (known.namespace, known.name) != (ref.namespace, ref.name):
            return not_this_claim(ref, known, "nothing was unprepared")
        orphan = ref.uid in self.orphans
        if self.lost is not None:
            self.released.add(ref.uid)
        if known is None and not orphan:
            log.debug("unprepare of unknown %s (%s): nothing to do", ref.describe(), ref.uid)
            return None
        # Its devices: from its entry, or as its CDI spec names them (an orphan: the entry lost).
        held = [d.device for d in known.devices] if known is not None else list(self.orphans[ref.uid])
        # With shares, what another claim still uses keeps its time slice and partition (NVIDIA's rule).
        shared = self._used_by_others(ref.uid) if self.shares is not None else set()
        try:
            if self.timeslicer is not None and known is not None:
                sliced = {name: s for name, s in known.sharing.items() if name not in shared}
                self.timeslicer.reset(ref.uid, time_sliced_uuids(sliced, self.devices()[1]))
            if self.mps is not None:  # its daemons: from the checkpoint, or their directories (an orphan)
                daemons = held_daemons([known.sharing]) if known else set()
                kept = self._daemons_of_others(ref.uid, known)
                for daemon in sorted((daemons | self.mps.of_claim(ref.uid)) - kept):
                    self.mps.stop(daemon)
                for daemon in sorted(daemons & kept):
                    log.info("%s: MPS control daemon %s is still used by another claim: kept", ref.describe(),
                             deployment_name(daemon))  # fmt: skip
            if self.partitions is not None:  # DynamicMIG: its MIG devices go first, then the record of them
                self.partitions.destroy([d for d in held if d not in shared], self.devices()[0])
            self.specs.remove(ref.uid)
            self.checkpoint.remove(ref.uid)
        except TimeSliceError as err:
            return Failure(err.kind, str(err))
        except ClaimError as err:
            return Failure(err.kind, f"{ref.describe()}: error unpreparing devices: {err}")
        except OSError as err:
            message = f"{ref.describe()}: cannot remove {err.filename or 'a file'}: {err.strerror}"
            log.error("%s", message)
            return Failure("io", message)
        self.orphans.pop(ref.uid, None)
        self.orphan_sharing.pop(ref.uid, None)
        for device in sorted(shared.intersection(held)):
            log.info("%s: device %s is still used by another claim: kept", ref.describe(), device)
        log.info(
            "unprepared %s (%s)%s",
            ref.describe(),
            ref.uid,
            " (known from its CDI spec only)" if orphan else "",
        )
        return None

    def _daemons_of_others(self, uid: str, known: PreparedClaim | None) -> set[str]:
        """The MPS daemons a claim other than `uid` holds (a device's daemon several claims share, counted
        from the checkpoint, so the count survives a restart): recorded with it, or serving a device an
        orphan's spec names (its config is not known yet: kept rather than pulled from under it)."""
        others = held_daemons(c.sharing for c in self.checkpoint.claims.values() if c.uid != uid)
        orphaned = {d for other, devices in self.orphans.items() if other != uid for d in devices}
        mine = known.sharing.items() if known is not None else ()
        others.update(s[SUMMARY_KEY] for name, s in mine if name in orphaned and SUMMARY_KEY in s)
        return others

    def _used_by_others(self, uid: str) -> set[str]:
        """The devices a claim other than `uid` holds: prepared (checkpoint) or named by an orphan's spec."""
        held = {d.device for c in self.checkpoint.claims.values() if c.uid != uid for d in c.devices}
        held.update(d for other, devices in self.orphans.items() if other != uid for d in devices)
        return held


def not_this_claim(ref: ClaimRef, known: PreparedClaim, outcome: str) -> Failure:
    return Failure(
        "mismatch",
        f"{ref.describe()}: UID {plain_id(ref.uid)} belongs to claim {known.namespace}/{known.name} on this "
        f"node, not to this one; {outcome}",
    )


def _shared(claim: PreparedClaim, device: str) -> bool:
    """Whether the claim holds `device` as a share (not whole)."""
    return all(d.share_id is not None for d in claim.devices if d.device == device and not d.admin_access)


def _summary(sharing: Sharing | None) -> dict[str, Any] | None:
    return None if sharing is None else sharing.summary()
