"""Prepare and Unprepare as the Preparer does them, each claim's result and its call's duration reported to
the driver's events (metrics when served), the number of prepared claims after every call, the claims
refused (from the Preparer's failure counts) and the rebuilds of lost checkpoints."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.dra.checkpoint import COMPLETED
from kubegpu.dra.claims import AllocatedClaim
from kubegpu.dra.events import DriverEvents
from kubegpu.dra.prepare import ClaimRef, Outcome, Preparer

# The Preparer's failure kinds that are refusals (claim_calls, prepare, service), by the metrics' reason.
REFUSALS = {
    "duplicate": "duplicate_uid",
    "busy": "device_in_use",
    "too-many": "too_many_claims",
    "undecodable": "undecodable",
    "no-uid": "other",
    "mismatch": "other",
}


class MeteredPreparer(Preparer):
    def __init__(self, events: DriverEvents, **preparer: Any) -> None:
        super().__init__(**preparer)
        self.events = events
        self.failures.on_counted = self._count_refusals
        self.on_unprepared: Callable[[], None] = lambda: None  # the daemon re-publishes (lost devices)
        self.count_prepared()

    def _count_refusals(self, kinds: Mapping[str, int]) -> None:
        for kind, count in kinds.items():
            reason = REFUSALS.get(kind)
            for _ in range(count if reason is not None else 0):
                self.events.claim_refused(reason or "other")

    def rebuilding(self, reason: str) -> None:
        super().rebuilding(reason)
        self.events.checkpoint_rebuilt(reason)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        started = time.monotonic()
        outcomes = await super().prepare(claims)
        took = time.monotonic() - started
        for outcome in outcomes.values():
            self.events.prepared("error" if outcome.error else "success", took)
        self.count_prepared()
        return outcomes

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        started = time.monotonic()
        errors = await super().unprepare(claims)
        took = time.monotonic() - started
        for error in errors.values():
            self.events.unprepared("error" if error else "success", took)
        self.count_prepared()
        self.on_unprepared()
        return errors

    def prepare_allocated(self, claim: AllocatedClaim) -> Outcome:
        outcome = super().prepare_allocated(claim)  # a claim rebuilt from the API server
        self.count_prepared()
        return outcome

    def count_prepared(self) -> None:
        self.events.prepared_claims(sum(c.state == COMPLETED for c in self.checkpoint.claims.values()))
