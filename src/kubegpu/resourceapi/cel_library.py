"""The Kubernetes CEL libraries DRA selectors use, as celpy functions (cel.py says which, and what is
left out): quantities and semantic versions as values, and the quantity, semver, strings, lists and regex
functions on them, with the Kubernetes libraries' error texts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import semver
from celpy import celtypes
from celpy.evaluation import CELEvalError

from kubegpu.common import quantity as q


class Quantity:
    """A Kubernetes quantity as CEL sees it: compared by value (1Gi == 1024Mi)."""

    __slots__ = ("nanos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.nanos = q.parse_nanos(text)

    @classmethod
    def from_nanos(cls, nanos: int) -> Quantity:
        out = cls.__new__(cls)
        out.nanos, out.text = nanos, f"{nanos}n"
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


class Semver:
    """A semantic version (semver.org 2.0.0) as CEL sees it; version attributes arrive as these."""

    __slots__ = ("version",)

    def __init__(self, version: semver.Version) -> None:
        self.version = version

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and other.version == self.version

    def __hash__(self) -> int:
        return hash(str(self.version))

    def __repr__(self) -> str:
        return f"semver({str(self.version)!r})"


def eval_error(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, (message,))


def _compare(a: Any, b: Any) -> int | CELEvalError:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.nanos > b.nanos) - (a.nanos < b.nanos)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.version.compare(b.version)
    return eval_error(f"no such overload: compareTo({type_name(a)}, {type_name(b)})")


def type_name(value: Any) -> str:
    if isinstance(value, Quantity):
        return "Quantity"
    if isinstance(value, Semver):
        return "Semver"
    return type(value).__name__.removesuffix("Type").lower()


def _compare_to(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.IntType(result)


def _is_greater_than(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result > 0)


def _is_less_than(a: Any, b: Any) -> Any:
    result = _compare(a, b)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result < 0)


# apimachinery's resource.ErrFormatWrong, which the CEL library returns for a bad quantity string.
QUANTITY_FORMAT_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


# -- quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go) --


def _quantity(text: Any) -> Any:
    try:
        return Quantity(str(text))
    except q.QuantityError:
        return eval_error(QUANTITY_FORMAT_ERROR)


def _is_quantity(text: Any) -> Any:
    try:
        q.parse_nanos(str(text))
    except q.QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _sign(value: Any) -> Any:
    if not isinstance(value, Quantity):
        return eval_error(f"no such overload: sign({type_name(value)})")
    return celtypes.IntType((value.nanos > 0) - (value.nanos < 0))


def _is_integer(value: Any) -> Any:
    if not isinstance(value, Quantity):
        return eval_error(f"no such overload: isInteger({type_name(value)})")
    return celtypes.BoolType(value.nanos % q.NANO == 0 and abs(value.nanos // q.NANO) < 2**63)


def _as_integer(value: Any) -> Any:
    if not isinstance(value, Quantity):
        return eval_error(f"no such overload: asInteger({type_name(value)})")
    if value.nanos % q.NANO or abs(value.nanos // q.NANO) >= 2**63:
        return eval_error("cannot convert value to integer")
    return celtypes.IntType(value.nanos // q.NANO)


def _as_approximate_float(value: Any) -> Any:
    if not isinstance(value, Quantity):
        return eval_error(f"no such overload: asApproximateFloat({type_name(value)})")
    return celtypes.DoubleType(value.nanos / q.NANO)


def _arith(sign: int) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        if not isinstance(a, Quantity):
            return eval_error("no such overload: quantity arithmetic on a non-quantity")
        if isinstance(b, Quantity):
            return Quantity.from_nanos(a.nanos + sign * b.nanos)
        if isinstance(b, int) and not isinstance(b, bool):
            return Quantity.from_nanos(a.nanos + sign * int(b) * q.NANO)
        return eval_error(f"no such overload: add/sub(Quantity, {type_name(b)})")

    return apply


# -- semver library (k8s.io/apiserver/pkg/cel/library/semverlib.go) --


def _normalize(text: str) -> str:
    """semver(s, true): drop a leading v, add missing minor/patch, strip leading zeros."""
    text = text.removeprefix("v")
    split = len(text) - len(text.lstrip("0123456789."))
    core, rest = text[:split], text[split:]
    parts = core.split(".") if core else []
    parts += ["0"] * (3 - len(parts))
    parts = [(p.lstrip("0") or "0") if p.isdigit() else p for p in parts]
    return ".".join(parts) + rest


def parse_semver(text: Any, normalize: Any = False) -> semver.Version | None:
    raw = str(text)
    if bool(normalize):
        raw = _normalize(raw)
    try:
        return semver.Version.parse(raw)
    except (ValueError, TypeError):
        return None


def _semver(text: Any, normalize: Any = False) -> Any:
    version = parse_semver(text, normalize)
    if version is None:
        return eval_error(f"could not parse {str(text)!r} as a semantic version")
    return Semver(version)


def _is_semver(text: Any, normalize: Any = False) -> Any:
    return celtypes.BoolType(parse_semver(text, normalize) is not None)


def _part(name: str) -> Callable[[Any], Any]:
    def get(value: Any) -> Any:
        if not isinstance(value, Semver):
            return eval_error(f"no such overload: {name}({type_name(value)})")
        return celtypes.IntType(getattr(value.version, name))

    return get


# -- strings extension (cel-go ext.Strings) and the Kubernetes lists and regex libraries --


def _index_of(value: Any, item: Any, start: Any = 0) -> Any:
    if isinstance(value, str):
        if not isinstance(item, str):
            return eval_error("no such overload: indexOf(string, non-string)")
        if int(start) < 0 or int(start) > len(value):
            return eval_error(f"index out of range: {int(start)}")
        return celtypes.IntType(value.find(item, int(start)))
    if isinstance(value, list):
        return celtypes.IntType(next((i for i, v in enumerate(value) if v == item), -1))
    return eval_error(f"no such overload: indexOf({type_name(value)})")


def _last_index_of(value: Any, item: Any) -> Any:
    if isinstance(value, str):
        return celtypes.IntType(value.rfind(item))
    if isinstance(value, list):
        return celtypes.IntType(max((i for i, v in enumerate(value) if v == item), default=-1))
    return eval_error(f"no such overload: lastIndexOf({type_name(value)})")


def _char_at(value: Any, index: Any) -> Any:
    i = int(index)
    if i < 0 or i > len(value):
        return eval_error(f"index out of range: {i}")
    return celtypes.StringType(value[i] if i < len(value) else "")


def _substring(value: Any, start: Any, end: Any = None) -> Any:
    s, e = int(start), len(value) if end is None else int(end)
    if s < 0 or e > len(value) or s > e:
        return eval_error(f"index out of range: {s if s < 0 or s > len(value) else e}")
    return celtypes.StringType(value[s:e])


def _split(value: Any, separator: Any, limit: Any = -1) -> Any:
    n = int(limit)
    if n == 0:
        return celtypes.ListType([])
    parts = value.split(separator) if n < 0 else value.split(separator, n - 1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(value: Any, separator: Any = "") -> Any:
    return celtypes.StringType(str(separator).join(str(v) for v in value))


def _replace(value: Any, old: Any, new: Any, limit: Any = -1) -> Any:
    return celtypes.StringType(value.replace(old, new, int(limit)))


def _is_sorted(value: Any) -> Any:
    return celtypes.BoolType(all(a <= b for a, b in itertools.pairwise(value)))


def _sum(value: Any) -> Any:
    return sum(value[1:], value[0]) if value else celtypes.IntType(0)


def _max(value: Any) -> Any:
    return max(value) if value else eval_error("max of an empty list")


def _find(value: Any, pattern: Any) -> Any:
    match = re.search(str(pattern), str(value))
    return celtypes.StringType(match.group(0) if match else "")


def _find_all(value: Any, pattern: Any, limit: Any = -1) -> Any:
    found = [m.group(0) for m in re.finditer(str(pattern), str(value))]
    n = int(limit)
    return celtypes.ListType([celtypes.StringType(f) for f in (found if n < 0 else found[:n])])


KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _sign,
    "isInteger": _is_integer,
    "asInteger": _as_integer,
    "asApproximateFloat": _as_approximate_float,
    "add": _arith(1),
    "sub": _arith(-1),
    "semver": _semver,
    "isSemver": _is_semver,
    "major": _part("major"),
    "minor": _part("minor"),
    "patch": _part("patch"),
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "join": _join,
    "isSorted": _is_sorted,
    "sum": _sum,
    "max": _max,
    "find": _find,
    "findAll": _find_all,
}
