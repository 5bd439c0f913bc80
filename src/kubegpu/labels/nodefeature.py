"""The labels as this node's NodeFeature object (nfd.k8s-sigs.io/v1alpha1): GFD's default output since v0.19.

As GFD (k8s-device-plugin v0.20, `--use-node-feature-api`): the object is `nvidia-features-for-<node>` in
`--namespace`, labelled `nfd.node.kubernetes.io/node-name=<node>` (which tells nfd-master the node), with
`spec.labels` the labels and `spec.features` empty. Each pass reads it and writes it only when it differs
(labels, the node-name label, the spec or the owner references): created when missing, replaced
otherwise. With `--pod-name`, the object is owned by the pod's DaemonSet (as controller) and by the pod, so
Kubernetes' garbage collector deletes it with the DaemonSet; nfd-gc deletes it when the node goes. On exit
the object stays, as GFD leaves it: the labels remain while the labeller restarts or is updated.

Better than GFD on purpose: GFD exits on any API error; here a failure that may pass by itself (the API
server unreachable or restarting, 429, 5xx, a write conflict) is a transient OutputError that the loop
retries with back-off, and a setup problem (NFD's CRD missing, no permission, an invalid object) is a fatal
one whose one-line message says the cause and the fix. GFD resolves the owner references once per config
load and warns when it cannot; here that happens with the first write that reaches the API server, so an
API server that was down at start-up still gets them.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubegpu.labels.kubeapi import (
    REQUEST_TIMEOUT,
    ConnectError,
    RateLimiter,
    connect,
    describe_failure,
    host_of,
    status_details,
)
from kubegpu.labels.output import OutputError
from kubegpu.labels.settings import ApiSettings

log = logging.getLogger(__name__)

GROUP = "nfd.k8s-sigs.io"
VERSION = "v1alpha1"
PLURAL = "nodefeatures"
KIND = "NodeFeature"
NAME_PREFIX = "nvidia-features-for"  # GFD's
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"  # NFD's NodeFeatureObjNodeNameLabel

# The API server's answers that no retry fixes: the labeller exits with the cause and the fix.
_UNAUTHORIZED, _FORBIDDEN, _NOT_FOUND, _CONFLICT, _TOO_MANY = 401, 403, 404, 409, 429
_FIX_OUTPUT = (
    "or set --use-node-feature-api=false (USE_NODE_FEATURE_API=false) to write NFD's features.d file"
)


def object_name(node_name: str) -> str:
    return f"{NAME_PREFIX}-{node_name}"


def node_feature_spec(labels: Mapping[str, str]) -> dict[str, Any]:
    """GFD's spec: the labels, and NFD's empty feature sets (NewFeatures())."""
    return {"features": {"flags": {}, "attributes": {}, "instances": {}}, "labels": dict(labels)}


def owner_references(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """GFD's owners for the object: the pod's DaemonSet as controller, then the pod; [] when no DaemonSet
    owns the pod (run by hand, or by another controller)."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet":
            return [
                {
                    "apiVersion": ref.get("apiVersion"),
                    "kind": "DaemonSet",
                    "name": ref.get("name"),
                    "uid": ref.get("uid"),
                    "controller": True,
                },
                {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")},
            ]
    return []


def _empty_as_none(value: Any) -> Any:
    """Go's semantic equality treats a nil and an empty map or slice alike; so do we."""
    if isinstance(value, dict):
        return {k: _empty_as_none(v) for k, v in value.items() if _empty_as_none(v) is not None} or None
    if isinstance(value, list):
        return [_empty_as_none(v) for v in value] or None
    return value


def same_content(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether `current` (as read) already has what `wanted` writes: the labels, spec and owners."""
    cur_meta, want_meta = current.get("metadata") or {}, wanted.get("metadata") or {}
    return all(
        _empty_as_none(a) == _empty_as_none(b)
        for a, b in (
            (cur_meta.get("labels"), want_meta.get("labels")),
            (cur_meta.get("ownerReferences"), want_meta.get("ownerReferences")),
            (current.get("spec"), wanted.get("spec")),
        )
    )


@dataclass
class NodeFeatureOutput:
    """Writes the labels to the node's NodeFeature object (a LabelOutput)."""

    custom: Any  # kubernetes.client.CustomObjectsApi
    core: Any  # kubernetes.client.CoreV1Api, to read the pod's owners
    settings: ApiSettings
    host: str = ""  # for messages: which API server
    limiter: RateLimiter | None = None
    _owners: list[dict[str, Any]] | None = field(default=None, init=False)  # None: not resolved yet

    @property
    def name(self) -> str:
        return object_name(self.settings.node_name)

    @property
    def where(self) -> str:
        return f"NodeFeature {self.settings.namespace}/{self.name}"

    def write(self, labels: Mapping[str, str]) -> None:
        """Create or update the object so that it holds these labels; no write when it already does."""
        try:
            self._publish(labels)
        except ApiException as err:
            raise self._api_error(err) from err
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            # ValueError: a garbled answer (a proxy, a dying connection): retrying is all we can do.
            raise OutputError(
                f"cannot publish the labels to {self.where}: the API server at {self.host} did not answer "
                f"({describe_failure(err)}); check that it is up and reachable from this node",
                transient=True,
            ) from err

    def remove(self) -> None:
        """Nothing: the object outlives the labeller, as with GFD (owners and nfd-gc delete it)."""

    # ---- the requests ---------------------------------------------------------------------------------

    def _publish(self, labels: Mapping[str, str]) -> None:
        owners = self._resolve_owners()
        meta_labels = {NODE_NAME_LABEL: self.settings.node_name}
        spec = node_feature_spec(labels)
        wanted: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.settings.namespace,
                "labels": meta_labels,
                **({"ownerReferences": owners} if owners else {}),
            },
            "spec": spec,
        }
        current = self._get()
        if current is None:
            self._call(
                self.custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                self.settings.namespace,
                PLURAL,
                wanted,
            )
            log.info("Created %s with %d labels", self.where, len(labels))
            return
        if same_content(current, wanted):
            log.info("No changes in %s (%d labels)", self.where, len(labels))
            return
        # Replace what GFD owns, keep the rest (resourceVersion: a concurrent writer gets a 409, retried).
        updated = copy.deepcopy(current)
        updated["metadata"]["labels"] = meta_labels
        updated["metadata"]["ownerReferences"] = owners or None
        updated["spec"] = spec
        self._call(
            self.custom.replace_namespaced_custom_object,
            GROUP,
            VERSION,
            self.settings.namespace,
            PLURAL,
            self.name,
            updated,
        )
        log.info("Updated %s: %d labels", self.where, len(labels))

    def _get(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call(
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.settings.namespace,
                PLURAL,
                self.name,
            )
        except ApiException as err:
            if err.status == _NOT_FOUND and status_details(err).get("name") == self.name:
                return None  # the object is missing (a missing CRD answers 404 without naming it)
            raise
        return found

    def _resolve_owners(self) -> list[dict[str, Any]]:
        """The owner references, read from the pod once; [] (with a warning) when the pod cannot be read."""
        if self._owners is not None:
            return self._owners
        if not self.settings.pod_name:
            log.info("No pod name (--pod-name, POD_NAME): the NodeFeature object gets no owner references")
            self._owners = []
            return self._owners
        try:
            pod = self._call(self.core.read_namespaced_pod, self.settings.pod_name, self.settings.namespace)
        except ApiException as err:
            if err.status is not None and (err.status >= 500 or err.status == _TOO_MANY):
                raise  # transient: resolved with the next attempt
            log.warning(
                "Failed to resolve owner references: failed to get pod %s/%s: %s; the NodeFeature object "
                "gets none, so it is not deleted with the DaemonSet (the service account needs get on pods)",
                self.settings.namespace,
                self.settings.pod_name,
                describe_failure(err),
            )
            self._owners = []
            return self._owners
        self._owners = owner_references(self.core.api_client.sanitize_for_serialization(pod))
        if not self._owners:
            log.info(
                "Pod %s is not owned by a DaemonSet: the NodeFeature object gets no owner references",
                self.settings.pod_name,
            )
        return self._owners

    def _call(self, method: Any, *args: Any) -> Any:
        if self.limiter is not None:
            self.limiter.acquire()
        return method(*args, _request_timeout=REQUEST_TIMEOUT)

    # ---- errors ---------------------------------------------------------------------------------------

    def _api_error(self, err: ApiException) -> OutputError:
        cause = describe_failure(err)
        prefix = f"cannot publish the labels to {self.where}"
        status = err.status or 0
        details = status_details(err)
        if status == _NOT_FOUND and details.get("name") == self.name:
            # deleted between our read and our write: the next attempt creates it
            return OutputError(f"{prefix}: it was deleted meanwhile ({cause})", transient=True)
        if status == _NOT_FOUND and details.get("kind") == "namespaces":
            return OutputError(
                f"{prefix}: namespace {self.settings.namespace} does not exist ({cause}); set --namespace "
                "(NAMESPACE) to an existing one, e.g. the pod's own (the downward API's metadata.namespace)",
                fatal=True,
            )
        if status == _NOT_FOUND:
            return OutputError(
                f"{prefix}: the API server at {self.host} does not serve {PLURAL}.{GROUP}/{VERSION} "
                f"({cause}): NFD's NodeFeature CRD is not installed; install Node Feature Discovery v0.14 "
                f"or later (its CRDs), {_FIX_OUTPUT}",
                fatal=True,
            )
        if status == _UNAUTHORIZED:
            return OutputError(
                f"{prefix}: the API server at {self.host} refused the credentials ({cause}); check the "
                "service account token or the kubeconfig's user",
                fatal=True,
            )
        if status == _FORBIDDEN:
            return OutputError(
                f"{prefix}: forbidden ({cause}); grant the service account get, create and update on "
                f"{PLURAL}.{GROUP} in namespace {self.settings.namespace} (the chart's labels Role does), "
                f"{_FIX_OUTPUT}",
                fatal=True,
            )
        if status in (_CONFLICT, _TOO_MANY) or status >= 500:
            return OutputError(f"{prefix}: the API server answered {cause}", transient=True)
        return OutputError(f"{prefix}: the API server refused it ({cause})", fatal=True)


def open_node_feature_output(settings: ApiSettings) -> NodeFeatureOutput:
    """GFD's NewOutputer for the NodeFeature API: builds the client, then checks the node and namespace
    (GFD's order: its clientsets are created before the outputer checks its flags).

    Raises a fatal OutputError with GFD's text, then the fix.
    """
    try:
        api_client = connect(settings.kubeconfig)
    except ConnectError as err:
        raise OutputError(
            f"failed to create clientsets: create client configuration: {err}; run in a pod with a service "
            f"account token, or set --kubeconfig (KUBECONFIG), {_FIX_OUTPUT}",
            fatal=True,
        ) from err
    if not settings.node_name:
        raise OutputError(
            "failed to create label outputer: required flag node-name not set; set NODE_NAME from the "
            f"downward API (spec.nodeName) or --node-name, {_FIX_OUTPUT}",
            fatal=True,
        )
    if not settings.namespace:
        raise OutputError(
            "failed to create label outputer: required flag namespace not set; set NAMESPACE from the "
            f"downward API (metadata.namespace) or --namespace, {_FIX_OUTPUT}",
            fatal=True,
        )
    return NodeFeatureOutput(
        client.CustomObjectsApi(api_client),
        client.CoreV1Api(api_client),
        settings,
        host=host_of(api_client),
        limiter=RateLimiter(settings.qps, settings.burst),
    )
