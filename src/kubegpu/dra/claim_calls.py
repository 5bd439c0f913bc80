"""What every NodePrepareResources / NodeUnprepareResources call goes through before and after its claims
are handled, free of gRPC.

Whoever reaches the DRA socket decides what a call holds, so a call is screened first. A call naming more
claims than a kubelet ever sends (one pod's claims for this driver) is no kubelet's: it is refused whole,
INVALID_ARGUMENT, before a claim of it is looked at (answering thousands of claims one by one costs the
event loop what a good call is waiting for). Then a claim without a UID and a UID named twice in one call
(the answer is a map keyed by UID: two claims would share one answer) are refused each with its own error,
before anything is read or written.

Failures are per claim, and a bad call can make thousands: each is counted by kind (`FailureCounts.counts`,
for a metrics endpoint to read) and a call's failures are logged as one summary line, at a bounded rate.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubegpu.common.log_throttle import LogThrottle
from kubegpu.common.quoting import plain_id

log = logging.getLogger(__name__)

# A kubelet sends one pod's claims for this driver per call; Kubernetes caps a pod's claims far below this.
MAX_CLAIMS_PER_CALL = 128


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def describe(self) -> str:
        """`claim <namespace>/<name>` as the kubelet sent it, safe to log (client text)."""
        return f"claim {plain_id(self.namespace)}/{plain_id(self.name)}"


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # a short class of failure: "api", "gone", "busy", "duplicate"... (a metric label)
    message: str  # the claim's error, as the kubelet gets it


def too_many(count: int) -> str | None:
    """Why a call naming `count` claims is refused whole, or None."""
    if count <= MAX_CLAIMS_PER_CALL:
        return None
    return (
        f"the call names {count} claims, more than the {MAX_CLAIMS_PER_CALL} one call may hold (a kubelet "
        "sends one pod's claims for a driver per call); no claim of it was handled"
    )


def screen(claims: Sequence[ClaimRef]) -> dict[str, Failure]:
    """The claims of a call (within the limit) refused before any work, by UID (a UID that appears twice
    gets one refusal)."""
    refused: dict[str, Failure] = {}
    seen: dict[str, list[ClaimRef]] = {}
    for claim in claims:
        seen.setdefault(claim.uid, []).append(claim)
    for uid, named in seen.items():
        if not uid:
            refused[uid] = Failure(
                "no-uid", f"{named[0].describe()} has no UID; send the claim's metadata.uid"
            )
        elif len(named) > 1:
            refused[uid] = Failure(
                "duplicate",
                f"claim UID {plain_id(uid)} appears {len(named)} times in one call "
                f"({', '.join(c.describe() for c in named[:3])}); send each claim once",
            )
    return refused


class FailureCounts:
    """Per-claim failures counted by kind since the start, and one log line per call that had any.
    `on_counted` (the driver's metrics) sees each batch of counts as it is added."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.counts: Counter[str] = Counter()
        self.on_counted: Callable[[Mapping[str, int]], None] = lambda kinds: None
        self._throttle = LogThrottle(logger, interval_s=60.0, burst=5)

    def count(self, kinds: Mapping[str, int]) -> None:
        """Add failures not reported claim by claim (a call refused whole, a body that does not decode)."""
        self.counts.update(kinds)
        self.on_counted(kinds)

    def report(self, rpc: str, total: int, failures: Mapping[str, Failure]) -> None:
        if not failures:
            return
        kinds = Counter(f.kind for f in failures.values())
        self.count(kinds)
        first = next(iter(failures.values()))
        self._throttle.warning(
            f"{rpc} failures",
            "%s: %d of %d claim(s) failed (%s); the first: %s",
            rpc,
            len(failures),
            total,
            ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())),
            first.message,
        )
