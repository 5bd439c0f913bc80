"""MPSSupport: the prepared claims' MPS control daemons kept running, and the ones no claim holds removed.

Every few seconds (and at once when the driver starts, so a restart re-checks what an earlier process
left), as one pass:
1. list this node's `mps-control-daemon-*` Deployments in the namespace;
2. under the node-wide lock (the checkpoint as the last holder left it), each daemon a prepared claim holds
   (its ID in the claim's checkpointed sharing) whose Deployment is missing is re-created from its record
   (someone deleted it; logged);
3. a listed Deployment no prepared claim holds is deleted, still under the lock (a device's daemon shared by
   several claims keeps its ID: a claim joining it would hold the Deployment listed), by UID, or stopped
   as Unprepare stops it (compute mode DEFAULT, its directory removed) when it was started on this node
   (a claim whose Prepare was rolled back); and only while the driver knows every claim it prepared:
   after a lost checkpoint, not before the claims are rebuilt from the API server (`rebuild`), since one
   of them may hold it.
Nothing a claim holds is destroyed; nothing none holds is left.
"""

from __future__ import annotations

import asyncio
import logging

from kubegpu.common.log_throttle import LogThrottle
from kubegpu.dra.api_errors import ApiError
from kubegpu.dra.mps_daemon import MpsDaemons, MpsError, held_daemons
from kubegpu.dra.mps_deployment import NAME_PREFIX, deployment_name
from kubegpu.dra.node_lock import LockTimeout
from kubegpu.dra.prepare import Preparer

log = logging.getLogger(__name__)
PERIOD_S = 5.0
FAILING = LogThrottle(log, interval_s=60.0, burst=1)


async def keep_once(preparer: Preparer, daemons: MpsDaemons) -> None:
    """One pass; ApiError or LockTimeout when it could not be done (nothing is changed then)."""
    listed = await asyncio.to_thread(daemons.listed)
    async with preparer.locked():
        held = held_daemons(c.sharing for c in preparer.checkpoint.claims.values())
        for daemon in sorted(held):
            if deployment_name(daemon) not in listed:
                await asyncio.to_thread(daemons.ensure, daemon)
        if preparer.lost is not None or preparer.orphans:
            return
        # Under the lock: a device's shared daemon keeps its ID, and a claim joining it meanwhile would
        # hold the very Deployment (same UID) listed before.
        names = {deployment_name(d) for d in held}
        for name, uid in sorted(listed.items()):
            if name in names:
                continue
            daemon = name.removeprefix(NAME_PREFIX)
            if daemons.dirs(daemon).root.is_dir():  # started here: stopped as Unprepare stops it
                log.warning("MPS control daemon %s: no prepared claim holds it: stopping it", name)
                await asyncio.to_thread(daemons.stop, daemon)
            else:
                await asyncio.to_thread(daemons.delete_orphan, name, uid)


async def keep_forever(preparer: Preparer, daemons: MpsDaemons, period_s: float = PERIOD_S) -> None:
    while True:
        try:
            await keep_once(preparer, daemons)
        except (ApiError, LockTimeout, MpsError) as err:
            FAILING.log(logging.WARNING, "mps", "the MPS control daemons are not checked now: %s", err)
        await asyncio.sleep(period_s)
