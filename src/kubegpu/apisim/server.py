"""A Kubernetes API server for tests and the demo, on 127.0.0.1 over plain HTTP, as the real one speaks.

    api = ApiServerSim(resource_versions=("v1", "v1beta1"))   # what a 1.34 cluster serves of DRA
    api.start()
    api.add_node("node-a", {"gpu": "true"})
    config = kubernetes.client.Configuration(host=api.url)      # or api.write_kubeconfig(path)
    kubernetes.client.ResourceV1Api(kubernetes.client.ApiClient(config)).list_resource_slice(...)

It serves core Nodes and Pods (with /status), resource.k8s.io ResourceSlices, ResourceClaims (with /status),
ResourceClaimTemplates and DeviceClasses in every configured version (stored once, converted per request:
convert.py), and NFD's NodeFeature custom resource. Verbs: GET, LIST (labelSelector; fieldSelector on
metadata.name and each kind's own labels), WATCH (from a resourceVersion, synthetic ADDED events without
one, BOOKMARKs, 410 Gone on compacted history, DELETED/ADDED when an object leaves/enters a selector),
CREATE (generateName, 409 AlreadyExists), UPDATE (409 Conflict on a stale resourceVersion), PATCH (merge
and strategic merge), DELETE (finalizers, preconditions, owner-reference garbage collection) and
DELETE on a collection (how the kubelet wipes a node's slices); `dryRun=All` on writes; discovery; the
validation in validation.py; errors as `Status` bodies with the real texts (errors.py).

Not modelled: authentication and authorization (any token is accepted), namespaces as objects (any
namespace exists), admission (no ValidatingAdmissionPolicy, no ResourceQuota), JSON patch and server-side
apply (415), pagination (`limit` is ignored, which the real server may also do), protobuf and CBOR,
aggregated discovery, managedFields, the resourceclaim and garbage-collector controllers' delays (the
collector runs synchronously at the owner's deletion), pod validation, defaulting and graceful deletion, and
feature gates other than DRADeviceTaints (when off, device taints are dropped on write, as a 1.34 server
with the gate off drops them; a 1.32 server, which has no taints field, drops them too).

Every response closes its connection, so a stopped server is really unreachable (no kept-alive socket
keeps serving). Requests are recorded for assertions. A server in trouble is one attribute away:
`api.fault = Fault(status=500)` (or 429, or `hang_s=30` to hold requests unanswered), optionally only for
paths containing a string; `api.stop()` refuses connections.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubegpu.resourceapi.cel import compile_error

from .convert import from_hub, to_hub
from .discovery import api_group, api_group_list, api_resource_list, api_versions, version_info
from .errors import ApiError, bad_request, gone, injected, method_not_allowed, unsupported_media_type
from .kinds import (
    ALL_KINDS,
    NODES,
    RESOURCE_GROUP,
    RESOURCE_SLICES,
    RESOURCE_VERSIONS,
    ResourceKind,
    field_value,
    find_kind,
)
from .partitionable import drop_disabled_sharing_fields
from .patch import merge_patch, strategic_merge_patch
from .pod_proxy import is_proxy_path, proxy_get
from .routes import DiscoveryRoute, ResourceRoute, parse_path
from .selectors import matcher
from .store import DeleteOptions, Event, Obj, Store

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
DEFAULT_WATCH_TIMEOUT = 30.0  # the real server picks 30-60 min; shorter here so watchers re-list often


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One request as it arrived: method, path, query (last value of each key) and JSON body."""

    method: str
    path: str
    query: Mapping[str, str]
    body: Any = None


@dataclass(frozen=True, slots=True)
class Fault:
    """What the server does with the requests whose path contains `path_contains` ("": all of them): hold
    each `hang_s` seconds first, then answer `status` (500, 429, 503) with its Status body, or the request
    as usual when `status` is 0."""

    status: int = 0
    hang_s: float = 0.0
    path_contains: str = ""

    def applies(self, path: str) -> bool:
        return self.path_contains in path


class ApiServerSim:
    def __init__(
        self,
        *,
        resource_versions: Sequence[str] = RESOURCE_VERSIONS,
        kubernetes_version: str = "1.34.0",
        feature_gates: Mapping[str, bool] | None = None,
        node_feature_crd: bool = True,
        validation: bool = True,
        garbage_collection: bool = True,
        watch_timeout: float = DEFAULT_WATCH_TIMEOUT,
    ) -> None:
        """`resource_versions`: the resource.k8s.io versions served, preferred first, e.g. ("v1beta1",) for
        a 1.32 cluster, ("v1beta2", "v1beta1") for 1.33, ("v1", "v1beta2", "v1beta1") for 1.34+; () serves
        no DRA API at all. `feature_gates`: DRADeviceTaints, DRAPartitionableDevices, DRAConsumableCapacity
        (all on by default; one set off has its fields dropped on write, as the real server drops them)."""
        unknown = set(resource_versions) - set(RESOURCE_VERSIONS)
        if unknown:
            raise ValueError(
                f"resource.k8s.io versions {sorted(unknown)} are not modelled; use {RESOURCE_VERSIONS}"
            )
        self.kubernetes_version = kubernetes_version
        self.feature_gates = {"DRADeviceTaints": True, **(feature_gates or {})}
        self.served: dict[str, tuple[str, ...]] = {"": ("v1",), RESOURCE_GROUP: tuple(resource_versions)}
        if node_feature_crd:
            self.served["nfd.k8s-sigs.io"] = ("v1alpha1",)
        self.kinds = tuple(k for k in ALL_KINDS if self.served.get(k.group))
        self.watch_timeout = watch_timeout
        self.store = Store(
            check_cel=compile_error,
            validation=validation,
            garbage_collection=garbage_collection,
            dropped_fields=self._drop_disabled_fields,
        )
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every request
        self.calls: list[ApiCall] = []
        self.fault: Fault | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again, on the same port after a stop) and serve in a background thread."""
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening and end the open watches: the client sees the connection go away."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.close_streams()

    def __enter__(self) -> ApiServerSim:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
                    "users": [{"name": "sim", "user": {"token": "sim-token"}}],
                    "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
                    "current-context": "sim",
                }
            )
        )
        return path

    # ---- objects, from Python (stored v1 shape) -------------------------------------------------------

    def create(self, resource: str, obj: Obj, namespace: str = "default") -> Obj:
        kind = find_kind(resource, self.kinds)
        return self.store.create(
            kind, namespace if kind.namespaced else "", to_hub(kind, kind.versions[0], obj)
        )

    def get(self, resource: str, name: str, namespace: str = "default") -> Obj:
        kind = find_kind(resource, self.kinds)
        return self.store.get(kind, namespace if kind.namespaced else "", name)

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Obj]:
        kind = find_kind(resource, self.kinds)
        wanted = matcher(label_selector, field_selector, kind.supported_field_labels(), field_value)
        return self.store.list(kind, namespace if kind.namespaced else None, wanted)[0]

    def update(self, resource: str, obj: Obj, *, status: bool = False) -> Obj:
        """PUT (or PUT .../status): a stale metadata.resourceVersion is a 409 Conflict."""
        kind = find_kind(resource, self.kinds)
        meta = obj["metadata"]
        return self.store.update(
            kind,
            meta.get("namespace", "") if kind.namespaced else "",
            meta["name"],
            obj,
            subresource="status" if status else "",
        )

    def patch(
        self, resource: str, name: str, patch: Obj, namespace: str = "default", *, status: bool = False
    ) -> Obj:
        """A JSON merge patch, as `kubectl patch --type merge` sends it."""
        kind = find_kind(resource, self.kinds)
        ns = namespace if kind.namespaced else ""
        return self.store.mutate(
            kind,
            ns,
            name,
            lambda current: merge_patch(current, patch),
            subresource="status" if status else "",
        )

    def delete(
        self, resource: str, name: str, namespace: str = "default", *, propagation_policy: str = "Background"
    ) -> None:
        kind = find_kind(resource, self.kinds)
        self.store.delete(kind, namespace if kind.namespaced else "", name, DeleteOptions(propagation_policy))

    # ---- nodes ---------------------------------------------------------------------------------------

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> Obj:
        return self.store.create(NODES, "", {"metadata": {"name": name, "labels": dict(labels or {})}})

    def set_label(self, name: str, key: str, value: str | None, *, record: bool = True) -> None:
        """Set (or with None remove) one label. `record=False` leaves no watch event, as if the event
        had been compacted away before the watcher saw it."""
        node = self.store.get(NODES, "", name)
        labels = node["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
        if record:
            self.store.update(NODES, "", name, node)
        else:
            self.store.put_unrecorded(NODES, node)

    def delete_node(self, name: str) -> None:
        """Delete the Node; its ResourceSlices (owner-referenced to it) go with it, as the GC does."""
        self.store.delete(NODES, "", name)

    def compact(self) -> None:
        """Drop the event history: watches from any earlier resourceVersion now get 410 Gone."""
        self.store.compact()

    @property
    def compacted(self) -> int:
        return self.store.compacted

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    def close_streams(self) -> None:
        """End every open watch without a goodbye, as a lost connection does."""
        self.store.close_streams()

    # ---- request log ---------------------------------------------------------------------------------

    def lists(self, resource: str = "nodes") -> builtins.list[Mapping[str, str]]:
        return [c.query for c in self._reads(resource) if not _flag(c.query, "watch")]

    def watches(self, resource: str = "nodes") -> builtins.list[Mapping[str, str]]:
        return [c.query for c in self._reads(resource) if _flag(c.query, "watch")]

    def _reads(self, resource: str) -> builtins.list[ApiCall]:
        kind = find_kind(resource, self.kinds)
        out = []
        for call in list(self.calls):
            if call.method != "GET":
                continue
            try:
                route = parse_path(call.path, self.kinds, self.served)
            except ApiError:
                continue
            if isinstance(route, ResourceRoute) and route.kind is kind and not route.name:
                out.append(call)
        return out

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; requests so far: {self.requests}")
            time.sleep(0.01)

    # ---- feature gates ---------------------------------------------------------------------------

    @property
    def _serves_device_taints(self) -> bool:
        # Device taints came in 1.33 (alpha, KEP-5055); a 1.32 server has no such field and drops it as an
        # unknown one, whatever the gate says.
        minor = int(self.kubernetes_version.split(".")[1])
        return bool(self.feature_gates.get("DRADeviceTaints")) and minor >= 33

    def _drop_disabled_fields(self, kind: ResourceKind, obj: Obj) -> None:
        if kind is RESOURCE_SLICES and not self._serves_device_taints:
            for device in (obj.get("spec") or {}).get("devices") or []:
                if isinstance(device, dict):
                    device.pop("taints", None)
        drop_disabled_sharing_fields(kind, obj, self.feature_gates)

    # ---- serving ---------------------------------------------------------------------------------

    def discovery_body(self, route: DiscoveryRoute) -> dict[str, Any]:
        if route.what == "version":
            return version_info(self.kubernetes_version)
        if route.what == "api":
            return api_versions(f"127.0.0.1:{self.port}")
        if route.what == "apis":
            return api_group_list(self.served)
        if route.what == "group":
            return api_group(route.group, self.served[route.group])
        kinds = [k for k in self.kinds if k.group == route.group and route.version in k.versions]
        return api_resource_list(ResourceKind.api_version(kinds[0], route.version), kinds)

    def list_body(self, route: ResourceRoute, query: Mapping[str, str]) -> dict[str, Any]:
        kind = route.kind
        wanted = self._matcher(route, query)
        items, rv = self.store.list(kind, route.namespace, wanted)
        shown = [from_hub(kind, route.version, o) for o in items]
        if not kind.custom:  # built-in lists leave kind/apiVersion out of their items
            for item in shown:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version(route.version),
            "metadata": {"resourceVersion": str(rv)},
            "items": shown,
        }

    def _matcher(self, route: ResourceRoute, query: Mapping[str, str]) -> Callable[[Obj], bool]:
        return matcher(
            query.get("labelSelector", ""),
            query.get("fieldSelector", ""),
            route.kind.supported_field_labels(),
            field_value,
        )

    def stream_watch(
        self, route: ResourceRoute, query: Mapping[str, str], send: Callable[[dict[str, Any]], None]
    ) -> None:
        """Send the events after the query's resourceVersion as they happen, until the timeout (then a
        BOOKMARK if asked for, as the real server does) or `close_streams()` (no goodbye: a lost server)."""
        kind, store = route.kind, self.store
        wanted = self._matcher(route, query)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or self.watch_timeout)
        requested = query.get("resourceVersion") or ""
        with store.cond:
            epoch = store.epoch
            if requested in ("", "0"):
                # "Start at most recent": synthetic ADDED events for the current state first.
                current, cursor = store.list(kind, route.namespace, wanted)
            else:
                current, cursor = [], int(requested) if requested.isdigit() else -1
            compacted = store.compacted
        if cursor < 0:
            send({"type": "ERROR", "object": bad_request(f"invalid resource version: {requested}").status()})
            return
        if requested not in ("", "0") and cursor < compacted:
            send(
                {
                    "type": "ERROR",
                    "object": gone(f"too old resource version: {cursor} ({compacted})").status(),
                }
            )
            return
        for obj in current:
            send({"type": "ADDED", "object": from_hub(kind, route.version, obj)})
        while True:
            with store.cond:
                while True:
                    fresh = [e for e in store.history if e.resource_version > cursor and e.kind is kind]
                    remaining = deadline - time.monotonic()
                    if fresh or store.epoch != epoch or remaining <= 0:
                        break
                    store.cond.wait(min(remaining, 0.5))
                closed = store.epoch != epoch
                latest = store.resource_version
            if fresh:
                for event in fresh:
                    shown = self._watch_event(event, route, wanted)
                    if shown is not None:
                        send(shown)
                cursor = fresh[-1].resource_version
                continue
            if not closed and _flag(query, "allowWatchBookmarks"):
                bookmark = {
                    "kind": kind.kind,
                    "apiVersion": kind.api_version(route.version),
                    "metadata": {"resourceVersion": str(latest)},
                }
                send({"type": "BOOKMARK", "object": bookmark})
            return

    def _watch_event(
        self, event: Event, route: ResourceRoute, wanted: Callable[[Obj], bool]
    ) -> dict[str, Any] | None:
        """The event as this watch sees it (the watch cache's rule): entering the selector is ADDED,
        leaving it is DELETED (with the previous state at the new resourceVersion)."""
        obj, previous = event.object, event.previous
        if (
            route.namespace is not None
            and route.kind.namespaced
            and obj["metadata"].get("namespace") != route.namespace
        ):
            return None
        now = wanted(obj) and event.type != "DELETED"
        before = previous is not None and wanted(previous) and event.type != "ADDED"
        if event.type == "DELETED":
            now, before = False, wanted(obj)
        if now and before:
            kind, shown = "MODIFIED", obj
        elif now:
            kind, shown = "ADDED", obj
        elif before:
            kind = "DELETED"
            shown = copy.deepcopy(obj if event.type == "DELETED" or previous is None else previous)
            shown["metadata"]["resourceVersion"] = str(event.resource_version)
        else:
            return None
        return {"type": kind, "object": from_hub(route.kind, route.version, shown)}

    def handle(
        self, method: str, route: ResourceRoute, query: Mapping[str, str], body: Any, content_type: str
    ) -> tuple[int, Any]:
        """Every non-watch resource request: (HTTP status, response body)."""
        kind, version, ns = route.kind, route.version, route.scope_namespace
        dry_run = query.get("dryRun") == "All" or (
            isinstance(body, dict) and "All" in (body.get("dryRun") or [])
        )
        store = self.store
        if method == "GET":
            if not route.name:
                return 200, self.list_body(route, query)
            return 200, from_hub(kind, version, store.get(kind, ns, route.name))
        if method == "POST":
            if route.name or (route.namespace is None and kind.namespaced):
                raise method_not_allowed()
            obj = self._body_object(route, body)
            if kind.namespaced and obj.get("metadata", {}).get("namespace") not in (
                None,
                "",
                route.namespace,
            ):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            created = store.create(kind, ns, to_hub(kind, version, obj), dry_run=dry_run)
            return 201, from_hub(kind, version, created)
        if method == "PUT":
            if not route.name:
                raise method_not_allowed()
            obj = self._body_object(route, body)
            name = (obj.get("metadata") or {}).get("name")
            if name != route.name:
                raise bad_request(
                    f"the name of the object ({name}) does not match the name on the URL ({route.name})"
                )
            updated = store.update(
                kind,
                ns,
                route.name,
                to_hub(kind, version, obj),
                subresource=route.subresource,
                dry_run=dry_run,
            )
            return 200, from_hub(kind, version, updated)
        if method == "PATCH":
            if not route.name:
                raise method_not_allowed()
            apply = self._patcher(kind, content_type)

            def change(current: Obj) -> Obj:
                return to_hub(kind, version, apply(from_hub(kind, version, current), body))

            return 200, from_hub(
                kind,
                version,
                store.mutate(kind, ns, route.name, change, subresource=route.subresource, dry_run=dry_run),
            )
        if method == "DELETE":
            options = _delete_options(query, body)
            if not route.name:
                if route.namespace is None and kind.namespaced:
                    raise method_not_allowed()
                items, _ = store.list(kind, route.namespace, self._matcher(route, query))
                deleted = []
                for item in items:
                    obj, _ = store.delete(kind, ns, item["metadata"]["name"], options, dry_run=dry_run)
                    deleted.append(from_hub(kind, version, obj))
                list_rv = str(store.resource_version)
                return 200, {
                    "kind": f"{kind.kind}List",
                    "apiVersion": kind.api_version(version),
                    "metadata": {"resourceVersion": list_rv},
                    "items": deleted,
                }
            obj, gone_now = store.delete(kind, ns, route.name, options, dry_run=dry_run)
            code = 200 if gone_now else 202
            if kind is NODES:
                details = {"name": route.name, "kind": kind.plural, "uid": obj["metadata"]["uid"]}
                return code, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            return code, from_hub(kind, version, obj)
        raise method_not_allowed()

    def _body_object(self, route: ResourceRoute, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        expected = route.kind.api_version(route.version)
        given = body.get("apiVersion")
        if given and given != expected:
            raise bad_request(
                f"the API version in the data ({given}) does not match the expected API version ({expected})"
            )
        if body.get("kind") and body["kind"] != route.kind.kind:
            raise bad_request(
                f"the kind in the data ({body['kind']}) does not match the expected kind ({route.kind.kind})"
            )
        return body

    def _patcher(self, kind: ResourceKind, content_type: str) -> Callable[[Obj, Any], Obj]:
        media = content_type.split(";")[0].strip()
        accepted = [MERGE_PATCH] if kind.custom else [MERGE_PATCH, STRATEGIC_MERGE_PATCH]
        if media == MERGE_PATCH:
            return merge_patch
        if media == STRATEGIC_MERGE_PATCH and not kind.custom:
            return strategic_merge_patch
        raise unsupported_media_type(media, accepted)


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")  # the Python client sends `True`


def _delete_options(query: Mapping[str, str], body: Any) -> DeleteOptions:
    body = body if isinstance(body, dict) else {}
    preconditions = body.get("preconditions") or {}
    return DeleteOptions(
        propagation_policy=query.get("propagationPolicy") or body.get("propagationPolicy") or "Background",
        precondition_uid=preconditions.get("uid"),
        precondition_resource_version=preconditions.get("resourceVersion"),
    )


def _handler(server: ApiServerSim) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streaming needs 1.1

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            try:
                body = self._read_body()
            except ValueError as err:
                server.requests.append((url.path, query))
                self._json(400, bad_request(f"the body of the request is not valid JSON: {err}").status())
                return
            server.requests.append((url.path, query))
            server.calls.append(ApiCall(method, url.path, query, body))
            fault = server.fault
            if fault is not None and fault.applies(url.path):
                time.sleep(fault.hang_s)
                if fault.status:
                    with contextlib.suppress(OSError):  # the client gave up waiting
                        self._json(fault.status, injected(fault.status).status())
                    return
            try:
                if method == "GET" and is_proxy_path(url.path):  # pods/proxy: pod_proxy.py
                    self._raw(*proxy_get(server.store, url.path, query))
                    return
                route = parse_path(url.path, server.kinds, server.served)
                if isinstance(route, DiscoveryRoute):
                    if method != "GET":
                        raise method_not_allowed()
                    self._json(200, server.discovery_body(route))
                elif method == "GET" and not route.name and _flag(query, "watch"):
                    server._matcher(route, query)  # a bad selector is a 400 before the stream starts
                    self._watch(route, query)
                else:
                    code, response = server.handle(
                        method, route, query, body, self.headers.get("Content-Type", "")
                    )
                    self._json(code, response)
            except ApiError as err:
                self._json(err.code, err.status())

        def _read_body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return None
            raw = self.rfile.read(length)
            return json.loads(raw) if raw.strip() else None

        def _json(self, code: int, body: Any) -> None:
            self._raw(code, "application/json", json.dumps(body).encode())

        def _raw(self, code: int, content_type: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def _watch(self, route: ResourceRoute, query: Mapping[str, str]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

            try:
                server.stream_watch(route, query, send)
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler
