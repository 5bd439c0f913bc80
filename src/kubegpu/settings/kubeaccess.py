"""Where the API server is and how to authenticate to it, from a kubeconfig or the pod's service account,
without the official `kubernetes` client (the DRA driver's light client builds its connections from this).

A kubeconfig is read as kubectl reads it: several files joined by ':' (KUBECONFIG) are merged, the first
file to name a cluster, user or context and the first to set `current-context` win; relative paths are
relative to the file that holds them; `*-data` fields are base64. The files are checked first as
`kubeconfig.read_kubeconfig` does (size and go-yaml's alias limits).

Authentication, as client-go does it: a bearer token (`token`, else `tokenFile`, which is read again every
minute so rotated tokens are picked up), client certificates, basic auth. Exec plugins and auth providers
run code on the node and are not supported, nor is a cluster's proxy-url: the error says so and names what
to use instead. In a pod (an
empty --kubeconfig): KUBERNETES_SERVICE_HOST/PORT, the service account's token (read again every minute: it
is a projected token that the kubelet rotates) and its CA.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.settings.kubeconfig import KubeconfigError, read_kubeconfig

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class ApiAccess:
    """One API server and one identity. Files are absolute paths; `*_data` the decoded contents."""

    server: str  # e.g. https://10.0.0.1:6443 (a path after the host is a prefix of every request)
    ca_file: str = ""
    ca_data: bytes = b""
    cert_file: str = ""
    cert_data: bytes = b""
    key_file: str = ""
    key_data: bytes = b""
    token: str = ""
    token_file: str = ""  # read again every minute (rotated tokens)
    username: str = ""
    password: str = ""
    insecure: bool = False  # insecure-skip-tls-verify
    tls_server_name: str = ""  # the name to verify the server's certificate against, when not its host
    source: str = ""  # where this came from, for errors: "kubeconfig PATH, context NAME" or "in-cluster"

    def __repr__(self) -> str:  # never the secrets
        return f"ApiAccess(server={self.server!r}, source={self.source!r})"


def load_access(
    kubeconfig: str,
    *,
    environ: Mapping[str, str] = os.environ,
    service_account: Path = SERVICE_ACCOUNT_DIR,
) -> ApiAccess:
    """The access the kubeconfig at `kubeconfig` (one path or several joined by ':') names in its current
    context, or the pod's in-cluster access when it is empty. KubeconfigError with the cause and the fix."""
    if not kubeconfig:
        return in_cluster_access(environ, service_account)
    return kubeconfig_access(kubeconfig)


def in_cluster_access(environ: Mapping[str, str], service_account: Path = SERVICE_ACCOUNT_DIR) -> ApiAccess:
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeconfigError(
            "not running in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
        )
    token, ca = service_account / "token", service_account / "ca.crt"
    for path, what in ((token, "service account token"), (ca, "service account CA certificate")):
        try:
            if not path.read_bytes().strip():
                raise KubeconfigError(f"the {what} {path} is empty")
        except OSError as err:
            raise KubeconfigError(f"cannot read the {what} {path}: {err.strerror or err}") from None
    if ":" in host or "%" in host:  # IPv6 (Go's net.JoinHostPort)
        host = f"[{host}]"
    return ApiAccess(
        server=f"https://{host}:{port}", ca_file=str(ca), token_file=str(token), source="in-cluster config"
    )


def kubeconfig_access(paths: str) -> ApiAccess:
    merged = _merge(paths)
    if merged is None:
        raise KubeconfigError(f"no kubeconfig found at {paths}")
    context_name = merged.current_context
    if not context_name:
        raise KubeconfigError(
            f"kubeconfig {paths} sets no current-context; set one (kubectl config use-context NAME)"
        )
    where = f"kubeconfig {paths}, context {context_name!r}"
    context = _named(merged.contexts, "context", context_name, where)
    cluster_name, user_name = str(context.value.get("cluster") or ""), str(context.value.get("user") or "")
    cluster = _named(merged.clusters, "cluster", cluster_name, where)
    server = str(cluster.value.get("server") or "").rstrip("/")
    if not server:
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} has no server")
    if cluster.value.get("proxy-url"):
        raise KubeconfigError(
            f"{where}: cluster {cluster_name!r} sets proxy-url, which the DRA driver does not support; "
            "reach the API server directly (the driver runs on the cluster's nodes)"
        )
    user = merged.users.get(user_name) if user_name else None
    user_fields: dict[str, Any] = {}
    if user is not None:
        user_fields = _user_fields(user, f"{where}, user {user_name!r}")
    return ApiAccess(
        server=server,
        ca_file=_file(cluster, "certificate-authority"),
        ca_data=_data(cluster, "certificate-authority-data", where),
        insecure=cluster.value.get("insecure-skip-tls-verify") is True,
        tls_server_name=str(cluster.value.get("tls-server-name") or ""),
        source=where,
        **user_fields,
    )


@dataclass(frozen=True, slots=True)
class _Entry:
    value: Mapping[str, Any]
    base: Path  # the directory of the file that holds it


@dataclass(slots=True)
class _Merged:
    current_context: str = ""
    clusters: dict[str, _Entry] = field(default_factory=dict)
    contexts: dict[str, _Entry] = field(default_factory=dict)
    users: dict[str, _Entry] = field(default_factory=dict)


def _merge(paths: str) -> _Merged | None:
    merged: _Merged | None = None
    for path in paths.split(os.pathsep):
        path = os.path.expanduser(path)
        if not path or not os.path.exists(path):
            continue
        config = read_kubeconfig(path)
        if not isinstance(config, dict):
            raise KubeconfigError(f"invalid kubeconfig {path}: not a mapping; fix or regenerate it")
        merged = merged or _Merged()
        merged.current_context = merged.current_context or str(config.get("current-context") or "")
        base = Path(path).resolve().parent
        for key, into in (
            ("clusters", merged.clusters),
            ("contexts", merged.contexts),
            ("users", merged.users),
        ):
            kind = key[:-1]  # each entry is {name: ..., cluster|context|user: {...}}
            for item in config.get(key) or []:
                name = item.get("name") if isinstance(item, dict) else None
                body = item.get(kind) if isinstance(item, dict) else None
                if not isinstance(name, str) or not isinstance(body, dict):
                    raise KubeconfigError(
                        f"invalid kubeconfig {path}: every entry of {key} needs a name and a {kind} mapping"
                    )
                into.setdefault(name, _Entry(body, base))
    return merged


def _named(entries: dict[str, _Entry], kind: str, name: str, where: str) -> _Entry:
    entry = entries.get(name) if name else None
    if entry is None:
        raise KubeconfigError(f"{where}: no {kind} named {name!r}; fix the context or the kubeconfig")
    return entry


def _user_fields(user: _Entry, where: str) -> dict[str, Any]:
    for unsupported in ("exec", "auth-provider"):
        if user.value.get(unsupported):
            raise KubeconfigError(
                f"{where} authenticates with {unsupported}, which the DRA driver does not run (it would run "
                "a program on every node); give the user a token, tokenFile or client certificate, or run "
                "the driver in a pod with its service account (no --kubeconfig)"
            )
    return {
        "token": str(user.value.get("token") or ""),
        "token_file": _file(user, "tokenFile"),
        "cert_file": _file(user, "client-certificate"),
        "cert_data": _data(user, "client-certificate-data", where),
        "key_file": _file(user, "client-key"),
        "key_data": _data(user, "client-key-data", where),
        "username": str(user.value.get("username") or ""),
        "password": str(user.value.get("password") or ""),
    }


def _file(entry: _Entry, key: str) -> str:
    value = entry.value.get(key)
    if not value:
        return ""
    return str(entry.base / os.path.expanduser(str(value)))  # an absolute path stays as it is


def _data(entry: _Entry, key: str, where: str) -> bytes:
    value = entry.value.get(key)
    if not value:
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"{where}: {key} is not valid base64; fix or regenerate it") from None
