"""Prepare reads the claim: GET it through the light API client (in the resource.k8s.io version the server
serves) and check it the way the kubelet plugin helper does, so the driver prepares exactly what the
scheduler allocated (pool, device, request) with the config that came with it.

Every failure is a `ClaimError` whose text goes to the kubelet as that claim's error, never an exception out
of the call: the API server refusing connections, timing out, answering 5xx or 429 past a short wait, or
answering what is not a claim (`ApiUnavailable`, which the kubelet retries on its next pod sync), the claim
gone or replaced (`ClaimGone`), not allocated or reserved (`ClaimNotReady`). `kind` names the class of
failure for the driver's counters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kubegpu.common.quoting import plain_id
from kubegpu.dra.api_errors import ApiError, ApiStatusError
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.slices import GROUP, pick_version

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # seconds for one request: well inside the kubelet's 45 s per call
THROTTLE_BUDGET = 2.0  # seconds of the server's Retry-After a GET may wait out before it answers an error
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
    """The API server could not answer (refused, timed out, 5xx, 429, an unexpected status or body): it may
    answer next time, and the kubelet retries. `kind` is the light client's (`ApiError.kind`: connection,
    timeout, server_error, too_many_requests, status, other)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Result:
    """One allocation result of this driver: the request it serves and the device picked for it."""

    request: str  # as the allocation names it (a subrequest is "req/sub")
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None  # one allocation of a device several claims share (ConsumableShares)
    consumed: tuple[tuple[str, str], ...] = ()  # its consumedCapacity: (capacity name, quantity text)

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
    # The object as read (its resourceVersion included): a status write starts from it (`claim_status`).
    obj: dict[str, Any] | None = field(default=None, compare=False, repr=False)


class ClaimReader:
    def __init__(self, api: KubeClient, driver_name: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.driver_name = driver_name
        self.timeout = timeout
        self._api = api
        self.version: str | None = None

    def warm(self) -> None:
        """Nothing to load ahead any more (the light client has no API classes to import)."""

    def _get(self, path: str, doing: str) -> Any:
        """The JSON answer of one GET; ApiStatusError for an error status, ApiUnavailable otherwise."""
        try:
            return self._api.request(
                "GET",
                path,
                timeout=(min(5.0, self.timeout), self.timeout),
                throttle_budget=min(THROTTLE_BUDGET, self.timeout / 2),
            )
        except ApiStatusError:
            raise
        except ApiError as err:  # refused, timed out, not JSON
            raise ApiUnavailable(f"cannot {doing}: {err}; {RETRY}", err.kind) from None

    def _status_failed(self, doing: str, err: ApiStatusError) -> ApiUnavailable:
        if err.status == 404:  # the path itself: the version went away (an upgrade); look it up again
            self.version = None
        return ApiUnavailable(f"cannot {doing}: {err}; {RETRY}", err.kind)

    def _served_version(self, doing: str) -> str:
        """The resource.k8s.io version to read, asked once; errors say they failed `doing` (the caller's)."""
        if self.version is None:
            try:
                group = self._get(f"/apis/{GROUP}", doing)
            except ApiStatusError as err:
                raise self._status_failed(doing, err) from None
            versions = group.get("versions") if isinstance(group, dict) else None
            served = [str(v.get("version")) for v in versions or [] if isinstance(v, dict)]
            version = pick_version(served)
            if version is None:
                raise ApiUnavailable(
                    f"cannot {doing}: the API server serves no resource.k8s.io version this driver reads "
                    f"({served}); {RETRY}",
                    "other",
                )
            self.version = version
        return self.version

    def get(self, namespace: str, name: str, uid: str) -> AllocatedClaim:
        """The claim as allocated for this driver; ClaimError naming what is wrong. Blocking: use a thread."""
        what = f"claim {plain_id(namespace)}/{plain_id(name)}"
        path = (
            f"/apis/{GROUP}/{self._served_version(f'read {what}')}/namespaces/{quote(namespace, safe='')}"
            f"/resourceclaims/{quote(name, safe='')}"
        )
        try:
            obj = self._get(path, f"read {what}")
        except ApiStatusError as err:
            if err.status == 404 and err.names("resourceclaims", name):
                raise ClaimGone(f"{what} not found: it was deleted before it could be prepared") from None
            raise self._status_failed(f"read {what}", err) from None
        if not isinstance(obj, dict):
            raise ApiUnavailable(f"cannot read {what}: the API server answered no object; {RETRY}", "other")
        return self.check(obj, namespace, name, uid)

    def on_node(self, pool: str) -> dict[str, dict[str, Any]]:
        """Every ResourceClaim (all namespaces) with an allocation result of this driver in `pool` (this
        node's), by UID: what the API server says is allocated here. ApiUnavailable when it cannot be asked.
        Blocking: use a thread."""
        doing = "list the resourceclaims"
        try:
            listed = self._get(f"/apis/{GROUP}/{self._served_version(doing)}/resourceclaims", doing)
        except ApiStatusError as err:
            raise self._status_failed(doing, err) from None
        items = listed.get("items") if isinstance(listed, dict) else None
        if not isinstance(items, list):
            raise ApiUnavailable(f"cannot {doing}: the API server answered no list; {RETRY}", "other")
        out = {}
        for obj in items:
            if not isinstance(obj, dict):
                continue
            results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            if any(
                isinstance(r, dict) and r.get("driver") == self.driver_name and r.get("pool") == pool
                for r in results or []
            ):
                out[str((obj.get("metadata") or {}).get("uid"))] = obj
        return out

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
                str(r["shareID"]) if r.get("shareID") else None,
                tuple((str(k), str(v)) for k, v in sorted((r.get("consumedCapacity") or {}).items())),
            )
            for r in devices.get("results") or []
            if r.get("driver") == self.driver_name
        )
        if not results:
            raise ClaimError(f"{what} has no devices of driver {self.driver_name}")
        return AllocatedClaim(namespace, name, uid, results, tuple(devices.get("config") or []), obj)
