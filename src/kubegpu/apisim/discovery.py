"""Discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`, `/version`)
as the kube-apiserver serves them in the legacy (non-aggregated) JSON form the official client reads.

A client learns from them which versions of resource.k8s.io the cluster serves: a 1.32 cluster (with DRA
turned on) lists only v1beta1, 1.33 adds v1beta2, 1.34 adds v1 and prefers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .kinds import ResourceKind


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(name: str, versions: Sequence[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(served: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    groups = [_group(name, versions) for name, versions in served.items() if name and versions]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(name: str, versions: Sequence[str]) -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def api_resource_list(group_version: str, kinds: Sequence[ResourceKind]) -> dict[str, Any]:
    resources = [entry for kind in kinds for entry in kind.discovery_entries()]
    body: dict[str, Any] = {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
    if "/" in group_version:
        body["apiVersion"] = "v1"
    return body


def version_info(kubernetes_version: str) -> dict[str, str]:
    major, minor, *_ = kubernetes_version.split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{kubernetes_version}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
