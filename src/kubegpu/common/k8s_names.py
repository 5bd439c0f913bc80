"""Kubernetes' rule for extended resource names, the one copy the simulator, lint and explain share.

A transcription of the kube-apiserver's `IsExtendedResourceName` (k8s.io/kubernetes pkg/apis/core/helper,
the same rule as `v1helper.IsExtendedResourceName` that the kubelet applies to device-plugin registration)
and the apimachinery validators it uses (`IsQualifiedName`, `IsDNS1123Subdomain`). Python's `re.fullmatch`
is used because Go's `$` never matches before a trailing newline while Python's `$` does.
"""

from __future__ import annotations

import functools
import re

_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."

_QUALIFIED_NAME_MAX_LENGTH = 63
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

_DNS1123_SUBDOMAIN_MAX_LENGTH = 253
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_LABEL + r"(\." + _DNS1123_LABEL + r")*")


def is_dns1123_subdomain(value: str) -> bool:
    """Lower-case dot-separated labels, each starting and ending alphanumeric, at most 253 bytes."""
    return len(value.encode()) <= _DNS1123_SUBDOMAIN_MAX_LENGTH and bool(_DNS1123_SUBDOMAIN.fullmatch(value))


def is_qualified_name(value: str) -> bool:
    """`[prefix/]name`: prefix a DNS-1123 subdomain, name 1-63 chars of [A-Za-z0-9_.-], alphanumeric ends."""
    parts = value.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns1123_subdomain(prefix):
            return False
    else:
        name = parts[0]
    # Go measures bytes; a non-ASCII name fails the pattern anyway.
    return 0 < len(name.encode()) <= _QUALIFIED_NAME_MAX_LENGTH and bool(_QUALIFIED_NAME.fullmatch(name))


def is_native_resource_name(name: str) -> bool:
    """Unprefixed names (cpu, memory) and anything under kubernetes.io/ belong to Kubernetes itself."""
    return "/" not in name or _DEFAULT_NAMESPACE_PREFIX in name


@functools.lru_cache(maxsize=4096)  # a pure rule over names that repeat: lint asks it for every container
def is_extended_resource_name(name: str) -> bool:
    """True iff `name` is an extended resource: the kubelet accepts it as a device-plugin resource name
    (spec §3) and the API server takes it in a container's requests and limits."""
    if is_native_resource_name(name) or name.startswith(_REQUESTS_PREFIX):
        return False
    # The name must stay valid once turned into a quota name ("requests.<name>").
    return is_qualified_name(_REQUESTS_PREFIX + name)
