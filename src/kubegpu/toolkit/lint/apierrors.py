"""The API server's own words for what it refuses, so lint findings quote what `kubectl apply` would print.

Two families: validation errors (apimachinery's `field.Error`, e.g. `spec.replicas: Invalid value: -1: must
be greater than or equal to 0`) and decoding errors, where the object never reaches validation (`Deployment
in version "v1" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field
DeploymentSpec.spec.replicas of type int32`).
"""

from __future__ import annotations

import json

from kubegpu.toolkit.manifests import Path, path_text

# k8s.io/apimachinery/pkg/api/validation: IsNegativeErrorMsg; pkg/apis/core/validation: isNotIntegerErrorMsg
IS_NEGATIVE = "must be greater than or equal to 0"
NOT_INTEGER = "must be an integer"


def field_path(path: Path, key: str | None = None) -> str:
    """A `field.Path` as the API server prints it: `spec.containers[0].resources.limits[nvidia.com/gpu]`."""
    text = path_text(path)
    return f"{text}[{key}]" if key is not None else text


def invalid(field: str, value: str | int, detail: str) -> str:
    """`field.Invalid(field, value, detail).Error()`: strings quoted, numbers bare."""
    shown = json.dumps(value) if isinstance(value, str) else str(value)
    return f"{field}: Invalid value: {shown}: {detail}"


def cannot_decode(kind: str, api_version: str, detail: str) -> str:
    """The API server's answer to a body it cannot decode into `kind` (a 400 BadRequest)."""
    version = api_version.rpartition("/")[2] or "v1"
    return f'{kind} in version "{version}" cannot be handled as a {kind}: {detail}'


def json_type_error(value_type: str, struct: str, field: str, go_type: str) -> str:
    """encoding/json's UnmarshalTypeError, whose field is the full path from the object's root."""
    return f"json: cannot unmarshal {value_type} into Go struct field {struct}.{field} of type {go_type}"
