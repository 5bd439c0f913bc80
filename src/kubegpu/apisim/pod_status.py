"""The pod status fields the API server checks that this project's simulators write: the
extended-resource bridge's `status.extendedResourceClaimStatus` (KEP-5004), which the scheduler writes
and the kubelet reads to know which claim and request serve which container's extended resource.

The rules and texts are `validatePodExtendedResourceClaimStatus` (pkg/apis/core/validation, read through a
transcription of it, not the Go file itself): at least one mapping; each names a container of the pod and a
resource that container requests (a limit without a request is its request, as defaulting makes it), a
DNS-label request name, no mapping twice; the claim name is required and a DNS subdomain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubegpu.common.k8s_names import is_dns1123_subdomain
from kubegpu.resourceapi.extended import container_requests

from .errors import FieldError
from .names import DNS_LABEL, DNS_LABEL_MSG, DNS_SUBDOMAIN_MSG

FIELD = "status.extendedResourceClaimStatus"
NO_CONTAINER = "must match the name of an entry in spec.initContainers.name or spec.containers.name"
NO_RESOURCE = (
    "must match the extended resource name of an entry in spec.initContainers.resources.requests or "
    "spec.containers.resources.requests"
)


def validate_pod_status(pod: Mapping[str, Any]) -> list[FieldError]:
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if status is None:
        return []
    spec = pod.get("spec") or {}
    containers = {
        str(c.get("name")): c for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    }
    errors = []
    mappings = status.get("requestMappings") or []
    if not mappings:
        errors.append(
            FieldError.required(f"{FIELD}.requestMappings", "at least one request mapping is required")
        )
    seen: set[tuple[str, str, str]] = set()
    for i, m in enumerate(mappings):
        path = f"{FIELD}.requestMappings[{i}]"
        container, resource, request = (
            str(m.get(k) or "") for k in ("containerName", "resourceName", "requestName")
        )
        if container not in containers:
            errors.append(FieldError.invalid(f"{path}.containerName", container, NO_CONTAINER))
        elif resource not in container_requests(containers[container]):
            errors.append(FieldError.invalid(f"{path}.resourceName", resource, NO_RESOURCE))
        if len(request) > 63 or not DNS_LABEL.fullmatch(request):
            errors.append(FieldError.invalid(f"{path}.requestName", request, DNS_LABEL_MSG))
        if (container, resource, request) in seen:
            errors += [
                FieldError.duplicate(f"{path}.containerName", container),
                FieldError.duplicate(f"{path}.resourceName", resource),
                FieldError.duplicate(f"{path}.requestName", request),
            ]
        seen.add((container, resource, request))
    name = str(status.get("resourceClaimName") or "")
    if not name:
        errors.append(FieldError.required(f"{FIELD}.resourceClaimName"))
    elif not is_dns1123_subdomain(name):
        errors.append(FieldError.invalid(f"{FIELD}.resourceClaimName", name, DNS_SUBDOMAIN_MSG))
    return errors
