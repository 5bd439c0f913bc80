"""Prepare reads the claim: GET it through the official client (in the resource.k8s.io version the server
serves) and check it the way the kubelet plugin helper does, so the driver prepares exactly what the
scheduler allocated (pool, device, request) with the config that came with it.

Every failure is a `ClaimError` whose text goes to the kubelet as that claim's error, never an exception out
of the call: the API server refusing connections, timing out, answering 5xx or 429 (`ApiUnavailable`, which
the kubelet retries on its next pod sync), the claim gone or replaced (`ClaimGone`), not allocated or
reserved (`ClaimNotReady`). `kind` names the class of failure for the driver's counters."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as TransportError
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError
from urllib3.exceptions import TimeoutError as TransportTimeout

from kubegpu.common.quoting import plain_id
from kubegpu.dra.slices import GROUP, pick_version

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # seconds for one request: well inside the kubelet's 45 s per call
RETRY = "the kubelet will retry"


class ClaimError(RuntimeError):
    """This claim cannot be prepared; the text goes to the kubelet as the claim's error."""

    kind = "invalid"


class ClaimGone(ClaimError):
    """The claim does not exist (any more), or a new one took its name."""

    kind = "gone"


class ClaimNotReady(ClaimError):
    """The claim is not (or no longer) allocated and reserved: the scheduler has not finished with it."""

    kind = "not-ready"


class ApiUnavailable(ClaimError):
    """The API server could not be asked (refused, timed out) or answered an error (5xx, 429, 403...)."""

    kind = "api"


@dataclass(frozen=True, slots=True)
class Result:
    """One allocation result of this driver: the request it serves and the device picked for it."""

    request: str  # as the allocation names it (a subrequest is "req/sub")
    pool: str
    device: str
    admin_access: bool = False

    @property
    def request_name(self) -> str:
        """The name the kubelet matches against containers: the subrequest's parent ("req/sub" -> "req")."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class AllocatedClaim:
    namespace: str
    name: str
    uid: str
    results: tuple[Result, ...]
    configs: tuple[dict[str, Any], ...]  # status.allocation.devices.config


class ClaimReader:
    def __init__(
        self, api_client: client.ApiClient, driver_name: str, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.driver_name = driver_name
        self.timeout = timeout
        self._api_client = api_client
        self._apis: tuple[Any, Any] | None = None  # made at first use: the client's API classes import slowly
        self.version: str | None = None

    @property
    def _custom(self) -> Any:
        return self._client_apis()[0]

    @property
    def _group(self) -> Any:
        return self._client_apis()[1]

    def warm(self) -> None:
        """Import the client's API classes now (blocking), not in the first Prepare."""
        self._client_apis()

    def _client_apis(self) -> tuple[Any, Any]:
        if self._apis is None:
            self._apis = (client.CustomObjectsApi(self._api_client), client.ResourceApi(self._api_client))
        return self._apis

    @property
    def _request_timeout(self) -> tuple[float, float]:
        return (min(5.0, self.timeout), self.timeout)  # connect, read

    def _served_version(self) -> str:
        if self.version is None:
            response = self._group.get_api_group(
                _preload_content=False, _request_timeout=self._request_timeout
            )
            served = [str(v.get("version")) for v in json.loads(response.data).get("versions") or []]
            version = pick_version(served)
            if version is None:
                raise ApiUnavailable(
                    f"the API server serves no resource.k8s.io version this driver reads ({served}); {RETRY}"
                )
            self.version = version
        return self.version

    def get(self, namespace: str, name: str, uid: str) -> AllocatedClaim:
        """The claim as allocated for this driver; ClaimError naming what is wrong. Blocking: use a thread."""
        what = f"claim {plain_id(namespace)}/{plain_id(name)}"
        try:
            response = self._custom.get_namespaced_custom_object(
                GROUP,
                self._served_version(),
                namespace,
                "resourceclaims",
                name,
                _preload_content=False,
                _request_timeout=self._request_timeout,
            )
            obj = json.loads(response.data)
        except ApiException as err:
            if err.status == 404 and _names_claim(err, name):
                raise ClaimGone(f"{what} not found: it was deleted before it could be prepared") from None
            raise self._failed(f"read {what}", err) from None
        except (TransportError, OSError, ValueError) as err:
            raise self._failed(f"read {what}", err) from None
        if not isinstance(obj, dict):
            raise ApiUnavailable(f"cannot read {what}: the API server answered no object; {RETRY}")
        return self.check(obj, namespace, name, uid)

    def on_node(self, pool: str) -> dict[str, dict[str, Any]]:
        """Every ResourceClaim (all namespaces) with an allocation result of this driver in `pool` (this
        node's), by UID: what the API server says is allocated here. ApiUnavailable when it cannot be asked.
        Blocking: use a thread."""
        try:
            response = self._custom.list_cluster_custom_object(
                GROUP,
                self._served_version(),
                "resourceclaims",
                _preload_content=False,
                _request_timeout=self._request_timeout,
            )
            items = json.loads(response.data).get("items") or []
        except ApiException as err:
            raise self._failed("list the resourceclaims", err) from None
        except (TransportError, OSError, ValueError, AttributeError) as err:
            raise self._failed("list the resourceclaims", err) from None
        out = {}
        for obj in items:
            results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            if any(r.get("driver") == self.driver_name and r.get("pool") == pool for r in results or []):
                out[str((obj.get("metadata") or {}).get("uid"))] = obj
        return out

    def _failed(self, doing: str, err: Exception) -> ClaimError:
        """The one-line error for a request that failed: what failed, why, and that it is retried."""
        if isinstance(err, ApiException):
            if err.status == 404:  # the path itself: the version went away (an upgrade); look it up again
                self.version = None
            why = f"the API server answered {err.status} {err.reason}"
        else:
            why = _transport_problem(err, self.timeout)
        return ApiUnavailable(f"cannot {doing}: {why}; {RETRY}")

    def check(self, obj: dict[str, Any], namespace: str, name: str, uid: str) -> AllocatedClaim:
        what = f"claim {plain_id(namespace)}/{plain_id(name)}"
        got = (obj.get("metadata") or {}).get("uid")
        if got != uid:
            raise ClaimGone(f"{what}: UID is {got}, not {uid}: the claim was deleted and created again")
        status = obj.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise ClaimNotReady(f"{what} is not allocated: the scheduler has not picked its devices")
        if not status.get("reservedFor"):
            raise ClaimNotReady(f"{what} is not reserved for any pod (status.reservedFor is empty)")
        devices = allocation.get("devices") or {}
        results = tuple(
            Result(
                str(r.get("request", "")),
                str(r.get("pool", "")),
                str(r.get("device", "")),
                bool(r.get("adminAccess")),
            )
            for r in devices.get("results") or []
            if r.get("driver") == self.driver_name
        )
        if not results:
            raise ClaimError(f"{what} has no devices of driver {self.driver_name}")
        return AllocatedClaim(namespace, name, uid, results, tuple(devices.get("config") or []))


def _names_claim(err: ApiException, name: str) -> bool:
    """A 404 about this claim (its Status names it), not about the path: a version the server no longer
    serves answers 404 too, for every claim, and must not read as "every claim was deleted"."""
    try:
        details = json.loads(err.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return bool(details.get("kind") == "resourceclaims" and details.get("name") == name)


def _transport_problem(err: Exception, timeout: float) -> str:
    """What went wrong on the way to the API server, in a few words (urllib3 wraps the cause)."""
    cause: BaseException = err.reason if isinstance(err, MaxRetryError) and err.reason else err
    # Before timeouts: urllib3's NewConnectionError is a ConnectTimeoutError too (for compatibility).
    if isinstance(cause, NewConnectionError | ConnectionRefusedError):
        return "the API server refused the connection (is it down?)"
    if isinstance(cause, TransportTimeout | TimeoutError):
        return f"the API server did not answer within {timeout:g} s"
    if isinstance(cause, ProtocolError | ConnectionError):
        return "the connection to the API server was lost"
    if isinstance(cause, ValueError):
        return f"the API server's answer is not JSON ({cause})"
    return f"the API server could not be reached ({type(cause).__name__}: {cause})"
