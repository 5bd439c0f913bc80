"""YAML as NVIDIA's plugin reads its config file: sigs.k8s.io/yaml over go-yaml v2, with go-yaml's limits.

NVIDIA's loader (api/config/v1/config.go, parseConfigFrom) calls `sigs.k8s.io/yaml.Unmarshal`: go-yaml v2
decodes the YAML (YAML 1.1: `yes`, `on` and `y` are booleans, `0x10`, `010` and `1_000` integers, only the
first document counts), the result is turned into JSON, and Go's encoding/json decodes that JSON into the
config types. This module is the first half: YAML text to the JSON-able value go-yaml would hand over
(`dict[str, ...]`, `list`, `str`, `int`, `float`, `bool`, `None`), refusing what go-yaml refuses, with its
texts:

- an alias to itself (`a: &a [*a]`): `yaml: anchor 'a' value contains itself`;
- alias expansion beyond go-yaml's ratio rule (decode.go, allowedAliasRatio: past 1,000 decode operations
  at most 99% may come from aliases, falling to 10% at 4,000,000): `yaml: document contains excessive
  aliasing`;
- an unknown anchor, a bad `!!binary`, a value that does not fit its explicit tag.

kubegpu adds one bound of its own: at most MAX_NODES nodes, counted the way go-yaml counts decode operations
(every alias expanded). A device plugin config has a few hundred; the bound keeps a hostile file (a billion
laughs, a flood of keys) to milliseconds. The walk never expands an alias: values behind an anchor are
shared, and sizes are computed, so a bomb costs what its text costs. Syntax errors keep go-yaml's form
(`yaml: line N: <libyaml's problem>`, with go-yaml's line arithmetic) and also carry the exact position.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, cast

import yaml

from kubegpu.settings.gotext import go_float_name, go_format_float32_g, preview

MAX_NODES = 20_000

_EVENT_LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # libyaml's parser when the wheel has it

_TAG = "tag:yaml.org,2002:"
STR, BOOL, INT, FLOAT, NULL, TIMESTAMP, BINARY, MERGE = (
    _TAG + t for t in ("str", "bool", "int", "float", "null", "timestamp", "binary", "merge")
)
_RESOLVABLE = {"", STR, BOOL, INT, FLOAT, NULL, TIMESTAMP}

# go-yaml v2 resolve.go: the plain scalars looked up by value.
_BY_VALUE: dict[str, tuple[str, Any]] = {}
for _value, _tag, _words in (
    (True, BOOL, "y Y yes Yes YES true True TRUE on On ON"),
    (False, BOOL, "n N no No NO false False FALSE off Off OFF"),
    (math.nan, FLOAT, ".nan .NaN .NAN"),
    (math.inf, FLOAT, ".inf .Inf .INF +.inf +.Inf +.INF"),
    (-math.inf, FLOAT, "-.inf -.Inf -.INF"),
    ("<<", MERGE, "<<"),
):
    for _word in _words.split():
        _BY_VALUE[_word] = (_tag, _value)
for _word in ("", "~", "null", "Null", "NULL"):
    _BY_VALUE[_word] = (NULL, None)

_HINTED = set("+-0123456789.yYnNtTfFoO~")  # first characters go-yaml tries to resolve (resolveTable)
_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")  # what Go's ParseFloat takes after a leading '.'
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]{0,18})")
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
_INT64 = 1 << 63
_UINT64 = 1 << 64


class GoYamlError(ValueError):
    """YAML that NVIDIA's loader refuses. `str()` is go-yaml's text; `line`/`column` (1-based) where known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class TooManyNodes(GoYamlError):
    """kubegpu's own bound (MAX_NODES), not go-yaml's."""


@dataclass(slots=True)
class Document:
    """The first document of a YAML stream as go-yaml decodes it."""

    value: Any
    nodes: int  # decode operations go-yaml would run (aliases expanded, the document node included)
    _unsupported: set[int] = field(default_factory=set)  # ids of containers holding a NaN or an infinity

    def unsupported(self, value: Any) -> str | None:
        """The first value JSON cannot carry inside `value` (NaN, +Inf, -Inf, as Go writes them), or None.

        Walks only the containers marked as holding one, without recursion (nesting may be 1,000 deep).
        """
        pending = [value]
        while pending:
            item = pending.pop()
            if isinstance(item, float) and not math.isfinite(item):
                return go_float_name(item)
            if id(item) in self._unsupported:
                pending.extend(item.values() if isinstance(item, dict) else item)
        return None


@dataclass(slots=True)
class _Done:
    """A finished node: its value, decode operations (aliases expanded), shape, and NaN/Inf inside."""

    value: Any
    size: int
    kind: str  # "scalar", "map", "seq", or "maps" (a sequence of mappings: a merge may take it)
    bad: bool
    line: int
    column: int


@dataclass(eq=False, slots=True)
class _Open:
    """A mapping or sequence whose end has not come yet."""

    kind: str  # "map" or "seq"
    line: int
    column: int
    counted: bool  # False for a merge's sequence: go-yaml decodes its items, not it
    children: list[_Done | None] = field(default_factory=list)  # None: a merge key (not decoded)
    done: _Done | None = None  # set when it ends (aliases to it read this)


@dataclass(slots=True)
class _Walk:
    """go-yaml's decode counters, replayed as the events come (decode.go, decoder.unmarshal)."""

    decodes: int = 1  # the document node
    aliased: int = 0

    def step(self, own: int, expanded: int, line: int, column: int) -> None:
        # An alias's expansion is added in one step: inside it every decode counts as aliased, so the
        # aliased share only grows and the allowed share only falls: if the check fails within the run,
        # it fails at its end.
        self.decodes += own + expanded
        self.aliased += expanded
        if (
            self.aliased > 100
            and self.decodes > 1000
            and self.aliased / self.decodes > _allowed_alias_ratio(self.decodes)
        ):
            raise GoYamlError("yaml: document contains excessive aliasing", line, column)


def load(text: str, max_nodes: int = MAX_NODES) -> Document:
    """Decode the first YAML document of `text` as go-yaml v2 would. Raises GoYamlError.

    `max_nodes` is kubegpu's bound (see the module docstring); files larger by nature (a kubeconfig with
    many clusters) pass a larger one.
    """
    builder = _Builder(max_nodes)
    # yaml.parse is a generator (typed as an Iterator): closing it frees libyaml's parser at once.
    events = cast(Generator[yaml.Event, None, None], yaml.parse(text, Loader=_EVENT_LOADER))
    try:
        for event in events:
            if isinstance(event, yaml.DocumentEndEvent):
                break  # go-yaml's Unmarshal reads the first document only
            if isinstance(event, yaml.CollectionEndEvent):
                builder.place(_close(builder.stack.pop(), builder.unsupported))
            elif isinstance(event, yaml.NodeEvent):
                builder.start(event)
    except yaml.MarkedYAMLError as err:
        raise _syntax_error(err) from None
    except yaml.YAMLError as err:  # libyaml's reader: control characters, bad encoding
        raise _reader_error(err, text) from None
    finally:
        events.close()
    return builder.document()


@dataclass
class _Builder:
    """Values built from the event stream as it comes, with go-yaml's counts and checks on the way."""

    max_nodes: int
    stack: list[_Open] = field(default_factory=list)
    anchors: dict[str, _Open | _Done] = field(default_factory=dict)
    unsupported: set[int] = field(default_factory=set)
    walk: _Walk = field(default_factory=_Walk)
    root: _Done | None = None

    def start(self, event: Any) -> None:
        """A scalar, an alias, or the start of a mapping or sequence."""
        line, column = event.start_mark.line + 1, event.start_mark.column + 1
        parent = self.stack[-1] if self.stack else None
        if isinstance(event, yaml.AliasEvent):
            done = _alias(event.anchor or "", self.anchors, line, column)
            self.walk.step(1, done.size - 1, line, column)
            self.place(done)
            return
        if isinstance(event, yaml.ScalarEvent):
            done = _scalar_done(event, line, column)
            if event.anchor is not None:
                self.anchors[event.anchor] = done
            if parent is not None and _expects_merge_key(parent, event):
                parent.children.append(None)  # go-yaml merges the next value; it does not decode the key
                return
            self.walk.step(1, 0, line, column)
            self.place(done)
            return
        kind = "seq" if isinstance(event, yaml.SequenceStartEvent) else "map"
        merged = parent is not None and _expects_merge_value(parent) and kind == "seq"
        opened = _Open(kind, line, column, counted=not merged)  # a merge's sequence is not decoded itself
        if opened.counted:
            self.walk.step(1, 0, line, column)
            self._check_size(line, column)
        if event.anchor is not None:
            self.anchors[event.anchor] = opened
        self.stack.append(opened)

    def place(self, done: _Done) -> None:
        self._check_size(done.line, done.column)
        if self.stack:
            self.stack[-1].children.append(done)
        else:
            self.root = done

    def _check_size(self, line: int, column: int) -> None:
        if self.walk.decodes > self.max_nodes + 1:  # + 1: the document node
            raise _too_many(line, column, self.max_nodes)

    def document(self) -> Document:
        if self.root is None:
            return Document(None, 0)
        return Document(self.root.value, self.walk.decodes, self.unsupported)


def _too_many(line: int, column: int, max_nodes: int) -> TooManyNodes:
    return TooManyNodes(
        f"the document has more than {max_nodes} YAML nodes (aliases expanded), over kubegpu's limit",
        line,
        column,
    )


def _expects_merge_key(parent: _Open, event: Any) -> bool:
    """A plain `<<` (or one tagged !!merge) in a mapping's key position: go-yaml merges, not decodes it."""
    return (
        parent.kind == "map"
        and len(parent.children) % 2 == 0
        and isinstance(event, yaml.ScalarEvent)
        and event.value == "<<"
        and ((event.tag is None and event.implicit[0]) or event.tag == MERGE)
    )


def _expects_merge_value(parent: _Open) -> bool:
    return parent.kind == "map" and len(parent.children) % 2 == 1 and parent.children[-1] is None


def _alias(name: str, anchors: dict[str, _Open | _Done], line: int, column: int) -> _Done:
    target = anchors.get(name)
    if target is None:
        raise GoYamlError(f"yaml: unknown anchor '{name}' referenced", line, column)
    if isinstance(target, _Open):
        if target.done is None:  # still open: the alias sits inside its own anchor
            raise GoYamlError(f"yaml: anchor '{name}' value contains itself", line, column)
        target = target.done
    # The value is shared, not copied: its expansion is counted (size), never built.
    return _Done(target.value, 1 + target.size, target.kind, target.bad, line, column)


def _scalar_done(event: Any, line: int, column: int) -> _Done:
    value = _scalar(event, line, column)
    bad = isinstance(value, float) and not math.isfinite(value)
    return _Done(value, 1, "scalar", bad, line, column)


def _close(opened: _Open, unsupported: set[int]) -> _Done:
    children = opened.children
    size = 1 if opened.counted else 0
    bad = False
    value: Any
    if opened.kind == "seq":
        items = [c for c in children if c is not None]
        value = [c.value for c in items]
        size += sum(c.size for c in items)
        bad = any(c.bad for c in items)
        kind = "maps" if items and all(c.kind == "map" for c in items) else "seq"
    else:
        value = {}
        for key, item in zip(children[0::2], children[1::2], strict=False):
            if item is None:
                continue
            size += item.size
            bad = bad or item.bad
            if key is None:  # a merge: its mapping's keys are written into this one, as they come
                _merge(value, item)
                continue
            size += key.size
            value[_json_key(key)] = item.value
        kind = "map"
    if bad:
        unsupported.add(id(value))
    opened.done = _Done(value, size, kind, bad, opened.line, opened.column)
    return opened.done


def _merge(into: dict[str, Any], source: _Done) -> None:
    if source.kind == "map":
        into.update(source.value)
    elif source.kind == "maps" or (source.kind == "seq" and not source.value):
        for item in reversed(source.value):  # earlier mappings take precedence: written last
            into.update(item)
    else:
        raise GoYamlError(
            "yaml: map merge requires map or sequence of maps as the value", source.line, source.column
        )


def _syntax_error(err: yaml.MarkedYAMLError) -> GoYamlError:
    # go-yaml's parser.fail(): the problem's line, plus one for scanner errors, else the context's line
    # (go-yaml's lines start at 0 there, hence its well-known off-by-one on parser errors).
    problem = err.problem or "unknown problem parsing YAML content"
    mark = err.problem_mark or err.context_mark
    line = 0
    if err.problem_mark is not None and err.problem_mark.line != 0:
        line = err.problem_mark.line + (1 if isinstance(err, yaml.scanner.ScannerError) else 0)
    elif err.context_mark is not None and err.context_mark.line != 0:
        line = err.context_mark.line
    where = f"line {line}: " if line else ""
    return GoYamlError(
        f"yaml: {where}{problem}",
        mark.line + 1 if mark is not None else None,
        mark.column + 1 if mark is not None else None,
    )


def _reader_error(err: yaml.YAMLError, text: str) -> GoYamlError:
    reason = getattr(err, "reason", None) or str(err)
    position = getattr(err, "position", None)
    if not isinstance(position, int):
        return GoYamlError(f"yaml: {reason}")
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    character = getattr(err, "character", None)
    shown = f" (character {character!r})" if isinstance(character, str) else ""
    return GoYamlError(f"yaml: {reason}{shown}", line, column)


def _allowed_alias_ratio(decodes: int) -> float:
    """go-yaml v2 decode.go allowedAliasRatio."""
    if decodes <= 400_000:
        return 0.99
    if decodes >= 4_000_000:
        return 0.10
    return 0.99 - 0.89 * ((decodes - 400_000) / 3_600_000)


def _json_key(key: _Done) -> str:
    """sigs.k8s.io/yaml's conversion of a YAML key to a JSON object key."""
    value = key.value
    if key.kind != "scalar":
        raise GoYamlError(f"yaml: invalid map key: {preview(value, 60)}", key.line, key.column)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_format_float32_g(value)
    message = "yaml: a mapping key is null (~, null or nothing before the colon); name the key"
    raise GoYamlError(message, key.line, key.column)


def _scalar(event: Any, line: int, column: int) -> Any:
    text = event.value
    if event.tag is None and event.implicit[0]:
        return _resolve(text)[1]  # plain: go-yaml resolves it by its text
    tag = "" if event.tag in (None, "!") else event.tag
    if tag == "":
        return text  # quoted, or tagged "!": a string
    if tag == BINARY:
        try:
            data = base64.b64decode(text.replace("\n", "").replace("\r", ""), validate=True)
        except (binascii.Error, ValueError):
            raise GoYamlError("yaml: !!binary value contains invalid base64 data", line, column) from None
        return data.decode("utf-8", "replace")
    if tag not in _RESOLVABLE or tag == STR:
        return text  # go-yaml keeps the text of a string or an unknown tag
    resolved_tag, value = _resolve(text)
    if resolved_tag == tag or (tag == TIMESTAMP and resolved_tag == STR and _looks_like_date(text)):
        return value
    if tag == FLOAT and resolved_tag == INT:
        return float(value)
    message = f"yaml: cannot decode {_short_tag(resolved_tag)} `{text}` as a {_short_tag(tag)}"
    raise GoYamlError(message, line, column)


def _looks_like_date(text: str) -> bool:
    return re.match(r"\d{4}-\d{1,2}-\d{1,2}", text) is not None


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag


def resolve_plain(text: str) -> Any:
    """A plain scalar's value as go-yaml v2 resolves it (resolve.go, tag "")."""
    return _resolve(text)[1]


def _resolve(text: str) -> tuple[str, Any]:
    if text[:1] not in _HINTED and text != "":
        return STR, text
    if _DECIMAL.fullmatch(text):  # the common case, without the general parser
        number = int(text)
        if -_INT64 <= number < _UINT64:
            return INT, number
    if text in _BY_VALUE:
        return _BY_VALUE[text]
    hint = text[0]
    if hint == ".":
        if _DOT_FLOAT.fullmatch(text):
            value = float(text)
            if math.isfinite(value):
                return FLOAT, value
        return STR, text
    if hint in "+-0123456789":
        plain = text.replace("_", "")
        parsed = go_parse_int(plain)
        if parsed is None:
            parsed = go_parse_uint(plain)
        if parsed is not None:
            return INT, parsed
        if _YAML_FLOAT.fullmatch(plain):
            value = float(plain)
            if math.isfinite(value):  # Go's ParseFloat fails on overflow, leaving a string
                return FLOAT, value
        big = _go_parse_big(plain)  # sigs.k8s.io/yaml's go-yaml keeps integers past 64 bits as big.Int
        if big is not None:
            return INT, big
    return STR, text


def _go_digits(text: str) -> tuple[int, str] | None:
    """Go's strconv base-0 prefix rules: 0x/0o/0b, a leading 0 is octal. (base, digits) or None."""
    if text == "":
        return None
    if text[0] == "0":
        if len(text) >= 3 and text[1] in "xX":
            return 16, text[2:]
        if len(text) >= 3 and text[1] in "oO":
            return 8, text[2:]
        if len(text) >= 3 and text[1] in "bB":
            return 2, text[2:]
        return 8, text[1:]
    return 10, text


def _go_unsigned(text: str) -> int | None:
    """The magnitude of an unsigned base-0 Go integer, any size, or None when it is not one."""
    parsed = _go_digits(text)
    if parsed is None:
        return None
    base, digits = parsed
    if digits == "" and base != 8:
        return None
    if any(c not in _DIGITS[base] for c in digits):
        return None
    return int(digits, base) if digits else 0


def _split_sign(text: str) -> tuple[bool, str]:
    if text[:1] in ("+", "-"):
        return text[0] == "-", text[1:]
    return False, text


def go_parse_int(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 0, 64), or None when it fails."""
    negative, rest = _split_sign(text)
    magnitude = _go_unsigned(rest)
    if magnitude is None or magnitude > (_INT64 if negative else _INT64 - 1):
        return None
    return -magnitude if negative else magnitude


def go_parse_uint(text: str) -> int | None:
    """Go's strconv.ParseUint(text, 0, 64), or None when it fails (no sign allowed)."""
    magnitude = _go_unsigned(text)
    return magnitude if magnitude is not None and magnitude < _UINT64 else None


def _go_parse_big(text: str) -> int | None:
    negative, rest = _split_sign(text)
    magnitude = _go_unsigned(rest)
    if magnitude is None:
        return None
    return -magnitude if negative else magnitude
