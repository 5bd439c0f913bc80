"""Prepare reads the claim: GET it (in the resource.k8s.io version the server serves) and check it the way
the kubelet plugin helper does, so the driver prepares exactly what the scheduler allocated (pool, device,
request) with the config that came with it.

An API server that cannot answer (refused, timed out, 5xx, 429 past a short wait) is a `ClaimApiError`: a
per-claim error whose text says what failed and that the kubelet will retry, never a failed call."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubegpu.dra.api_errors import ApiError, ApiStatusError
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.slices import GROUP, pick_version

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (5.0, 20.0)  # connect, read: well inside the kubelet's 45 s per call
THROTTLE_BUDGET = 2.0  # seconds of the server's Retry-After a GET may wait out before it answers an error
RETRY = "the kubelet will retry"


class ClaimError(RuntimeError):
    """This claim cannot be prepared; the text goes to the kubelet as the claim's error."""


class ClaimGone(ClaimError):
    """The claim does not exist (any more), or a new one took its name."""


class ClaimApiError(ClaimError):
    """The API server could not say (unreachable, timed out, an error status): it may answer next time.
    `kind` is the ApiError's (unreachable, timeout, throttled, server, status, bad-response)."""

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
    def __init__(self, api: KubeClient, driver_name: str) -> None:
        self.driver_name = driver_name
        self._api = api
        self.version: str | None = None

    def warm(self) -> None:
        """Nothing to load ahead any more (the light client has no API classes to import)."""

    def _served_version(self) -> str:
        if self.version is None:
            group = self._api.request(
                "GET", f"/apis/{GROUP}", timeout=REQUEST_TIMEOUT, throttle_budget=THROTTLE_BUDGET
            )
            versions = group.get("versions") if isinstance(group, dict) else None
            served = [str(v.get("version")) for v in versions or [] if isinstance(v, dict)]
            version = pick_version(served)
            if version is None:
                raise ClaimError(
                    f"the API server serves no resource.k8s.io version this driver reads ({served})"
                )
            self.version = version
        return self.version

    def get(self, namespace: str, name: str, uid: str) -> AllocatedClaim:
        """The claim as allocated for this driver; ClaimError naming what is wrong. Blocking: use a thread."""
        what = f"claim {namespace}/{name}"
        try:
            path = (
                f"/apis/{GROUP}/{self._served_version()}/namespaces/{quote(namespace, safe='')}"
                f"/resourceclaims/{quote(name, safe='')}"
            )
            obj = self._api.request("GET", path, timeout=REQUEST_TIMEOUT, throttle_budget=THROTTLE_BUDGET)
        except ApiStatusError as err:
            if err.status == 404 and err.names("resourceclaims", name):
                raise ClaimGone(f"{what} not found: it was deleted before it could be prepared") from None
            if err.status == 404:  # the path itself: the version went away (an upgrade); look it up again
                self.version = None
            raise ClaimApiError(f"cannot read {what}: {err}; {RETRY}", err.kind) from None
        except ApiError as err:  # refused, timed out, not JSON
            raise ClaimApiError(f"cannot read {what}: {err}; {RETRY}", err.kind) from None
        if not isinstance(obj, dict):
            raise ClaimApiError(
                f"cannot read {what}: the API server answered no object; {RETRY}", "bad-response"
            )
        return self.check(obj, namespace, name, uid)

    def check(self, obj: dict[str, Any], namespace: str, name: str, uid: str) -> AllocatedClaim:
        what = f"claim {namespace}/{name}"
        got = (obj.get("metadata") or {}).get("uid")
        if got != uid:
            raise ClaimGone(f"{what}: UID is {got}, not {uid}: the claim was deleted and created again")
        status = obj.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise ClaimError(f"{what} is not allocated: the scheduler has not picked its devices")
        if not status.get("reservedFor"):
            raise ClaimError(f"{what} is not reserved for any pod (status.reservedFor is empty)")
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
