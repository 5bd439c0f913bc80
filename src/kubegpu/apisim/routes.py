"""URL paths of the Kubernetes REST API, parsed into what a request addresses.

/api/v1/nodes[/<name>[/status]]
/apis/<group>/<version>/<plural>[/<name>[/status]]                       cluster-scoped
/apis/<group>/<version>/namespaces/<ns>/<plural>[/<name>[/status]]       namespaced
/apis/<group>/<version>/<plural>                                          namespaced, all namespaces
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import path_not_found
from .kinds import ResourceKind


@dataclass(frozen=True, slots=True)
class ResourceRoute:
    kind: ResourceKind
    version: str
    namespace: str | None  # None: a namespaced kind across all namespaces (list/watch only)
    name: str = ""
    subresource: str = ""

    @property
    def scope_namespace(self) -> str:
        return self.namespace or ""


@dataclass(frozen=True, slots=True)
class DiscoveryRoute:
    what: str  # api, api-version, apis, group, group-version, version
    group: str = ""
    version: str = ""


def parse_path(
    path: str, kinds: Sequence[ResourceKind], served: Mapping[str, Sequence[str]]
) -> ResourceRoute | DiscoveryRoute:
    """What `path` addresses; ApiError 404 for anything the server does not serve."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return DiscoveryRoute("version")
    if parts == ["api"]:
        return DiscoveryRoute("api")
    if parts == ["apis"]:
        return DiscoveryRoute("apis")
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 2:
        group = parts[1]
        if len(parts) == 2:
            if served.get(group):
                return DiscoveryRoute("group", group)
            raise path_not_found()
        version, rest = parts[2], parts[3:]
    else:
        raise path_not_found()
    if version not in served.get(group, ()):
        raise path_not_found()
    if not rest:
        return DiscoveryRoute("group-version", group, version)
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural, name, subresource = (
        rest[0],
        (rest[1] if len(rest) > 1 else ""),
        (rest[2] if len(rest) > 2 else ""),
    )
    if len(rest) > 3:
        raise path_not_found()
    for kind in kinds:
        if kind.group == group and kind.plural == plural and version in kind.versions:
            break
    else:
        raise path_not_found()
    if kind.namespaced == (namespace is None) and (name or not kind.namespaced):
        raise path_not_found()  # a cluster-scoped kind under namespaces/, or a named namespaced one without
    if subresource and not (subresource == "status" and kind.status):
        raise path_not_found()
    return ResourceRoute(kind, version, namespace, name, subresource)
