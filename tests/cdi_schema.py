"""The JSON schema of a CDI spec file, written from the CDI specification (SPEC.md, spec version 0.8.0).

It follows the field list of the published specification and is stricter than the schema shipped with the
CDI repository where the specification's prose states a rule that the shipped schema leaves out: the
`kind` and device-name formats, `cdiVersion` as a semantic version, `hookName` as one of the OCI hook
names, `path`s that must be absolute, env entries of the form NAME=value and hook timeouts above zero.
Unknown fields are refused, so a typo in our generator fails the tests instead of being ignored by a
runtime. The tests validate every spec `kubegpu.cdi` writes against it (Draft 7, the shipped schema's).
"""

from __future__ import annotations

from typing import Any

# Spec prose: the name segment of a kind and a device name begin and end with an alphanumeric, with
# '-', '_', '.' between. Device names may also hold ':' (the CDI parser accepts it; MIG index names
# like "0:1" need it).
_DNS_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
_KIND = rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$"
_DEVICE_NAME = r"^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$"
_SEMVER = r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
_ABSOLUTE = r"^/"
_ENV = r"^[^=]+=.*$"
# OCI hook points; "prestart" is deprecated in OCI but still valid.
_HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")

_uint32: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 4294967295}
_int64: dict[str, Any] = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_strings: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
_env: dict[str, Any] = {"type": "array", "items": {"type": "string", "pattern": _ENV}}
_annotations: dict[str, Any] = {
    "type": "object",
    "patternProperties": {".{1,}": {"type": "string"}},
    "additionalProperties": False,
}

CDI_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "description": "A Container Device Interface spec file",
    "definitions": {
        "DeviceNode": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "pattern": _ABSOLUTE},
                "hostPath": {"type": "string", "pattern": _ABSOLUTE},
                "type": {"enum": ["b", "c", "u", "p"]},
                "major": _int64,
                "minor": _int64,
                "fileMode": _int64,
                "permissions": {"type": "string", "pattern": "^[rwm]{1,3}$"},
                "uid": _uint32,
                "gid": _uint32,
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        "Mount": {
            "type": "object",
            "properties": {
                "hostPath": {"type": "string", "minLength": 1},
                "containerPath": {"type": "string", "pattern": _ABSOLUTE},
                "options": _strings,
                "type": {"type": "string"},
            },
            "required": ["hostPath", "containerPath"],
            "additionalProperties": False,
        },
        "Hook": {
            "type": "object",
            "properties": {
                "hookName": {"enum": list(_HOOK_NAMES)},
                "path": {"type": "string", "pattern": _ABSOLUTE},
                "args": _strings,
                "env": _env,
                "timeout": {"type": "integer", "minimum": 1, "maximum": 4294967295},
            },
            "required": ["hookName", "path"],
            "additionalProperties": False,
        },
        "ContainerEdits": {
            "type": "object",
            "properties": {
                "env": _env,
                "deviceNodes": {"type": "array", "items": {"$ref": "#/definitions/DeviceNode"}},
                "mounts": {"type": "array", "items": {"$ref": "#/definitions/Mount"}},
                "hooks": {"type": "array", "items": {"$ref": "#/definitions/Hook"}},
                "additionalGids": {"type": "array", "items": _uint32},
                "intelRdt": {
                    "type": "object",
                    "properties": {
                        "closID": {"type": "string"},
                        "l3CacheSchema": {"type": "string"},
                        "memBwSchema": {"type": "string"},
                        "enableCMT": {"type": "boolean"},
                        "enableMBM": {"type": "boolean"},
                    },
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        },
        "Device": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": _DEVICE_NAME},
                "annotations": _annotations,
                "containerEdits": {"$ref": "#/definitions/ContainerEdits"},
            },
            "required": ["name", "containerEdits"],
            "additionalProperties": False,
        },
    },
    "type": "object",
    "properties": {
        "cdiVersion": {"type": "string", "pattern": _SEMVER},
        "kind": {"type": "string", "pattern": _KIND, "maxLength": 253 + 1 + 63},
        "annotations": _annotations,
        "devices": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/Device"}},
        "containerEdits": {"$ref": "#/definitions/ContainerEdits"},
    },
    "required": ["cdiVersion", "kind", "devices"],
    "additionalProperties": False,
}
