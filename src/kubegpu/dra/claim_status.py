"""The claim's `status.devices[]` (AllocatedDeviceStatus) written for its shared allocations, so an operator
sees on the claim what each one consumed of the device it shares (`dra.consumed.status_entry`).

The claim as Prepare read it (else as read now) is changed and written back through `resourceclaims/status`
(PUT with its resourceVersion): this driver's entries for the same device and share are replaced, every
other entry (other drivers', other devices') is kept; a conflict (someone wrote in between) reads it again.
Blocking: run it in a thread.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from kubegpu.dra.api_errors import ApiStatusError
from kubegpu.dra.claims import AllocatedClaim
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.slices import GROUP

log = logging.getLogger(__name__)

ATTEMPTS = 3  # reads after a 409 Conflict before giving up (logged)


def _key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def merged(current: Sequence[Mapping[str, Any]], entries: Sequence[Mapping[str, Any]]) -> list[Any]:
    """`current` with `entries` in place of those for the same driver, pool, device and share."""
    new = {_key(e) for e in entries}
    return [dict(e) for e in current if _key(e) not in new] + [dict(e) for e in entries]


class ClaimStatusWriter:
    def __init__(self, api: KubeClient, version: Callable[[], str], timeout: float) -> None:
        """`version`: the resource.k8s.io version the claim reader found served."""
        self.api = api
        self.version = version
        self.timeout = timeout

    def __call__(self, claim: AllocatedClaim, entries: list[dict[str, Any]]) -> None:
        """Write `entries` into the claim's status.devices; ApiError when the API server refuses."""
        path = (
            f"/apis/{GROUP}/{self.version()}/namespaces/{quote(claim.namespace, safe='')}/resourceclaims/"
            f"{quote(claim.name, safe='')}"
        )
        timeout = (min(5.0, self.timeout), self.timeout)
        read = copy.deepcopy(claim.obj) if claim.obj is not None else None  # as Prepare read it
        for _ in range(ATTEMPTS):
            obj = read if read is not None else self.api.request("GET", path, timeout=timeout)
            read = None
            if not isinstance(obj, dict) or (obj.get("metadata") or {}).get("uid") != claim.uid:
                return  # gone, or replaced by a new claim of the same name: nothing of ours to show
            status = obj.setdefault("status", {})
            wanted = merged(status.get("devices") or [], entries)
            if status.get("devices") == wanted:
                return
            status["devices"] = wanted
            try:
                self.api.request("PUT", f"{path}/status", body=obj, timeout=timeout)
            except ApiStatusError as err:
                if err.status == 409:
                    continue
                raise
            log.debug("claim %s/%s: status.devices written", claim.namespace, claim.name)
            return
        log.warning(
            "claim %s/%s: status.devices not written: it kept changing (%d conflicts)",
            claim.namespace,
            claim.name,
            ATTEMPTS,
        )
