"""The publisher's API calls: which resource.k8s.io version is served, the Node's UID, and a node's
ResourceSlices (list, watch, create with or without dry run, replace, delete), as plain dicts in whichever
version is served. Blocking: the publisher runs them in threads."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from kubegpu.dra import slices
from kubegpu.dra.api_errors import ApiError, ApiStatusError
from kubegpu.dra.kubeapi import KubeClient, WatchStream
from kubegpu.dra.slices import GROUP, PLURAL

HTTP_NOT_FOUND, HTTP_CONFLICT, HTTP_GONE = 404, 409, 410
REQUEST_TIMEOUT = (10.0, 30.0)  # connect, read
NO_DRA = (
    "the API server does not serve resource.k8s.io v1, v1beta2 or v1beta1: DRA needs Kubernetes 1.32 or "
    "later with the resource.k8s.io API enabled (GA and on by default from 1.34)"
)


class PublishError(RuntimeError):
    """A failure with its one-line cause and fix (retried like any other)."""


def describe(err: BaseException) -> str:
    """One line for a failed attempt: the client's text for API errors, else the exception's first line."""
    if isinstance(err, ApiError | PublishError):
        return str(err)
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"


class SliceApi:
    def __init__(self, api: KubeClient, *, driver_name: str, node_name: str) -> None:
        self.api = api
        self.driver_name = driver_name
        self.node_name = node_name

    @property
    def field_selector(self) -> str:
        return f"spec.nodeName={self.node_name},spec.driver={self.driver_name}"

    def discover(self) -> str:
        """The resource.k8s.io version to use (v1, else v1beta2, else v1beta1); PublishError when none."""
        try:
            group = self.api.request("GET", f"/apis/{GROUP}", timeout=REQUEST_TIMEOUT)
        except ApiStatusError as err:
            if err.status == HTTP_NOT_FOUND:
                raise PublishError(NO_DRA) from err
            raise
        versions = group.get("versions") if isinstance(group, dict) else None
        served = [str(v.get("version")) for v in versions or [] if isinstance(v, dict)]
        version = slices.pick_version(served)
        if version is None:
            raise PublishError(f"{NO_DRA} (it serves {', '.join(served) or 'no version'})")
        return version

    def read_node_uid(self) -> str:
        try:
            node = self.api.request(
                "GET", f"/api/v1/nodes/{quote(self.node_name, safe='')}", timeout=REQUEST_TIMEOUT
            )
        except ApiStatusError as err:
            if err.status == HTTP_NOT_FOUND:
                raise PublishError(
                    f"node {self.node_name!r} not found: the slices are owned by their Node; check "
                    "--node-name (NODE_NAME, usually from the pod's spec.nodeName)"
                ) from err
            raise
        uid = (_object(node).get("metadata") or {}).get("uid")
        if not uid:
            raise PublishError(f"node {self.node_name!r} has no UID")
        return str(uid)

    def create(self, version: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        query = {"dryRun": "All"} if dry_run else None
        return _object(
            self.api.request("POST", _slices(version), query=query, body=body, timeout=REQUEST_TIMEOUT)
        )

    def replace(self, version: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _object(self.api.request("PUT", _slice(version, name), body=body, timeout=REQUEST_TIMEOUT))

    def delete(self, version: str, name: str) -> None:
        """Delete one slice; one already gone is no error."""
        try:
            self.api.request("DELETE", _slice(version, name), timeout=REQUEST_TIMEOUT)
        except ApiStatusError as err:
            if err.status != HTTP_NOT_FOUND:
                raise

    def list(self, version: str) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion (to watch from)."""
        body = _object(
            self.api.request(
                "GET", _slices(version), query={"fieldSelector": self.field_selector}, timeout=REQUEST_TIMEOUT
            )
        )
        items = [o for o in body.get("items") or [] if isinstance(o, dict) and self.ours(o)]
        return items, str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, version: str, resource_version: str, seconds: int) -> WatchStream:
        """A watch of our slices from `resource_version` that the server ends after `seconds`."""
        query = {
            "fieldSelector": self.field_selector,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(seconds),
        }
        return self.api.stream(_slices(version), query, (REQUEST_TIMEOUT[0], seconds + 30))

    def ours(self, obj: dict[str, Any]) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") == self.driver_name and spec.get("nodeName") == self.node_name


def _slices(version: str) -> str:
    return f"/apis/{GROUP}/{version}/{PLURAL}"


def _slice(version: str, name: str) -> str:
    return f"{_slices(version)}/{quote(name, safe='')}"


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise PublishError("the API server answered something that is not an object")
    return body
