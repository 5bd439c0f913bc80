"""A Kubernetes API server for tests and the demo, on 127.0.0.1 over plain HTTP, as the real one speaks.

    api = ApiServerSim(resource_versions=("v1", "v1beta1"))   # what a 1.34 cluster serves of DRA
    api.start()
    api.add_node("node-a", {"gpu": "true"})
    config = kubernetes.client.Configuration(host=api.url)      # or api.write_kubeconfig(path)
    kubernetes.client.ResourceV1Api(kubernetes.client.ApiClient(config)).list_resource_slice(...)

It serves core Nodes and Pods (with /status), resource.k8s.io ResourceSlices, ResourceClaims (with /status),
ResourceClaimTemplates and DeviceClasses in every configured version (stored once, converted per request:
convert.py), and NFD's NodeFeature custom resource. This module is the server's lifecycle, its Python API
for tests and its request log; the HTTP handling is in http_handler.py, the verbs (GET, LIST, CREATE,
UPDATE, PATCH, DELETE, `dryRun=All`) in verbs.py, WATCH in watch.py, discovery in discovery.py, the
validation in validation.py, errors as `Status` bodies with the real texts in errors.py.

Not modelled: authentication and authorization (any token is accepted), namespaces as objects (any
namespace exists), admission (no ValidatingAdmissionPolicy, no ResourceQuota), JSON patch and server-side
apply (415), pagination (`limit` is ignored, which the real server may also do), protobuf and CBOR,
aggregated discovery, managedFields, the resourceclaim and garbage-collector controllers' delays (the
collector runs synchronously at the owner's deletion), pod validation, defaulting and graceful deletion, and
feature gates other than DRADeviceTaints (when off, device taints are dropped on write, as a 1.34 server
with the gate off drops them; a 1.32 server, which has no taints field, drops them too).

A stopped server is really unreachable (every response closes its connection). Requests are recorded for
assertions. A server in trouble is one attribute away: `api.fault = Fault(status=500)` (or 429, or
`hang_s=30` to hold requests unanswered), optionally only for paths containing a string; `api.stop()`
refuses connections.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubegpu.resourceapi.cel import compile_error

from .calls import ApiCall, Fault, flag
from .convert import to_hub
from .discovery import api_group, api_group_list, api_resource_list, api_versions, version_info
from .errors import ApiError
from .http_handler import handler_class
from .kinds import (
    ALL_KINDS,
    APPS_GROUP,
    NODES,
    RESOURCE_GROUP,
    RESOURCE_SLICES,
    RESOURCE_VERSIONS,
    ResourceKind,
    field_value,
    find_kind,
)
from .partitionable import drop_disabled_sharing_fields
from .patch import merge_patch
from .routes import DiscoveryRoute, ResourceRoute, parse_path
from .selectors import matcher
from .store import DeleteOptions, Obj, Store

__all__ = ["ApiCall", "ApiServerSim", "Fault"]  # ApiCall and Fault live in calls.py; imported from here too

DEFAULT_WATCH_TIMEOUT = 30.0  # the real server picks 30-60 min; shorter here so watchers re-list often


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
        self.served: dict[str, tuple[str, ...]] = {
            "": ("v1",),
            APPS_GROUP: ("v1",),
            RESOURCE_GROUP: tuple(resource_versions),
        }
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
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler_class(self))
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
        return [c.query for c in self._reads(resource) if not flag(c.query, "watch")]

    def watches(self, resource: str = "nodes") -> builtins.list[Mapping[str, str]]:
        return [c.query for c in self._reads(resource) if flag(c.query, "watch")]

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
