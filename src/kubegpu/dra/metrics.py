"""The DRA driver's Prometheus series, fed by the driver's `DriverEvents` reports (imported only with
--http-endpoint). Shaped as dra-example-driver's (`prepare_claims_total{result}` and a latency histogram
per operation, success and error series present from the start), under kubegpu's `kubegpu_dra_` prefix:

    kubegpu_dra_prepare_claims_total{result}              counter: claims NodePrepareResources answered
    kubegpu_dra_prepare_claim_duration_seconds{result}    histogram: the duration of the call per claim
    kubegpu_dra_unprepare_claims_total{result}            counter
    kubegpu_dra_unprepare_claim_duration_seconds{result}  histogram
    kubegpu_dra_prepared_claims                           gauge: claims prepared on this node
    kubegpu_dra_devices{health}                           gauge: devices by health, as the kubelet is told
    kubegpu_dra_health_streams                            gauge: open NodeWatchResources streams
    kubegpu_dra_api_errors_total{kind}                    counter: failed API server calls
    kubegpu_dra_checkpoint_rebuilds_total{reason}         counter: claims rebuilt, no checkpoint
    kubegpu_dra_claims_refused_total{reason}              counter: claims refused before any work
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kubegpu.dra.events import API_ERROR_KINDS, HEALTH_STATES, REBUILD_REASONS, REFUSAL_REASONS, RESULTS

PREFIX = "kubegpu_dra"


def _known(value: str, known: tuple[str, ...]) -> str:
    return value if value in known else "other"


class DriverMetrics:
    def __init__(self, open_streams: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._prepare = Counter(
            f"{PREFIX}_prepare_claims",
            "Claims NodePrepareResources answered, by result.",
            ["result"],
            registry=r,
        )
        self._prepare_seconds = Histogram(
            f"{PREFIX}_prepare_claim_duration_seconds",
            "Seconds the NodePrepareResources call that carried a claim took, by the claim's result.",
            ["result"],
            registry=r,
        )
        self._unprepare = Counter(
            f"{PREFIX}_unprepare_claims",
            "Claims NodeUnprepareResources answered, by result.",
            ["result"],
            registry=r,
        )
        self._unprepare_seconds = Histogram(
            f"{PREFIX}_unprepare_claim_duration_seconds",
            "Seconds the NodeUnprepareResources call that carried a claim took, by the claim's result.",
            ["result"],
            registry=r,
        )
        self._prepared = Gauge(f"{PREFIX}_prepared_claims", "Claims prepared on this node.", registry=r)
        self._devices = Gauge(
            f"{PREFIX}_devices",
            "Published devices by the health the kubelet is told.",
            ["health"],
            registry=r,
        )
        streams = Gauge(f"{PREFIX}_health_streams", "Open NodeWatchResources streams.", registry=r)
        streams.set_function(lambda: float(open_streams()))
        self._api_errors = Counter(
            f"{PREFIX}_api_errors", "Failed API server calls, by kind.", ["kind"], registry=r
        )
        self._rebuilds = Counter(
            f"{PREFIX}_checkpoint_rebuilds",
            "Times the prepared claims were rebuilt without a readable checkpoint, by reason.",
            ["reason"],
            registry=r,
        )
        self._refused = Counter(
            f"{PREFIX}_claims_refused", "Claims refused before any work, by reason.", ["reason"], registry=r
        )
        for result in RESULTS:  # every series from the first scrape, as dra-example-driver does
            self._prepare.labels(result)
            self._unprepare.labels(result)
        for health in HEALTH_STATES:
            self._devices.labels(health)
        for kind in API_ERROR_KINDS:
            self._api_errors.labels(kind)
        for reason in REBUILD_REASONS:
            self._rebuilds.labels(reason)
        for reason in REFUSAL_REASONS:
            self._refused.labels(reason)

    def prepared(self, result: str, seconds: float) -> None:
        self._prepare.labels(result).inc()
        self._prepare_seconds.labels(result).observe(seconds)

    def unprepared(self, result: str, seconds: float) -> None:
        self._unprepare.labels(result).inc()
        self._unprepare_seconds.labels(result).observe(seconds)

    def prepared_claims(self, count: int) -> None:
        self._prepared.set(count)

    def devices(self, by_health: Mapping[str, int]) -> None:
        for health in HEALTH_STATES:
            self._devices.labels(health).set(by_health.get(health, 0))

    def api_error(self, kind: str) -> None:
        self._api_errors.labels(_known(kind, API_ERROR_KINDS)).inc()

    def checkpoint_rebuilt(self, reason: str) -> None:
        self._rebuilds.labels(_known(reason, REBUILD_REASONS)).inc()

    def claim_refused(self, reason: str) -> None:
        self._refused.labels(_known(reason, REFUSAL_REASONS)).inc()
