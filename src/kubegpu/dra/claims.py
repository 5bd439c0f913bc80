"""Prepare reads the claim: GET it through the official client (in the resource.k8s.io version the server
serves) and check it the way the kubelet plugin helper does, so the driver prepares exactly what the
scheduler allocated (pool, device, request) with the config that came with it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kubegpu.dra.slices import GROUP, pick_version

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (5.0, 20.0)  # connect, read: well inside the kubelet's 45 s per call


class ClaimError(RuntimeError):
    """This claim cannot be prepared; the text goes to the kubelet as the claim's error."""


class ClaimGone(ClaimError):
    """The claim does not exist (any more), or a new one took its name."""


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
    def __init__(self, api_client: client.ApiClient, driver_name: str) -> None:
        self.driver_name = driver_name
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

    def _served_version(self) -> str:
        if self.version is None:
            response = self._group.get_api_group(_preload_content=False, _request_timeout=REQUEST_TIMEOUT)
            served = [str(v.get("version")) for v in json.loads(response.data).get("versions") or []]
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
            response = self._custom.get_namespaced_custom_object(
                GROUP,
                self._served_version(),
                namespace,
                "resourceclaims",
                name,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            obj = json.loads(response.data)
        except ApiException as err:
            if err.status == 404 and _names_claim(err, name):
                raise ClaimGone(f"{what} not found: it was deleted before it could be prepared") from None
            if err.status == 404:  # the path itself: the version went away (an upgrade); look it up again
                self.version = None
            raise ClaimError(f"cannot read {what}: {err.status} {err.reason}") from None
        except (OSError, ValueError) as err:  # connection refused, timeouts, not JSON
            raise ClaimError(f"cannot read {what}: {err}") from None
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


def _names_claim(err: ApiException, name: str) -> bool:
    """A 404 about this claim (its Status names it), not about the path: a version the server no longer
    serves answers 404 too, for every claim, and must not read as "every claim was deleted"."""
    try:
        details = json.loads(err.body or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    return bool(details.get("kind") == "resourceclaims" and details.get("name") == name)
