"""The CDI spec schema the tests hold every generated spec to: the CDI project's published schema
(tests/fixtures/cdi, see its README) and, on top, an overlay with what the specification's prose requires
and the published schema leaves out.

The overlay refuses unknown fields (a typo in our generator fails the tests instead of being ignored by a
runtime), checks the `kind` and device-name formats, `cdiVersion` as a semantic version, `hookName` as an
OCI hook name, absolute paths, env entries of the form NAME=value, hook timeouts above zero and at least
one device, and describes the spec-level `containerEdits`, which the published schema leaves unchecked.
Draft 7, the published schema's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry
from referencing.jsonschema import DRAFT7

FIXTURES = Path(__file__).parent / "fixtures" / "cdi"
# The published files refer to each other by relative name ("defs.json#/definitions/..."); this base gives
# them URIs so those references resolve inside the registry, with no network access.
BASE = "https://cdi-schema.invalid/schema/"  # never fetched: the registry holds every file

PUBLISHED_SCHEMA: dict[str, Any] = json.loads((FIXTURES / "schema.json").read_text())
PUBLISHED_DEFS: dict[str, Any] = json.loads((FIXTURES / "defs.json").read_text())
_DEFS = BASE + "defs.json#/definitions/"

# Spec prose: the name segment of a kind and a device name begin and end with an alphanumeric, with
# '-', '_', '.' between. Device names may also hold ':' (the CDI parser accepts it; MIG index names
# like "0:1" need it).
_DNS_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
_KIND = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$"
_DEVICE_NAME = r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$"
_SEMVER = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
_ABSOLUTE: dict[str, Any] = {"type": "string", "pattern": "^/"}
# The published `env` items use "ref" (not "$ref"), so they check nothing: the overlay types them too.
_ENV: dict[str, Any] = {"type": "array", "items": {"type": "string", "pattern": r"^[^=]+=.*$"}}
# OCI hook points; "prestart" is deprecated in OCI but still valid.
_HOOK_NAMES = ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"]
_ANNOTATIONS: dict[str, Any] = {"propertyNames": {"minLength": 1}}


def _fields(**properties: Any) -> dict[str, Any]:
    """An object with exactly these fields (each with the extra rule given, `{}` for none)."""
    return {"type": "object", "properties": properties, "additionalProperties": False}


# What kubegpu requires beyond the published schema. Fields are those of the CDI specification (0.8.0);
# the published schema types them, the overlay adds the formats its prose states.
OVERLAY: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "DeviceNode": _fields(
            path=_ABSOLUTE,
            hostPath=_ABSOLUTE,
            type={"enum": ["b", "c", "u", "p"]},
            major={},
            minor={},
            fileMode={"$ref": _DEFS + "int64"},  # in the specification, missing from the published schema
            permissions={"type": "string", "pattern": "^[rwm]{1,3}$"},
            uid={},
            gid={},
        ),
        "Mount": _fields(hostPath={"minLength": 1}, containerPath=_ABSOLUTE, options={}, type={}),
        "Hook": _fields(
            hookName={"enum": _HOOK_NAMES}, path=_ABSOLUTE, args={}, env=_ENV, timeout={"minimum": 1}
        ),
        "ContainerEdits": _fields(
            env=_ENV,
            deviceNodes={"items": {"$ref": "#/definitions/DeviceNode"}},
            mounts={"items": {"$ref": "#/definitions/Mount"}},
            hooks={"items": {"$ref": "#/definitions/Hook"}},
            additionalGids={},
            intelRdt={},
        ),
        "Device": _fields(
            name={"pattern": _DEVICE_NAME},
            annotations=_ANNOTATIONS,
            containerEdits={"$ref": "#/definitions/ContainerEdits"},
        ),
    },
    **_fields(
        cdiVersion={"pattern": _SEMVER},
        kind={"pattern": _KIND, "maxLength": 253 + 1 + 63},
        annotations=_ANNOTATIONS,
        devices={"minItems": 1, "items": {"$ref": "#/definitions/Device"}},
        # The published schema does not describe the spec-level edits: take its definition, then ours.
        containerEdits={
            "allOf": [{"$ref": _DEFS + "containerEdits"}, {"$ref": "#/definitions/ContainerEdits"}]
        },
    ),
}

REGISTRY: Registry[Any] = Registry().with_resources(
    (BASE + name, DRAFT7.create_resource(contents))
    for name, contents in (
        ("schema.json", PUBLISHED_SCHEMA),
        ("defs.json", PUBLISHED_DEFS),
        ("kubegpu-overlay.json", OVERLAY),
    )
)

PUBLISHED = jsonschema.Draft7Validator({"$ref": BASE + "schema.json"}, registry=REGISTRY)
STRICT = jsonschema.Draft7Validator(
    {"allOf": [{"$ref": BASE + "schema.json"}, {"$ref": BASE + "kubegpu-overlay.json"}]}, registry=REGISTRY
)


def cdi_errors(spec: Any) -> list[str]:
    """Every reason the published schema or our overlay refuses `spec`."""
    return sorted(e.message for e in STRICT.iter_errors(spec))


def assert_valid_cdi_spec(spec: Any) -> None:
    errors = cdi_errors(spec)
    assert not errors, errors
