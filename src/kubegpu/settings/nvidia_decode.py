"""The second half of NVIDIA's config loading: Go's encoding/json decoding the JSON into NVIDIA's types.

`goyaml` gives the JSON-able value sigs.k8s.io/yaml hands to encoding/json. This module types it the way
NVIDIA's Go types (api/config/v1: config.go, flags.go, sharing.go, replicas.go, resources.go, imex.go,
duration.go) and encoding/json do, and returns it with canonical keys for the config's classes to check
NVIDIA's rules. What it settles, as NVIDIA does:

- a bool field takes `true`/`false` only (YAML 1.1's `yes`/`on` are booleans already; `"true"` is a
  string): `json: cannot unmarshal string into Go struct field Flags.flags.CommandLineFlags.failOnInitError
  of type bool`;
- an int field takes an integral number: `replicas: "4"` -> `... cannot unmarshal string into ... of type
  int`, `4.5` -> `... number 4.5 ...`, while `4.0`, `0x10` and `1_000` are 4, 16 and 1000 (go-yaml resolved
  them, and the JSON text of 4.0 is `4`);
- a string field in a plain struct takes a YAML number or bool as its text (sigs.k8s.io/yaml converts them
  when the target is a string), but not inside the types with their own UnmarshalJSON (the sharing blocks,
  resource names);
- keys of plain structs match ignoring case (encoding/json), keys read by NVIDIA's own UnmarshalJSON match
  exactly; other keys are ignored (and reported here as warnings);
- an error inside a type with its own UnmarshalJSON carries the field path of the enclosing struct field,
  as encoding/json's addErrorContext rewrites it: `... into Go struct field Sharing.sharing.timeSlicing of
  type int`.

NVIDIA stops at the first error; this reports every one, each with NVIDIA's text and the exact place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubegpu.settings.goduration import parse_sleep_interval
from kubegpu.settings.gotext import go_format_float32_g, go_json_number, preview

if TYPE_CHECKING:  # goyaml (and PyYAML under it) loads only when a config file is parsed
    from kubegpu.settings.goyaml import Document

# --- the types -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoScalar:
    go: str  # as Go prints the type: "bool", "int", "string"
    kind: str  # "bool", "int" or "string"


@dataclass(frozen=True)
class GoSlice:
    elem: GoType

    @property
    def go(self) -> str:
        return "[]" + self.elem.go


@dataclass(frozen=True)
class GoField:
    key: str  # the JSON name
    type: GoType
    embedded: tuple[str, ...] = ()  # Go names of the embedded structs the field is promoted from


@dataclass(frozen=True)
class GoStruct:
    """A struct decoded by encoding/json itself: keys match ignoring case, unknown keys are ignored."""

    go: str  # "v1.Flags"
    fields: tuple[GoField, ...]

    @property
    def name(self) -> str:
        return self.go.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class GoCustom:
    """A type with its own UnmarshalJSON: `decode(raw, at)` types the raw JSON value, `at` reports."""

    go: str
    decode: Callable[[Any, _At], Any]
    nullable: bool = False  # a pointer field: JSON null leaves it nil (None) without calling UnmarshalJSON


GoType = GoScalar | GoSlice | GoStruct | GoCustom

BOOL = GoScalar("bool", "bool")
INT = GoScalar("int", "int")
STRING = GoScalar("string", "string")


class _Stop(Exception):
    """Ends a custom decode at its first error, as NVIDIA's UnmarshalJSON returns at its first error."""


@dataclass
class Decoded:
    value: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # dotted paths of keys NVIDIA ignores
    folded: list[tuple[str, str]] = field(default_factory=list)  # (as written, the field it is read as)
    unsupported: str = ""  # a NaN or infinity that reaches JSON: sigs.k8s.io/yaml fails before decoding


@dataclass
class _At:
    """Where a value sits: our dotted path, and the Go error context encoding/json would hold there."""

    out: Decoded
    doc: Document
    path: str
    go_struct: str = ""  # the innermost plain struct's name ("" at the top)
    go_fields: tuple[str, ...] = ()  # encoding/json's FieldStack
    custom: bool = False  # inside a type with its own UnmarshalJSON: no string conversion, Go-value errors

    def reaches_json(self, value: Any) -> None:
        """`value` goes into the JSON as it is (no string field converts it): NaN and infinities fail."""
        if not self.out.unsupported:
            self.out.unsupported = self.doc.unsupported(value) or ""

    def child(self, key: str | int) -> _At:
        path = f"{self.path}.{key}" if self.path else str(key)
        return _At(self.out, self.doc, path, self.go_struct, self.go_fields, self.custom)

    def type_error(self, value: Any, go_type: str, *, kind: str = "") -> None:
        """encoding/json's UnmarshalTypeError, with the context its addErrorContext would give it."""
        kind = kind or _json_kind(value)
        if self.go_struct or self.go_fields:
            text = (
                f"json: cannot unmarshal {kind} into Go struct field "
                f"{self.go_struct}.{'.'.join(self.go_fields)} of type {go_type}"
            )
        else:
            text = f"json: cannot unmarshal {kind} into Go value of type {go_type}"
        self.problem(text, value)

    def problem(self, text: str, got: Any = None, *, show: bool = True) -> None:
        where = f"{self.path}: " if self.path else ""
        suffix = f" (got {preview(got)})" if show else ""
        self.out.problems.append(f"{where}{text}{suffix}")


def _json_kind(value: Any) -> str:
    """How encoding/json names what it found: "string", "number 4.5", "bool", "array", "object"."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object"


# --- encoding/json's decoding ----------------------------------------------------------------------------


def decode_config(doc: Document, config: GoStruct) -> Decoded:
    """Type the document as NVIDIA's Config; problems carry NVIDIA's texts. The value has canonical keys."""
    out = Decoded({})
    at = _At(out, doc, "")
    value = doc.value
    if isinstance(value, dict):
        out.value = _struct(value, config, at)
    elif value is not None:
        at.reaches_json(value)
        at.type_error(value, config.go)
    if out.unsupported:
        # sigs.k8s.io/yaml marshals the whole document to JSON before decoding it: that fails first.
        out.problems = [
            f"json: unsupported value: {out.unsupported} (JSON has no NaN or infinity; quote the value)"
        ]
    return out


def _struct(raw: dict[str, Any], struct: GoStruct, at: _At) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key in sorted(raw):  # sigs.k8s.io/yaml's JSON has its keys sorted; a later duplicate wins
        spec = _field(struct, key)
        if spec is None:
            at.out.unknown.append(f"{at.path}.{key}" if at.path else key)
            at.reaches_json(raw[key])
            continue
        if key != spec.key:
            where = f"{at.path}." if at.path else ""
            at.out.folded.append((where + key, where + spec.key))
        inner = _At(
            at.out,
            at.doc,
            f"{at.path}.{spec.key}" if at.path else spec.key,
            struct.name,
            (*at.go_fields, *spec.embedded, spec.key),
        )
        value = _value(raw[key], spec.type, inner)
        if isinstance(value, dict) and isinstance(result.get(spec.key), dict):
            result[spec.key] = {**result[spec.key], **value}  # decoding into the same struct again merges
        else:
            result[spec.key] = value
    return result


def _field(struct: GoStruct, key: str) -> GoField | None:
    folded = None
    for spec in struct.fields:
        if spec.key == key:
            return spec
        if folded is None and spec.key.casefold() == key.casefold():
            folded = spec
    return folded


def _value(raw: Any, go_type: GoType, at: _At) -> Any:
    if isinstance(go_type, GoCustom):
        at.reaches_json(raw)  # no conversion happens for a type with its own UnmarshalJSON
        if raw is None and go_type.nullable:
            return None
        try:
            return go_type.decode(raw, _At(at.out, at.doc, at.path, at.go_struct, at.go_fields, custom=True))
        except _Stop:
            return None
    if raw is None:
        return None  # encoding/json leaves the field as it was: nil, false or 0
    if isinstance(go_type, GoScalar):
        return scalar(raw, go_type, at)
    if isinstance(go_type, GoSlice):
        if not isinstance(raw, list):
            at.reaches_json(raw)
            at.type_error(raw, go_type.go)
            return None
        elem = go_type.elem
        if isinstance(elem, GoScalar):  # encoding/json leaves a null element at its zero value: [null] is [0]
            return [
                typed(item, elem, at.child(i)) if item is None else _value(item, elem, at.child(i))
                for i, item in enumerate(raw)
            ]
        return [_value(item, elem, at.child(i)) for i, item in enumerate(raw)]
    if not isinstance(raw, dict):
        at.reaches_json(raw)
        at.type_error(raw, go_type.go)
        return None
    return _struct(raw, go_type, at)


def scalar(raw: Any, go_type: GoScalar, at: _At) -> Any:
    """A JSON value into a Go bool, int or string; None (and a problem) when it does not fit."""
    if go_type.kind != "string" or at.custom:
        at.reaches_json(raw)
    if go_type.kind == "string":
        if isinstance(raw, str):
            return raw
        if not at.custom and isinstance(raw, bool | int | float):
            # sigs.k8s.io/yaml writes a YAML number or bool aimed at a string field as text.
            if isinstance(raw, bool):
                return "true" if raw else "false"
            return str(raw) if isinstance(raw, int) else go_format_float32_g(raw)
    elif go_type.kind == "bool":
        if isinstance(raw, bool):
            return raw
    elif isinstance(raw, int | float) and not isinstance(raw, bool):
        text = go_json_number(raw)
        try:
            number = int(text, 10)  # strconv.ParseInt(text, 10, 64) on the JSON text
        except ValueError:
            number = None
        if number is not None and -(1 << 63) <= number < (1 << 63):
            return number
        at.type_error(raw, go_type.go, kind=f"number {text}")
        return None
    at.type_error(raw, go_type.go)
    return None


def exact_object(raw: Any, at: _At) -> dict[str, Any]:
    """NVIDIA's `json.Unmarshal(b, &map[string]json.RawMessage{})`: an object (null: an empty one)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        at.type_error(raw, "map[string]json.RawMessage")
        raise _Stop
    return raw


def known_keys(raw: dict[str, Any], keys: tuple[str, ...], at: _At) -> None:
    """Keys an UnmarshalJSON never looks up (it matches exactly): ignored by NVIDIA, warned about here."""
    for key in raw:
        if key not in keys:
            at.out.unknown.append(f"{at.path}.{key}" if at.path else key)


def typed(raw: Any, go_type: GoScalar, at: _At) -> Any:
    """`json.Unmarshal(raw, &x)` inside an UnmarshalJSON: null leaves x at its zero value."""
    if raw is None:
        return {"bool": False, "int": 0, "string": ""}[go_type.kind]
    value = scalar(raw, go_type, at)
    if value is None:
        raise _Stop
    return value


def go_json(value: Any, limit: int = 200) -> str:
    """The JSON text Go's encoding/json writes for `value` (sorted keys, no spaces, HTML escaped)."""
    text = preview(value, limit, compact=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_number_value(raw: Any) -> Any:
    """A value, or the items of a list, as a later `json.Unmarshal` sees them: a float whose JSON text is
    an integer is one. One level only: NVIDIA's ReplicatedDevices reads no deeper."""
    if isinstance(raw, list):
        return [_integral(item) for item in raw]
    return _integral(raw)


def _integral(raw: Any) -> Any:
    if isinstance(raw, float) and math.isfinite(raw):
        text = go_json_number(raw)
        if text.lstrip("-").isdigit():
            return int(text)
    return raw


def duration(raw: Any, at: _At) -> int | None:
    """NVIDIA's Duration.UnmarshalJSON: a number is nanoseconds, a string a Go duration ("infinite" too)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        at.problem("invalid duration", raw)
        raise _Stop
    if isinstance(raw, str):
        try:
            return parse_sleep_interval(raw)
        except ValueError as err:
            at.problem(str(err), raw)
            raise _Stop from None
    nanoseconds = float(raw)
    if not -(2.0**63) <= nanoseconds < 2.0**63:
        at.problem("invalid duration: out of range", raw)
        raise _Stop
    return int(nanoseconds)  # Go converts the float64 by truncation


# --- NVIDIA's types (k8s-device-plugin v0.20, api/config/v1) ---------------------------------------------

RESOURCE_PATTERN = GoScalar("v1.ResourcePattern", "string")


def _device_list_strategy(raw: Any, at: _At) -> list[str]:
    """deviceListStrategyFlag.UnmarshalJSON: a string, or a list of strings."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and all(item is None or isinstance(item, str) for item in raw):
        return ["" if item is None else item for item in raw]
    at.problem(f"invalid deviceListStrategy: {go_json(raw)}", show=False)
    raise _Stop


def _replicated_resources(raw: Any, at: _At) -> dict[str, Any]:
    """ReplicatedResources.UnmarshalJSON (sharing.timeSlicing, sharing.mps): keys matched exactly."""
    obj = exact_object(raw, at)
    known_keys(obj, ("renameByDefault", "failRequestsGreaterThanOne", "resources"), at)
    out: dict[str, Any] = {}
    if "renameByDefault" in obj:
        out["renameByDefault"] = typed(obj["renameByDefault"], BOOL, at.child("renameByDefault"))
    if "failRequestsGreaterThanOne" in obj and obj["failRequestsGreaterThanOne"] is not None:  # a *bool
        value = obj["failRequestsGreaterThanOne"]
        out["failRequestsGreaterThanOne"] = typed(value, BOOL, at.child("failRequestsGreaterThanOne"))
    if "resources" in obj:
        resources = obj["resources"]
        where = at.child("resources")
        if resources is not None and not isinstance(resources, list):
            where.type_error(resources, "[]v1.ReplicatedResource")
            raise _Stop
        items, failed = [], False
        for i, item in enumerate(resources or ()):
            try:
                items.append(_replicated_resource(item, where.child(i)))
            except _Stop:
                failed = True
        if failed:
            raise _Stop
        out["resources"] = items
    return out


def _replicated_resource(raw: Any, at: _At) -> dict[str, Any]:
    """ReplicatedResource.UnmarshalJSON: name, devices, replicas, rename; keys matched exactly."""
    obj = exact_object(raw, at)
    known_keys(obj, ("name", "rename", "devices", "replicas"), at)
    out: dict[str, Any] = {}
    for key, go_type in (("name", STRING), ("replicas", INT), ("rename", STRING)):
        if key in obj:
            out[key] = typed(obj[key], go_type, at.child(key))
    if "devices" in obj:
        out["devices"] = go_number_value(obj["devices"])  # ReplicatedDevices.parse reads it as NVIDIA does
    return out


def _resource(raw: Any, at: _At) -> dict[str, Any]:
    """Resource.UnmarshalJSON (resources.gpus[], resources.mig[]): pattern and name; keys matched exactly."""
    obj = exact_object(raw, at)
    known_keys(obj, ("pattern", "name"), at)
    out: dict[str, Any] = {}
    for key, go_type in (("pattern", RESOURCE_PATTERN), ("name", STRING)):
        if key in obj:
            out[key] = typed(obj[key], go_type, at.child(key))
    return out


_FLAG = ("CommandLineFlags",)  # v1.Flags embeds CommandLineFlags: encoding/json names it in the field path

PLUGIN_FLAGS = GoStruct(
    "v1.PluginCommandLineFlags",
    (
        GoField("passDeviceSpecs", BOOL),
        GoField("deviceListStrategy", GoCustom("v1.deviceListStrategyFlag", _device_list_strategy, True)),
        GoField("deviceIDStrategy", STRING),
        GoField("cdiAnnotationPrefix", STRING),
        GoField("nvidiaCTKPath", STRING),
        GoField("containerDriverRoot", STRING),
        GoField("sharedDevicesAllocationPolicy", STRING),
    ),
)
GFD_FLAGS = GoStruct(
    "v1.GFDCommandLineFlags",
    (
        GoField("oneshot", BOOL),
        GoField("noTimestamp", BOOL),
        GoField("sleepInterval", GoCustom("v1.Duration", duration, True)),
        GoField("outputFile", STRING),
        GoField("machineTypeFile", STRING),
    ),
)
FLAGS = GoStruct(
    "v1.Flags",
    tuple(
        GoField(key, go_type, _FLAG)
        for key, go_type in (
            ("migStrategy", STRING),
            ("failOnInitError", BOOL),
            ("mpsRoot", STRING),
            ("nvidiaDriverRoot", STRING),
            ("nvidiaDevRoot", STRING),
            ("gdrcopyEnabled", BOOL),
            ("gdsEnabled", BOOL),
            ("mofedEnabled", BOOL),
            ("useNodeFeatureAPI", BOOL),
            ("deviceDiscoveryStrategy", STRING),
            ("plugin", PLUGIN_FLAGS),
            ("gfd", GFD_FLAGS),
        )
    ),
)
_RESOURCE = GoCustom("v1.Resource", _resource)
RESOURCES = GoStruct(
    "v1.Resources", (GoField("gpus", GoSlice(_RESOURCE)), GoField("mig", GoSlice(_RESOURCE)))
)
SHARING = GoStruct(
    "v1.Sharing",
    (
        GoField("timeSlicing", GoCustom("v1.ReplicatedResources", _replicated_resources)),
        GoField("mps", GoCustom("v1.ReplicatedResources", _replicated_resources, True)),
    ),
)
IMEX = GoStruct("v1.Imex", (GoField("channelIDs", GoSlice(INT)), GoField("required", BOOL)))
CONFIG = GoStruct(
    "v1.Config",
    (
        GoField("version", STRING),
        GoField("flags", FLAGS),
        GoField("resources", RESOURCES),
        GoField("sharing", SHARING),
        GoField("imex", IMEX),
    ),
)
