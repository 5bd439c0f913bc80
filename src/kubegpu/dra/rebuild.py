"""The driver's claims settled against the API server: claims prepared before the checkpoint was lost,
rebuilt from what still exists, and checkpointed claims whose ResourceClaim is gone, cleaned up.

When neither copy of the checkpoint can be read (or a spec outlived its entry), the per-claim CDI specs on
disk still say which claims were prepared and which devices each holds: the Preparer keeps those as
orphans, whose devices no other claim gets. This module settles them against the API server, which says
which ResourceClaims are allocated on this node for this driver:

- allocated and reserved: prepared again from its allocation (same devices, same CDI IDs, the spec
  rewritten as it was) and checkpointed as PrepareCompleted, so Unprepare and Prepare work as before;
- not there, or no longer allocated or reserved for a pod: its spec is removed (no pod can use it).

A spec can be lost with the checkpoint (the plugin directory and the CDI root wiped): when the checkpoint
is unreadable or missing, every claim the API server has allocated here and reserved for a pod is prepared
again the same way, spec or not. Until the API server has answered once, the Preparer refuses new claims
(per claim; the kubelet retries) rather than risk a device such a claim holds. The orphans stay until then
(retried with a capped back-off), and an Unprepare of one removes its spec by UID.

`clean_up` unprepares the checkpointed claims whose ResourceClaim is gone while nobody told the driver, as
NVIDIA's checkpoint cleanup does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubegpu.common.backoff import Backoff
from kubegpu.common.log_throttle import LogThrottle
from kubegpu.dra.claim_calls import ClaimRef
from kubegpu.dra.claims import ApiUnavailable, ClaimError, ClaimGone
from kubegpu.dra.gpuconfig import ConfigError
from kubegpu.dra.node_lock import LockTimeout
from kubegpu.dra.prepare import Preparer

log = logging.getLogger(__name__)
WAITING = LogThrottle(log, interval_s=60.0, burst=1)  # an outage retries every few seconds


async def rebuild(preparer: Preparer) -> int:
    """Settle what the lost checkpoint left unknown, once; the number of claims settled. ApiUnavailable when
    the API server cannot be asked (nothing changes then)."""
    if preparer.lost is None and not preparer.orphans:
        return 0
    listed = await asyncio.to_thread(preparer.reader.on_node, preparer.node_name)
    settled = 0
    async with preparer.locked():
        if preparer.shares is not None:  # orphans that share a device: NVIDIA's rule needs their configs
            _learn_orphan_configs(preparer, listed)
        for uid in list(preparer.orphans):
            settled += _settle_orphan(preparer, uid, listed.get(uid))
        if preparer.lost in ("missing", "unreadable"):
            # The checkpoint says nothing, and a claim's spec may be lost with it: every claim the API server
            # has allocated here and reserved for a pod holds its devices, prepared again; not those the
            # kubelet unprepared meanwhile (their reservation may just not be gone yet).
            for uid, obj in listed.items():
                if uid not in preparer.checkpoint.claims and uid not in preparer.released:
                    settled += _prepare_again(preparer, uid, obj, "the API server")
        reason, preparer.lost = preparer.lost, None
        preparer.released.clear()
    if settled:
        preparer.rebuilding(reason or "other")
    await preparer.write_statuses()
    return settled


def _learn_orphan_configs(preparer: Preparer, listed: dict[str, dict[str, Any]]) -> None:
    """Each orphan's configs by device, from its claim as the API server has it: an orphan may then share
    its devices with a claim of the same config (one whose config cannot be read keeps them to itself)."""
    for uid in preparer.orphans:
        obj = listed.get(uid)
        if obj is None:
            continue
        meta = obj.get("metadata") or {}
        try:
            claim = preparer.reader.check(obj, str(meta.get("namespace")), str(meta.get("name")), uid)
            if any(r.share_id is None and not r.admin_access for r in claim.results):
                continue  # it holds a device whole: that one is never shared
            preparer.orphan_sharing[uid] = preparer.sharing_summary(claim)
        except (ClaimError, ConfigError):
            continue


def _settle_orphan(preparer: Preparer, uid: str, obj: dict[str, Any] | None) -> int:
    if obj is None:
        preparer.forget_orphan(uid, "the API server has no claim with this UID allocated on this node")
        return 1
    meta = obj.get("metadata") or {}
    try:
        preparer.reader.check(obj, str(meta.get("namespace")), str(meta.get("name")), uid)
    except ClaimError as err:
        preparer.forget_orphan(uid, str(err))
        return 1
    return int(_prepare_again(preparer, uid, obj, "its CDI spec and the API server"))


def _prepare_again(preparer: Preparer, uid: str, obj: dict[str, Any], source: str) -> bool:
    """Prepare a claim the API server has allocated here as it was; False when it cannot be (logged)."""
    meta = obj.get("metadata") or {}
    try:
        claim = preparer.reader.check(obj, str(meta.get("namespace")), str(meta.get("name")), uid)
    except ClaimError:
        return False  # not reserved for a pod (yet): the kubelet prepares it when it runs one
    try:
        preparer.prepare_allocated(claim)
    except (ClaimError, ConfigError, OSError) as err:
        log.error("cannot rebuild claim %s/%s (%s) from %s: %s", claim.namespace, claim.name, uid, source,
                  err)  # fmt: skip
        return False
    log.info("rebuilt claim %s/%s (%s) from %s", claim.namespace, claim.name, uid, source)
    preparer.settled["rebuilt"] += 1
    return True


async def rebuild_forever(preparer: Preparer) -> None:
    """Whenever the checkpoint is found lost or orphans are found, settle them, retrying while the API
    server does not answer."""
    backoff = Backoff(initial=0.5, maximum=5.0)
    while True:
        await preparer.orphans_found.wait()
        preparer.orphans_found.clear()
        while preparer.lost is not None or preparer.orphans:
            try:
                await rebuild(preparer)
            except (ApiUnavailable, LockTimeout) as err:
                WAITING.log(
                    logging.INFO, "waiting", "claims prepared before the checkpoint was lost are not rebuilt "
                    "yet: %s", err
                )  # fmt: skip
            if preparer.lost is not None or preparer.orphans:  # no answer, or a claim not prepared again
                await asyncio.sleep(backoff.next_delay())
        backoff.reset()


async def clean_up(preparer: Preparer) -> list[str]:
    """Unprepare the checkpointed claims whose ResourceClaim is gone (deleted, or replaced under the same
    name) while nobody told this driver, e.g. while it was down and the kubelet's state was wiped. A claim
    that cannot be read for another reason is kept. Returns the UIDs cleaned up."""
    try:
        async with preparer.locked():
            known = list(preparer.checkpoint.claims.values())
    except LockTimeout as err:
        log.info("checkpoint cleanup skipped: %s", err)
        return []
    gone = []
    for claim in known:
        try:
            await asyncio.to_thread(preparer.reader.get, claim.namespace, claim.name, claim.uid)
        except ClaimGone as err:
            gone.append(claim)
            log.info("claim %s (%s) is gone (%s): unpreparing it", claim.name, claim.uid, err)
        except ClaimError:
            continue  # not allocated any more, API errors: the kubelet decides, not us
    if not gone:
        return []
    errors = await preparer.unprepare([ClaimRef(c.namespace, c.uid, c.name) for c in gone])
    return [uid for uid, error in errors.items() if not error]
