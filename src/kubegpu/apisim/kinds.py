"""The resources the simulated API server serves, described the way discovery describes them.

Each `ResourceKind` is one REST resource: its group, the versions it exists in, plural/singular/kind names,
scope, whether it has a /status subresource, and the field labels a fieldSelector may use (besides
metadata.name, and metadata.namespace for namespaced kinds, which every resource supports).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RESOURCE_GROUP = "resource.k8s.io"
NFD_GROUP = "nfd.k8s-sigs.io"
APPS_GROUP = "apps"

# resource.k8s.io versions, newest first: v1 (1.34+), v1beta2 (1.33+), v1beta1 (1.32+). v1 and v1beta2 share
# one shape; v1beta1 wraps device fields in `basic:` and puts request fields inline (convert.py).
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")

_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, slots=True)
class ResourceKind:
    group: str  # "" for the core group
    versions: tuple[str, ...]  # every version the kind exists in, preferred first
    plural: str
    singular: str
    kind: str
    namespaced: bool
    status: bool = False  # has the /status subresource (the main resource then ignores status)
    field_labels: tuple[str, ...] = ()  # fieldSelector labels beyond metadata.name/namespace
    custom: bool = False  # a CustomResourceDefinition: list items keep kind/apiVersion, no strategic merge
    short_names: tuple[str, ...] = ()
    has_generation: bool = True  # metadata.generation counts spec changes

    @property
    def qualified(self) -> tuple[str, str]:
        """(group, plural): what errors name, e.g. resourceslices.resource.k8s.io."""
        return self.group, self.plural

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def supported_field_labels(self) -> tuple[str, ...]:
        base = ("metadata.name", "metadata.namespace") if self.namespaced else ("metadata.name",)
        return base + self.field_labels

    def discovery_entries(self) -> list[dict[str, Any]]:
        entry = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(_VERBS),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        entries = [entry]
        if self.status:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def field_value(obj: Mapping[str, Any], label: str) -> str:
    """A field label's value as the server's field-set has it: strings as they are, absent as ""."""
    value: Any = obj
    for part in label.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


NODES = ResourceKind(
    "",
    ("v1",),
    "nodes",
    "node",
    "Node",
    namespaced=False,
    status=True,
    field_labels=("spec.unschedulable",),
    short_names=("no",),
    has_generation=False,
)
# Pods: the status the kubelet writes (allocatedResourcesStatus), what tools read of them (the GPU pods, the
# plugin pods behind the pod proxy in pod_proxy.py); no pod validation or defaulting, nothing runs them.
PODS = ResourceKind(
    "",
    ("v1",),
    "pods",
    "pod",
    "Pod",
    namespaced=True,
    status=True,
    field_labels=("spec.nodeName", "status.phase"),
    short_names=("po",),
    has_generation=False,
)
RESOURCE_SLICES = ResourceKind(
    RESOURCE_GROUP,
    RESOURCE_VERSIONS,
    "resourceslices",
    "resourceslice",
    "ResourceSlice",
    namespaced=False,
    field_labels=("spec.nodeName", "spec.driver"),
)
RESOURCE_CLAIMS = ResourceKind(
    RESOURCE_GROUP,
    RESOURCE_VERSIONS,
    "resourceclaims",
    "resourceclaim",
    "ResourceClaim",
    namespaced=True,
    status=True,
)
RESOURCE_CLAIM_TEMPLATES = ResourceKind(
    RESOURCE_GROUP,
    RESOURCE_VERSIONS,
    "resourceclaimtemplates",
    "resourceclaimtemplate",
    "ResourceClaimTemplate",
    namespaced=True,
)
DEVICE_CLASSES = ResourceKind(
    RESOURCE_GROUP, RESOURCE_VERSIONS, "deviceclasses", "deviceclass", "DeviceClass", namespaced=False
)
# Node Feature Discovery's CRD: where a later issue publishes GPU Feature Discovery's labels.
NODE_FEATURES = ResourceKind(
    NFD_GROUP, ("v1alpha1",), "nodefeatures", "nodefeature", "NodeFeature", namespaced=True, custom=True
)

# apps/v1 Deployments: what the DRA driver runs its MPS control daemons as (MPSSupport). Stored and validated
# as the real server does for the fields it checks; nothing here runs them (demo/deployment_runner.py plays
# the controllers and the kubelet for a simulated node).
DEPLOYMENTS = ResourceKind(
    APPS_GROUP,
    ("v1",),
    "deployments",
    "deployment",
    "Deployment",
    namespaced=True,
    status=True,
    short_names=("deploy",),
)

ALL_KINDS = (
    NODES,
    PODS,
    DEPLOYMENTS,
    RESOURCE_SLICES,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    DEVICE_CLASSES,
    NODE_FEATURES,
)


def find_kind(name: str, kinds: Iterable[ResourceKind] = ALL_KINDS) -> ResourceKind:
    """A kind by plural, `plural.group`, or Kind name (e.g. "resourceslices", "ResourceSlice")."""
    for kind in kinds:
        if name in (kind.plural, kind.kind, f"{kind.plural}.{kind.group}", kind.singular):
            return kind
    known = ", ".join(k.plural for k in kinds)
    raise KeyError(f"the simulated API server has no resource {name!r}; it serves {known}")
