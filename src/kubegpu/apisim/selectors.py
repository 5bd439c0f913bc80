"""Label and field selectors, parsed and matched as the API server does (apimachinery `labels.Parse`,
`fields.ParseSelector`).

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, `k>3`, `k<3`, joined
by commas. Field selectors: `k=v`, `k==v`, `k!=v` joined by commas, with `\\,` `\\=` `\\\\` escapes in
values. A malformed selector is a 400 BadRequest; an unknown field label is "field label not supported".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubegpu.common.k8s_names import is_qualified_name

from .errors import bad_request

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_VALUE_MAX = 63


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case "=" | "in":
                return present and value in self.values
            case "!=" | "notin":
                return not present or value not in self.values
            case "exists":
                return present
            case "!":
                return not present
            case "gt" | "lt":
                if not present or value is None:
                    return False
                try:
                    have, want = int(value), int(self.values[0])
                except ValueError:
                    return False
                return have > want if self.operator == "gt" else have < want
        raise AssertionError(self.operator)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _check_key(key: str, text: str) -> str:
    if not is_qualified_name(key):
        raise bad_request(f"unable to parse requirement: invalid label key {key!r} in {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > _LABEL_VALUE_MAX or not _LABEL_VALUE.fullmatch(value):
        raise bad_request(f"unable to parse requirement: invalid label value {value!r} in {text!r}")
    return value


_SET_FORM = re.compile(r"^\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*$")


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a labelSelector string ("" selects everything)."""
    if not text.strip():
        return ()
    requirements = []
    for part in _split_top_level(text):
        part = part.strip()
        if not part:
            raise bad_request(f"unable to parse requirement: found ',', expected: identifier in {text!r}")
        if m := _SET_FORM.match(part):
            key, op, inner = m.group(1), m.group(2), m.group(3)
            values = tuple(_check_value(v.strip(), text) for v in inner.split(",")) if inner.strip() else ()
            if not values and op == "in":
                raise bad_request(
                    f"unable to parse requirement: for 'in' operator, values set can't be empty in {text!r}"
                )
            requirements.append(Requirement(_check_key(key, text), op, values))
            continue
        for token, op in (("!=", "!="), ("==", "="), ("=", "="), (">", "gt"), ("<", "lt")):
            if token in part:
                key, _, value = part.partition(token)
                value = value.strip()
                if op in ("gt", "lt") and not value.lstrip("-").isdigit():
                    raise bad_request(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer "
                        f"in {text!r}"
                    )
                requirements.append(
                    Requirement(_check_key(key.strip(), text), op, (_check_value(value, text),))
                )
                break
        else:
            if part.startswith("!"):
                requirements.append(Requirement(_check_key(part[1:].strip(), text), "!"))
            else:
                requirements.append(Requirement(_check_key(part, text), "exists"))
    return tuple(requirements)


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    label: str
    equal: bool  # False: !=
    value: str


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def _unescape(value: str, text: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence in {text!r}")
            out.append(value[i + 1])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def parse_field_selector(text: str, supported: tuple[str, ...]) -> tuple[FieldRequirement, ...]:
    """The requirements of a fieldSelector; every label must be one the resource supports."""
    if not text:
        return ()
    requirements = []
    for part in _split_unescaped(text, ","):
        found = next(
            ((i, token) for token in ("!=", "==", "=") if (i := _unescaped_index(part, token)) >= 0), None
        )
        if found is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        index, token = found
        equal = token != "!="
        label, value = part[:index].strip(), part[index + len(token) :]
        if label not in supported:
            raise bad_request(f"field label not supported: {label}")
        requirements.append(FieldRequirement(label, equal, _unescape(value, text)))
    return tuple(requirements)


def _unescaped_index(text: str, token: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(token, i):
            return i
        i += 1
    return -1


Matcher = Callable[[dict], bool]


def matcher(
    label_selector: str,
    field_selector: str,
    supported_fields: tuple[str, ...],
    field_of: Callable[[dict, str], str],
) -> Matcher:
    """A predicate on stored objects for both selectors. Raises ApiError (400) on a bad selector."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, supported_fields)

    def matches(obj: dict) -> bool:
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(r.matches(obj_labels) for r in labels):
            return False
        return all((field_of(obj, f.label) == f.value) == f.equal for f in fields)

    return matches
