"""What the DRA driver reports as it runs (`DriverEvents`), and the sink for it when no metrics are served.

`DriverMetrics` (metrics.py) turns these reports into Prometheus series. It is built, and prometheus-client
imported, only with `--http-endpoint` (HTTP_ENDPOINT): without an endpoint nobody can read the counters.

Who calls what: the Prepare/Unprepare results and the prepared-claims count come from `MeteredPreparer`
(metered.py), the devices by health from the daemon's health reports, `api_error` from the official
client's REST layer (api_errors.py: every call the claim reader and the slice publisher make today).
`checkpoint_rebuilt` and `claim_refused` are for the checkpoint's rebuild and Prepare's refusals to call,
and `api_error` for a client that replaces the official one (see the kinds and reasons below); a kind or
reason not listed is counted under "other".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

RESULTS = ("success", "error")
HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")
# An API call that failed: refused or reset connection, no answer in time, 5xx, 429, anything else.
API_ERROR_KINDS = ("connection", "timeout", "server_error", "too_many_requests", "other")
# Why the prepared claims were rebuilt from the CDI specs and the API server at start-up.
REBUILD_REASONS = ("missing", "unreadable", "other")
# Why a claim of a call was refused without being prepared.
REFUSAL_REASONS = ("duplicate_uid", "device_in_use", "too_many_claims", "other")


class DriverEvents(Protocol):
    def prepared(self, result: str, seconds: float) -> None:
        """One claim of a NodePrepareResources: "success" or "error", and how long its call took."""

    def unprepared(self, result: str, seconds: float) -> None:
        """One claim of a NodeUnprepareResources, as `prepared`."""

    def prepared_claims(self, count: int) -> None:
        """How many claims are prepared on this node now."""

    def devices(self, by_health: Mapping[str, int]) -> None:
        """The published devices by health ("Healthy", "Unhealthy", "Unknown"), as the kubelet is told."""

    def api_error(self, kind: str) -> None:
        """A failed API server call, by `API_ERROR_KINDS`."""

    def checkpoint_rebuilt(self, reason: str) -> None:
        """The prepared claims were rebuilt (no readable checkpoint), by `REBUILD_REASONS`."""

    def claim_refused(self, reason: str) -> None:
        """A claim answered with an error before any work, by `REFUSAL_REASONS`."""


class NoMetrics:
    """DriverEvents when no endpoint serves metrics: every report is dropped."""

    def prepared(self, result: str, seconds: float) -> None:
        pass

    def unprepared(self, result: str, seconds: float) -> None:
        pass

    def prepared_claims(self, count: int) -> None:
        pass

    def devices(self, by_health: Mapping[str, int]) -> None:
        pass

    def api_error(self, kind: str) -> None:
        pass

    def checkpoint_rebuilt(self, reason: str) -> None:
        pass

    def claim_refused(self, reason: str) -> None:
        pass
