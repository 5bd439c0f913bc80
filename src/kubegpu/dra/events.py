"""What the DRA driver reports as it runs (`DriverEvents`), and the sink for it when no metrics are served.

`DriverMetrics` (metrics.py) turns these reports into Prometheus series. It is built, and prometheus-client
imported, only with `--http-endpoint` (HTTP_ENDPOINT): without an endpoint nobody can read the counters.

Who calls what: the Prepare/Unprepare results, the prepared-claims count, the rebuilds and the refusals come
from `MeteredPreparer` (metered.py: the Preparer's own counts as they happen), the devices by health from
the daemon's health reports, `api_error` from the light API client (kubeapi.py: every failed call the claim
reader, the rebuild and the slice publisher make). A kind or reason not listed is counted under "other".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

RESULTS = ("success", "error")
HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")
# An API call that failed: refused or reset connection, no answer in time, 5xx, 429, anything else.
API_ERROR_KINDS = ("connection", "timeout", "server_error", "too_many_requests", "other")
# Why the prepared claims were rebuilt from the CDI specs and the API server: no checkpoint file at all,
# neither copy readable, or CDI specs on disk that a readable checkpoint does not name.
REBUILD_REASONS = ("missing", "unreadable", "other")
# Why a claim was refused without being prepared or unprepared: its UID twice in one call, a device another
# claim holds, a call over the claim limit (each of its claims), a body that does not decode (once: its
# claims are unknown), no UID or a UID sent with another claim's namespace and name ("other").
REFUSAL_REASONS = ("duplicate_uid", "device_in_use", "too_many_claims", "undecodable", "other")


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
