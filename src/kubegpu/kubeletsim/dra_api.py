"""The API calls the kubelet's DRA side makes: GET a ResourceClaim, DELETE a node's ResourceSlices as a
collection (at start-up, and when a driver is gone for good), and PATCH a pod's status (device health).

Plain HTTP(S) with JSON through the standard library, run in a thread: the simulator stays free of the
heavy `kubernetes` client and of the simulated API server's code (it judges what others publish there).
The kubelet reads resource.k8s.io in the version its release uses: v1beta1 up to 1.33, v1 from 1.34.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

_TIMEOUT = 10.0


class ApiRequestError(Exception):
    """A failed API call; str() is the API server's Status message (client-go prints that)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ApiEndpoint:
    url: str  # e.g. http://127.0.0.1:6443
    token: str = ""
    resource_version: str = "v1"  # the resource.k8s.io version the kubelet speaks

    def _request(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "",
    ) -> Any:
        target = self.url.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            target, data=data, method=method, headers={"Accept": "application/json"}
        )
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                message = json.loads(body).get("message") or str(err)
            except (ValueError, AttributeError):
                message = body.decode(errors="replace") or str(err)
            raise ApiRequestError(err.code, message) from None
        except (urllib.error.URLError, OSError) as err:
            raise ApiRequestError(0, f"{method} {target}: {getattr(err, 'reason', err)}") from None

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/resource.k8s.io/{self.resource_version}/namespaces/{namespace}/resourceclaims/{name}"
        return await asyncio.to_thread(self._request, "GET", path)

    async def patch_pod_status(self, namespace: str, name: str, patch: Any) -> Any:
        """The status manager's PATCH of pods/<name>/status (a strategic merge patch)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        return await asyncio.to_thread(
            self._request, "PATCH", path, None, patch, "application/strategic-merge-patch+json"
        )

    async def delete_slices(self, node: str, driver: str = "") -> int:
        """DeleteCollection of the node's slices (of one driver, or all); returns how many went."""
        selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
        path = f"/apis/resource.k8s.io/{self.resource_version}/resourceslices"
        body = await asyncio.to_thread(self._request, "DELETE", path, {"fieldSelector": selector})
        return len((body or {}).get("items") or []) if isinstance(body, dict) else 0
