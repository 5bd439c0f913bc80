"""The config file's classes (plain dataclasses) built from the decoded value, every problem with its place.

By the time a value gets here `nvidia_decode` has typed it as Go's encoding/json types it into NVIDIA's
structs, so what is left is construction and NVIDIA's own checks. That needs no validation library: the
daemon's resident memory is mostly import weight, and pydantic alone cost it 7-8 MB (README, benchmarks).

A model is a dataclass. Its fields may carry, in their metadata, a nested model (`nested`) or a check
of the field's value (`checked`), as in `x: Sub | None = field(default=None, metadata=nested(Sub))`.
The model's own check is its `__post_init__`, so it also runs when code builds one directly. As a schema
validator does, `build` checks every field before the model, reports every problem (its place, the text,
the value), and skips a model's own check when one of its fields failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

_NESTED = "kubegpu.nested"
_CHECK = "kubegpu.check"


class Problem(NamedTuple):
    loc: tuple[str | int, ...]
    message: str
    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class _Nested:
    model: type[Any]
    many: bool


def nested(model: type[Any], *, many: bool = False) -> dict[str, Any]:
    """Field metadata: the field holds a `model` (a list of them with `many`). Null leaves the field at
    its default (None, or an empty model or list), as encoding/json leaves a Go field it reads null into."""
    return {_NESTED: _Nested(model, many)}


def checked(check: Callable[[Any], Any]) -> dict[str, Any]:
    """Field metadata: `check` returns the field's value (possibly converted) or refuses it (ValueError)."""
    return {_CHECK: check}


def nested_model(owner: type[Any], name: str) -> type[Any]:
    """The model a nested field of `owner` holds (e.g. PluginFlags for Flags.plugin)."""
    spec: _Nested = {f.name: f for f in dataclasses.fields(owner)}[name].metadata[_NESTED]
    return spec.model


def field_paths(model: type[Any], prefix: str = "") -> dict[str, list[str]]:
    """Every key the schema knows, by name, with the dotted paths where it belongs (`a[].b` for lists)."""
    out: dict[str, list[str]] = {}
    for f in dataclasses.fields(model):
        out.setdefault(f.name, []).append(prefix + f.name)
        spec = f.metadata.get(_NESTED)
        if spec is not None:
            sub = prefix + f.name + ("[]." if spec.many else ".")
            for key, paths in field_paths(spec.model, sub).items():
                out.setdefault(key, []).extend(paths)
    return out


def build(
    model: type[T], raw: dict[str, Any], problems: list[Problem], loc: tuple[str | int, ...] = ()
) -> T | None:
    """`model` from a decoded mapping; None when anything in it fails (each failure is in `problems`)."""
    values: dict[str, Any] = {}
    failed = False
    # mypy cannot say that T is a dataclass (no bound expresses it); every model here is one.
    for f in dataclasses.fields(model):  # type: ignore[arg-type]
        if f.name not in raw:
            continue
        value = raw[f.name]
        where = (*loc, f.name)
        spec = f.metadata.get(_NESTED)
        if spec is not None:
            if value is None:
                continue  # the field's default: None, or its empty model or list
            if spec.many:
                items = [build(spec.model, item, problems, (*where, i)) for i, item in enumerate(value)]
                failed = failed or any(item is None for item in items)
                value = items
            else:
                value = build(spec.model, value, problems, where)
                failed = failed or value is None
        elif _CHECK in f.metadata:
            try:
                value = f.metadata[_CHECK](value)
            except ValueError as err:
                problems.append(Problem(where, str(err), value))
                failed = True
                continue
        values[f.name] = value
    if failed:
        return None
    try:
        return model(**values)
    except ValueError as err:
        problems.append(Problem(loc, str(err), raw))
        return None


def dump(model: Any) -> Any:
    """A model as JSON-able data, fields in their order, None fields left out (the start-up dump)."""
    if dataclasses.is_dataclass(model) and not isinstance(model, type):
        out = {}
        for f in dataclasses.fields(model):
            value = getattr(model, f.name)
            if value is not None:
                out[f.name] = dump(value)
        return out
    if isinstance(model, list | tuple):
        return [dump(item) for item in model]
    return model
