"""The live cluster as a Snapshot, read through the official `kubernetes` client.

A thin adapter: it pages through the same four lists `kubectl get nodes,pods,daemonsets,runtimeclasses
-A -o json` prints (and DRA's ResourceSlices, DeviceClasses, ResourceClaims and templates, from the newest
resource.k8s.io version the server serves), asks the client for the raw JSON (`_preload_content=False`)
and decodes it with the same msgspec types as a snapshot file, so live and file mode cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from kubegpu.settings.kubeconfig import KubeconfigError, check_kubeconfig
from kubegpu.toolkit.model import ListMeta
from kubegpu.toolkit.snapshot import Snapshot, decode_items

PAGE_SIZE = 500


class LiveError(RuntimeError):
    """The live cluster could not be read; the message names the cause and the way out."""


class _NotServed(Exception):
    """The API server does not serve this version of the resource (404)."""


# DRA's kinds and the calls that list them cluster-wide, on ResourceV1Api and its beta twins.
DRA_LISTS = (
    ("ResourceSlice", "list_resource_slice"),
    ("DeviceClass", "list_device_class"),
    ("ResourceClaim", "list_resource_claim_for_all_namespaces"),
    ("ResourceClaimTemplate", "list_resource_claim_template_for_all_namespaces"),
)


class _Page(msgspec.Struct):
    items: list[msgspec.Raw] | None = None
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


class LiveSource:
    """Lists cluster objects through kubernetes-client API objects (or test doubles with the same methods)."""

    def __init__(
        self,
        core: Any,
        apps: Any,
        node: Any,
        page_size: int = PAGE_SIZE,
        keep: Iterable[tuple[str, str]] = (),
        resource: Iterable[tuple[str, Any]] = (),
    ) -> None:
        """`resource`: (apiVersion, ResourceV1Api-like) pairs, newest first, for the DRA objects."""
        self.core, self.apps, self.node, self.page_size = core, apps, node, page_size
        self.keep = set(keep)
        self.resource = list(resource)

    def _list(self, call: Callable[..., Any], what: str, versioned: bool = False) -> list[msgspec.Raw]:
        decoder = msgspec.json.Decoder(_Page)
        out: list[msgspec.Raw] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            try:
                response = call(**kwargs)
            except Exception as exc:  # the client raises ApiException, urllib3 and socket errors
                if versioned and getattr(exc, "status", None) == 404:
                    raise _NotServed(what) from exc
                raise LiveError(_explain_failure(exc, what)) from exc
            try:
                page = decoder.decode(response.data)
            except msgspec.DecodeError as exc:
                raise LiveError(f"the API server sent something that is not a {what} list: {exc}") from exc
            out.extend(page.items or [])
            token = page.metadata.continue_
            if not token:
                return out

    def snapshot(self) -> Snapshot:
        snap = Snapshot(source="live cluster")
        # Same decoding as a snapshot file: typed-list items carry no kind, so it is given.
        decode_items(self._list(self.core.list_node, "node"), "Node", snap)
        decode_items(self._list(self.core.list_pod_for_all_namespaces, "pod"), "Pod", snap, self.keep)
        decode_items(self._list(self.apps.list_daemon_set_for_all_namespaces, "daemonset"), "DaemonSet", snap)
        try:
            runtime_classes = self._list(self.node.list_runtime_class, "runtimeclass")
        except LiveError:
            runtime_classes = []  # optional: RBAC often omits it, and the checks degrade gracefully
        decode_items(runtime_classes, "RuntimeClass", snap)
        self.dra_into(snap)
        return snap

    def dra_into(self, snap: Snapshot) -> None:
        """The DRA objects, from the newest resource.k8s.io version served; a kind the server does not
        serve, or RBAC does not let us list, stays unlisted (explain and lint say what is missing)."""
        for kind, method in DRA_LISTS:
            for version, api in self.resource:
                try:
                    items = self._list(getattr(api, method), kind.lower(), versioned=True)
                except _NotServed:
                    continue
                except LiveError:
                    break
                snap.dra[kind] = []
                decode_items(items, kind, snap)
                for obj in snap.dra[kind]:  # typed-list items carry no apiVersion; the shape depends on it
                    obj.setdefault("apiVersion", version)
                break


def _explain_failure(exc: Exception, what: str) -> str:
    status = getattr(exc, "status", None)
    if status in (401, 403):
        reason = "not authenticated" if status == 401 else "forbidden"
        return (
            f"cannot list {what}s: {reason} ({status}); the kubeconfig's user needs get/list on nodes, pods, "
            "daemonsets and runtimeclasses cluster-wide, or use --snapshot FILE"
        )
    if status is not None:
        return f"cannot list {what}s: the API server answered {status} {getattr(exc, 'reason', '')}".rstrip()
    return (
        f"cannot reach the API server to list {what}s ({type(exc).__name__}: {exc}); check the kubeconfig's "
        "server and your network, or use --snapshot FILE"
    )


@dataclass(frozen=True)
class KubeTarget:
    """Which cluster to read, as kubectl's flags say: a kubeconfig file (else $KUBECONFIG, else
    ~/.kube/config) and a context in it (else its current-context)."""

    kubeconfig: str | None = None
    context: str | None = None

    @property
    def explicit(self) -> bool:
        return self.kubeconfig is not None or self.context is not None


CURRENT = KubeTarget()  # the kubeconfig's current context, as kubectl reads it without flags


def _kube_config(kubeconfig: str | None = None) -> Any:
    try:
        from kubernetes import config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LiveError(
            "live mode needs the `kubernetes` package (pip install kubernetes), or use --snapshot FILE"
        ) from exc
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

    try:
        # $KUBECONFIG or ~/.kube/config, as the client reads it: bounded, before the client parses it whole
        check_kubeconfig(kubeconfig or KUBE_CONFIG_DEFAULT_LOCATION)
    except KubeconfigError as exc:
        raise LiveError(f"{exc}; or use --snapshot FILE") from exc
    return config


def current_namespace(target: KubeTarget = CURRENT) -> str:
    """The namespace of the target context (kubectl's default for -n); "default" when it names none."""
    config = _kube_config(target.kubeconfig)
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, active = config.list_kube_config_contexts(config_file=target.kubeconfig)
    except (ConfigException, OSError):
        return "default"  # in a pod, or no kubeconfig: load_live says what is wrong if it matters
    chosen = active
    if target.context is not None:
        chosen = next((c for c in contexts if c.get("name") == target.context), None)
        if chosen is None:
            raise LiveError(_no_context(target.context, contexts))
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _no_context(name: str, contexts: list[dict[str, Any]]) -> str:
    names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
    return (
        f"context {name!r} is not in the kubeconfig (contexts: {names}); `kubectl config get-contexts` "
        "lists them"
    )


def load_live(keep: Iterable[tuple[str, str]] = (), target: KubeTarget = CURRENT) -> Snapshot:
    """The cluster of the target kubeconfig context (or, with no kubeconfig and no flags naming one, the
    in-cluster config inside a pod)."""
    from kubernetes import client

    api = api_client(target)
    resource = [
        ("resource.k8s.io/v1", client.ResourceV1Api(api)),
        ("resource.k8s.io/v1beta2", client.ResourceV1beta2Api(api)),
        ("resource.k8s.io/v1beta1", client.ResourceV1beta1Api(api)),
    ]
    return LiveSource(
        client.CoreV1Api(api), client.AppsV1Api(api), client.NodeV1Api(api), keep=keep, resource=resource
    ).snapshot()


def api_client(target: KubeTarget = CURRENT) -> Any:
    """A `kubernetes.client.ApiClient` for the target kubeconfig context (else the in-cluster config);
    LiveError naming the cause when there is none."""
    config = _kube_config(target.kubeconfig)
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException

    if target.context is not None:
        current_namespace(target)  # says which contexts there are when the named one is not
    try:
        config.load_kube_config(config_file=target.kubeconfig, context=target.context)
    except (ConfigException, OSError) as kube_exc:
        if target.explicit:  # a kubeconfig or context the user named must be the one read
            where = f"kubeconfig {target.kubeconfig}" if target.kubeconfig else "the kubeconfig"
            raise LiveError(f"cannot use {where}: {kube_exc}") from kube_exc
        try:
            config.load_incluster_config()
        except ConfigException:
            raise LiveError(
                f"no usable kubeconfig ({kube_exc}); set KUBECONFIG or use --snapshot FILE"
            ) from kube_exc
    return client.ApiClient()
