"""Prepare and Unprepare as the Preparer does them, each claim's result and its call's duration reported to
the driver's events (metrics when served), and the number of prepared claims after every call."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kubegpu.dra.checkpoint import COMPLETED
from kubegpu.dra.events import DriverEvents
from kubegpu.dra.prepare import ClaimRef, Outcome, Preparer


class MeteredPreparer(Preparer):
    def __init__(self, events: DriverEvents, **preparer: Any) -> None:
        super().__init__(**preparer)
        self.events = events
        self.count_prepared()

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
        return errors

    def count_prepared(self) -> None:
        self.events.prepared_claims(sum(c.state == COMPLETED for c in self.checkpoint.claims.values()))
