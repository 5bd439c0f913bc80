"""apps/v1 Deployments as the kube-apiserver checks them, for the fields a driver's Deployment sets.

The real server's validation (`apps/validation.ValidateDeployment`) checks far more; what is modelled is
what a wrong MPS control-daemon Deployment would trip on: a selector, a template whose labels it matches,
at least one container with a name and an image, a replica count that is not negative, and a selector
that cannot change (`field is immutable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import FieldError

_SUPPORTED_STRATEGIES = ("Recreate", "RollingUpdate")


def deployment_errors(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        errors.append(FieldError.invalid("spec.replicas", replicas, "must be greater than or equal to 0"))
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selector:
        errors.append(FieldError.required("spec.selector"))
    else:
        wanted = selector.get("matchLabels") or {}
        if not wanted and not selector.get("matchExpressions"):
            errors.append(
                FieldError.invalid("spec.selector", selector, "empty selector is invalid for deployment")
            )
        elif any(labels.get(k) != v for k, v in wanted.items()):
            errors.append(
                FieldError.invalid(
                    "spec.template.metadata.labels", labels, "`selector` does not match template `labels`"
                )
            )
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        errors.append(FieldError.required("spec.template.spec.containers"))
    for i, container in enumerate(containers):
        if not container.get("name"):
            errors.append(FieldError.required(f"spec.template.spec.containers[{i}].name"))
        if not container.get("image"):
            errors.append(FieldError.required(f"spec.template.spec.containers[{i}].image"))
    strategy = (spec.get("strategy") or {}).get("type")
    if strategy is not None and strategy not in _SUPPORTED_STRATEGIES:
        errors.append(FieldError.not_supported("spec.strategy.type", strategy, _SUPPORTED_STRATEGIES))
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        errors.append(FieldError.invalid("spec.selector", selector, "field is immutable"))
    return errors
