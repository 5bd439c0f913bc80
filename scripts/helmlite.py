"""A small, strict renderer for the subset of Helm's Go templates that deployments/helm/kubegpu uses.

Why it exists: CI has no helm binary, yet it must prove that the static manifests are what the chart
produces. Rather than trusting hand-copied YAML, tests render the chart with this and compare.

Usage:
    python scripts/helmlite.py template CHART [-f VALUES]... [--set-file KEY=PATH]... [--set KEY=YAML]...
                               [--name RELEASE] [--namespace NS] [-s templates/FILE]...

Output has `helm template`'s shape (`---` / `# Source:` / manifest, in Helm's install order by kind).

Supported, and nothing else (anything outside raises TemplateError instead of rendering wrongly):
- text with `{{ }}` actions, `{{- ` / ` -}}` whitespace trimming, `{{/* comments */}}`;
- `if` / `else if` / `else`, `with` / `else`, `range` over lists and maps (`$v :=`, `$k, $v :=`), `end`,
  `define` + `include` (not `template` or `block`);
- `$`, `$var := pipeline`, `$var = pipeline`, pipelines with `|`, parenthesised sub-pipelines, field
  chains (`.Values.a.b`, `$.Values`, `$var.a`), string / integer / true / false / nil literals;
- functions (sprig / Helm semantics): and or not eq ne empty default required fail include toYaml toJson
  indent nindent quote printf trim trunc trimSuffix trimPrefix contains has hasKey join len replace
  sha256sum kindIs lower upper toString list dict.
Values are loaded like Helm does: chart defaults, then each -f file, then --set, then --set-file, deep-merged
(a null removes the key); the result is validated against values.schema.json when the chart has one.

Known differences from Helm, none of which the chart relies on: numbers from values print as Python
ints (Helm's float64 prints 1000000 as 1e+06); toYaml's quoting style is PyYAML's (the parsed values are
the same); `.Capabilities` and `.Files` are absent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """A template or value the renderer cannot or must not render (includes the chart's own `fail`)."""


# ---------------------------------------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(- )?(.*?)( -)?\}\}", re.S)
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<pipe>\|)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<comma>,)
  | (?P<num>-?\d+)
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
  | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.X,
)
_KEYWORDS = {"if", "else", "end", "with", "range", "define"}
_UNSUPPORTED = {"template", "block", "break", "continue"}


@dataclass
class _Tok:
    kind: str
    text: str


def _tokens(source: str, where: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if not m:
            raise TemplateError(f"{where}: cannot parse {source[pos:]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append(_Tok(m.lastgroup or "", m.group()))
    return out


def _split(source: str, name: str) -> Iterator[tuple[str, str, str]]:
    """(kind, content, where): kind is "text" or "action"; trim markers already applied to the text."""
    pieces: list[list[str]] = []  # [kind, content, where]
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(source):
        text = source[pos : m.start()]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        pieces.append(["text", text, ""])
        line = source.count("\n", 0, m.start()) + 1
        pieces.append(["action", m.group(2).strip(), f"{name}:{line}"])
        trim_next = bool(m.group(3))
        pos = m.end()
    text = source[pos:]
    if trim_next:
        text = text.lstrip(" \t\r\n")
    pieces.append(["text", text, ""])
    for kind, content, where in pieces:
        if "{{" in content and kind == "text":
            raise TemplateError(f"{name}: unterminated action near {content[content.index('{{') :][:40]!r}")
        yield kind, content, where


# --------------------------------------------------------------------------------------------- parsing


@dataclass
class _Operand:
    kind: str  # field, var, str, num, bool, nil, ident, sub
    value: Any = None
    fields: tuple[str, ...] = ()


@dataclass
class _Pipeline:
    where: str
    cmds: list[list[_Operand]]
    decl: list[str] = field(default_factory=list)
    assign: bool = False  # `=` rather than `:=`


@dataclass
class _Text:
    text: str


@dataclass
class _Output:
    pipe: _Pipeline


@dataclass
class _If:
    branches: list[tuple[_Pipeline, list[Any]]]
    otherwise: list[Any] | None = None


@dataclass
class _With:
    pipe: _Pipeline
    body: list[Any]
    otherwise: list[Any] | None = None


@dataclass
class _Range:
    pipe: _Pipeline
    body: list[Any]
    otherwise: list[Any] | None = None


def _unquote(text: str, where: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    try:
        return json.loads(text)  # Go's escapes in the subset we allow (\" \\ \n \t \uXXXX) are JSON's
    except json.JSONDecodeError as err:
        raise TemplateError(f"{where}: bad string literal {text}") from err


class _Parser:
    def __init__(self, toks: list[_Tok], where: str) -> None:
        self.toks, self.i, self.where = toks, 0, where

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str | None = None) -> _Tok:
        tok = self.peek()
        if tok is None or (kind and tok.kind != kind):
            raise TemplateError(f"{self.where}: expected {kind or 'more'}, got {tok.text if tok else 'end'}")
        self.i += 1
        return tok

    def pipeline(self, allow_decl: bool = True, stop: str | None = None) -> _Pipeline:
        pipe = _Pipeline(self.where, [])
        if allow_decl:
            j, names = self.i, []
            while j < len(self.toks) and self.toks[j].kind == "var":
                names.append(self.toks[j].text)
                if j + 1 < len(self.toks) and self.toks[j + 1].kind == "comma":
                    j += 2
                    continue
                j += 1
                break
            if names and j < len(self.toks) and self.toks[j].kind in ("decl", "assign"):
                if any("." in n for n in names):
                    raise TemplateError(f"{self.where}: cannot assign to a field")
                pipe.decl, pipe.assign = names, self.toks[j].kind == "assign"
                self.i = j + 1
        cmd: list[_Operand] = []
        while (tok := self.peek()) is not None and tok.kind != stop:
            self.i += 1
            if tok.kind == "pipe":
                if not cmd:
                    raise TemplateError(f"{self.where}: empty command before |")
                pipe.cmds.append(cmd)
                cmd = []
            elif tok.kind == "lparen":
                sub = self.pipeline(allow_decl=False, stop="rparen")
                self.take("rparen")
                cmd.append(_Operand("sub", sub))
            elif tok.kind in ("str", "raw"):
                cmd.append(_Operand("str", _unquote(tok.text, self.where)))
            elif tok.kind == "num":
                cmd.append(_Operand("num", int(tok.text)))
            elif tok.kind == "field":
                names = tuple(n for n in tok.text.split(".") if n)
                cmd.append(_Operand("field", fields=names))
            elif tok.kind == "var":
                head, *rest = tok.text.split(".")
                cmd.append(_Operand("var", head, tuple(rest)))
            elif tok.kind == "ident":
                if tok.text in ("true", "false"):
                    cmd.append(_Operand("bool", tok.text == "true"))
                elif tok.text == "nil":
                    cmd.append(_Operand("nil"))
                elif tok.text in _KEYWORDS or tok.text in _UNSUPPORTED:
                    raise TemplateError(f"{self.where}: unexpected keyword {tok.text}")
                else:
                    cmd.append(_Operand("ident", tok.text))
            else:
                raise TemplateError(f"{self.where}: unexpected {tok.text!r}")
        if not cmd:
            raise TemplateError(f"{self.where}: empty pipeline")
        pipe.cmds.append(cmd)
        return pipe


def _parse(source: str, name: str, defines: dict[str, list[Any]]) -> list[Any]:
    root: list[Any] = []
    # Stack frames: (node, kind, list currently appended to).
    stack: list[tuple[Any, str, list[Any]]] = []
    body = root
    for kind, content, where in _split(source, name):
        if kind == "text":
            if content:
                body.append(_Text(content))
            continue
        if content.startswith("/*"):
            if not content.endswith("*/"):
                raise TemplateError(f"{where}: unterminated comment")
            continue
        toks = _tokens(content, where)
        if not toks:
            raise TemplateError(f"{where}: empty action")
        head = toks[0].text if toks[0].kind == "ident" else ""
        parser = _Parser(toks[1:], where)
        if head in _UNSUPPORTED:
            raise TemplateError(f"{where}: `{head}` is not supported by helmlite; use include")
        if head == "if":
            node = _If([(parser.pipeline(), [])])
            body.append(node)
            stack.append((node, "if", body))
            body = node.branches[0][1]
        elif head == "with":
            node = _With(parser.pipeline(), [])
            body.append(node)
            stack.append((node, "with", body))
            body = node.body
        elif head == "range":
            node = _Range(parser.pipeline(), [])
            body.append(node)
            stack.append((node, "range", body))
            body = node.body
        elif head == "define":
            if stack:
                raise TemplateError(f"{where}: define must be at the top level")
            tname = _unquote(parser.take("str").text, where)
            node = []
            defines[tname] = node
            stack.append((node, "define", body))
            body = node
        elif head == "else":
            if not stack or stack[-1][1] == "define":
                raise TemplateError(f"{where}: else without if/with/range")
            node = stack[-1][0]
            if len(toks) > 1 and toks[1].text == "if":
                if not isinstance(node, _If) or node.otherwise is not None:
                    raise TemplateError(f"{where}: else if outside an if")
                sub = _Parser(toks[2:], where)
                node.branches.append((sub.pipeline(), []))
                body = node.branches[-1][1]
            else:
                if len(toks) > 1 or node.otherwise is not None:
                    raise TemplateError(f"{where}: bad else")
                node.otherwise = []
                body = node.otherwise
        elif head == "end":
            if not stack or len(toks) > 1:
                raise TemplateError(f"{where}: end without a block")
            _, _, body = stack.pop()
        else:
            body.append(_Output(_Parser(toks, where).pipeline()))
    if stack:
        raise TemplateError(f"{name}: {stack[-1][1]} without end")
    return root


# ------------------------------------------------------------------------------------------ evaluation


def _truth(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (isinstance(value, dict | list) and not value)


def _go_quote(text: str) -> str:
    """strconv.Quote, for the characters a manifest can hold."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def _to_text(value: Any, where: str) -> str:
    if value is None:
        return ""  # Helm turns Go's "<no value>" into nothing
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise TemplateError(f"{where}: refusing to print a {type(value).__name__} (use toYaml)")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as go-yaml (Helm's toYaml) writes them."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def _to_yaml(value: Any) -> str:
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=False, sort_keys=True, width=1 << 30, allow_unicode=True
    )
    if text.endswith("\n...\n"):  # PyYAML's document end marker after a bare scalar
        text = text[: -len("...\n")]
    return text.removesuffix("\n")


def _to_json(value: Any) -> str:
    """Go's encoding/json output: sorted keys, compact, HTML characters escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028")):
        text = text.replace(ch, esc)
    return text.replace("\u2029", "\\u2029")


def _printf(fmt: str, *args: Any) -> str:
    it = iter(args)

    def one(m: re.Match[str]) -> str:
        verb = m.group(1)
        if verb == "%":
            return "%"
        value = next(it)
        if verb == "q":
            return _go_quote(str(value))
        if verb == "d" and not isinstance(value, int):
            raise TemplateError(f"printf %d of {value!r}")
        return _to_text(value, "printf")

    try:
        out = re.sub(r"%([sdvq%])", one, fmt)
    except StopIteration:
        raise TemplateError(f"printf {fmt!r}: missing arguments") from None
    if next(it, _MISSING) is not _MISSING:
        raise TemplateError(f"printf {fmt!r}: too many arguments")
    return out


_MISSING = object()


def _kind(value: Any) -> str:
    if value is None:
        return "invalid"
    for kind, types in (("bool", bool), ("int", int), ("float64", float), ("string", str)):
        if isinstance(value, types):
            return kind
    return "map" if isinstance(value, dict) else "slice" if isinstance(value, list) else "unknown"


def _trunc(n: int, text: str) -> str:
    if n >= 0:
        return text[:n]
    return text[n:] if len(text) > -n else text


def _required(msg: str, value: Any) -> Any:
    if value is None or value == "":
        raise TemplateError(msg)
    return value


def _fail(msg: str) -> Any:
    raise TemplateError(msg)


def _eq(a: Any, *others: Any) -> bool:
    if not others:
        raise TemplateError("eq needs two arguments")
    for b in others:
        if None not in (a, b) and _kind(a) != _kind(b):  # Go refuses to compare different basic kinds
            raise TemplateError(f"eq: incompatible types {a!r} and {b!r}")
        if a == b:
            return True
    return False


def _indent(n: int, text: str) -> str:
    pad = " " * n
    return pad + text.replace("\n", "\n" + pad)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "not": lambda v: not _truth(v),
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "empty": lambda v: not _truth(v),
    "default": lambda d, *v: v[0] if v and _truth(v[0]) else d,
    "required": _required,
    "fail": _fail,
    "toYaml": _to_yaml,
    "toJson": _to_json,
    "indent": _indent,
    "nindent": lambda n, text: "\n" + _indent(n, text),
    "quote": lambda *vs: " ".join(_go_quote(_to_text(v, "quote")) for v in vs if v is not None),
    "printf": _printf,
    "trunc": _trunc,
    "trim": lambda text: text.strip(" \t\n\r\v\f"),
    "trimSuffix": lambda suffix, text: text.removesuffix(suffix),
    "trimPrefix": lambda prefix, text: text.removeprefix(prefix),
    "contains": lambda sub, text: sub in text,
    "has": lambda item, items: item in (items or []),
    "hasKey": lambda mapping, key: key in mapping,
    "join": lambda sep, items: sep.join(_to_text(i, "join") for i in (items or [])),
    "len": len,
    "replace": lambda old, new, text: text.replace(old, new),
    "sha256sum": lambda text: hashlib.sha256(text.encode()).hexdigest(),
    "kindIs": lambda kind, v: _kind(v) == kind,
    "lower": lambda text: text.lower(),
    "upper": lambda text: text.upper(),
    "toString": lambda v: _to_text(v, "toString"),
    "list": lambda *vs: list(vs),
    "dict": lambda *kv: dict(zip(kv[::2], kv[1::2], strict=True)),
}


class _Scope:
    def __init__(self, root: Any) -> None:
        self.frames: list[dict[str, Any]] = [{"$": root}]

    def lookup(self, name: str, where: str) -> Any:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        raise TemplateError(f"{where}: undefined variable {name}")

    def assign(self, name: str, value: Any, where: str) -> None:
        for frame in reversed(self.frames):
            if name in frame:
                frame[name] = value
                return
        raise TemplateError(f"{where}: assignment to undeclared {name}")


def _walk(value: Any, names: tuple[str, ...], where: str) -> Any:
    for name in names:
        if value is None:
            raise TemplateError(f"{where}: nil pointer evaluating .{name}")
        if not isinstance(value, dict):
            raise TemplateError(f"{where}: can't evaluate field {name} in a {type(value).__name__}")
        value = value.get(name)
    return value


class Renderer:
    """Renders named templates (from every file of a chart) against one top-level object."""

    def __init__(self, defines: dict[str, list[Any]]) -> None:
        self.defines = defines
        self.depth = 0

    def run(self, nodes: list[Any], dot: Any, scope: _Scope) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, _Text):
                out.append(node.text)
            elif isinstance(node, _Output):
                value = self.pipeline(node.pipe, dot, scope)
                if not node.pipe.decl:
                    out.append(_to_text(value, node.pipe.where))
            elif isinstance(node, _If):
                scope.frames.append({})
                try:
                    for cond, body in node.branches:
                        if _truth(self.pipeline(cond, dot, scope)):
                            out.append(self.run(body, dot, scope))
                            break
                    else:
                        if node.otherwise is not None:
                            out.append(self.run(node.otherwise, dot, scope))
                finally:
                    scope.frames.pop()
            elif isinstance(node, _With):
                scope.frames.append({})
                try:
                    value = self.pipeline(node.pipe, dot, scope)
                    if _truth(value):
                        out.append(self.run(node.body, value, scope))
                    elif node.otherwise is not None:
                        out.append(self.run(node.otherwise, dot, scope))
                finally:
                    scope.frames.pop()
            elif isinstance(node, _Range):
                out.append(self.range(node, dot, scope))
        return "".join(out)

    def range(self, node: _Range, dot: Any, scope: _Scope) -> str:
        decl = node.pipe.decl
        node.pipe.decl = []  # the variables are per element, not the whole value
        try:
            value = self.pipeline(node.pipe, dot, scope)
        finally:
            node.pipe.decl = decl
        if value is None:
            items: list[tuple[Any, Any]] = []
        elif isinstance(value, dict):
            items = sorted(value.items())  # Go ranges over maps in key order
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        else:
            raise TemplateError(f"{node.pipe.where}: range over a {type(value).__name__}")
        if not items:
            return self.run(node.otherwise, dot, scope) if node.otherwise is not None else ""
        out = []
        for key, element in items:
            frame: dict[str, Any] = {}
            if len(decl) == 1:
                frame[decl[0]] = element
            elif len(decl) == 2:
                frame[decl[0]], frame[decl[1]] = key, element
            scope.frames.append(frame)
            try:
                out.append(self.run(node.body, element, scope))
            finally:
                scope.frames.pop()
        return "".join(out)

    def pipeline(self, pipe: _Pipeline, dot: Any, scope: _Scope) -> Any:
        value: Any = _MISSING
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, scope, value, pipe.where)
        for name in pipe.decl:
            if pipe.assign:
                scope.assign(name, value, pipe.where)
            else:
                scope.frames[-1][name] = value
        return value

    def operand(self, op: _Operand, dot: Any, scope: _Scope, where: str) -> Any:
        if op.kind == "field":
            return _walk(dot, op.fields, where)
        if op.kind == "var":
            return _walk(scope.lookup(op.value, where), op.fields, where)
        if op.kind == "sub":
            return self.pipeline(op.value, dot, scope)
        if op.kind == "ident":
            return self.call(op.value, [], dot, scope, where)
        return op.value  # str, num, bool, nil

    def command(self, cmd: list[_Operand], dot: Any, scope: _Scope, piped: Any, where: str) -> Any:
        head = cmd[0]
        if head.kind != "ident":
            if len(cmd) > 1 or piped is not _MISSING:
                raise TemplateError(f"{where}: can't give arguments to a non-function")
            return self.operand(head, dot, scope, where)
        if head.value in ("and", "or"):  # Go evaluates these lazily and returns the deciding operand
            args = [lambda op=op: self.operand(op, dot, scope, where) for op in cmd[1:]]
            if piped is not _MISSING:
                args.append(lambda: piped)
            if len(args) < 2:
                raise TemplateError(f"{where}: {head.value} needs two arguments")
            value = None
            for arg in args:
                value = arg()
                if _truth(value) != (head.value == "and"):
                    return value
            return value
        args = [self.operand(op, dot, scope, where) for op in cmd[1:]]
        if piped is not _MISSING:
            args.append(piped)
        return self.call(head.value, args, dot, scope, where)

    def call(self, name: str, args: list[Any], dot: Any, scope: _Scope, where: str) -> Any:
        if name == "include":
            if len(args) != 2:
                raise TemplateError(f"{where}: include takes a name and a value")
            return self.include(args[0], args[1], where)
        func = FUNCTIONS.get(name)
        if func is None:
            raise TemplateError(f"{where}: function {name!r} is not supported by helmlite")
        try:
            return func(*args)
        except TemplateError as err:
            raise TemplateError(f"{where}: {err}") from None
        except (TypeError, AttributeError) as err:
            raise TemplateError(f"{where}: {name}: {err}") from None

    def include(self, name: str, data: Any, where: str) -> str:
        body = self.defines.get(name)
        if body is None:
            raise TemplateError(f"{where}: no template named {name!r}")
        self.depth += 1
        if self.depth > 100:
            raise TemplateError(f"{where}: include nested too deeply")
        try:
            return self.run(body, data, _Scope(data))
        finally:
            self.depth -= 1


# -------------------------------------------------------------------------------------- charts, values


@dataclass
class Chart:
    path: Path
    metadata: dict[str, Any]
    values: dict[str, Any]
    schema: dict[str, Any] | None
    templates: dict[str, str]  # "templates/x.yaml" -> source
    _parsed: tuple[dict[str, list[Any]], dict[str, list[Any]]] | None = field(default=None, repr=False)

    def parsed(self) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """(template name -> nodes, define name -> nodes), parsed once: rendering never changes them."""
        if self._parsed is None:
            defines: dict[str, list[Any]] = {}
            nodes = {name: _parse(src, name, defines) for name, src in self.templates.items()}
            self._parsed = (nodes, defines)
        return self._parsed


def load_chart(path: str | Path) -> Chart:
    root = Path(path)
    metadata = yaml.safe_load((root / "Chart.yaml").read_text())
    values = yaml.safe_load((root / "values.yaml").read_text()) or {}
    schema_file = root / "values.schema.json"
    schema = json.loads(schema_file.read_text()) if schema_file.exists() else None
    templates = {
        f"templates/{p.relative_to(root / 'templates').as_posix()}": p.read_text()
        for p in sorted((root / "templates").rglob("*"))
        if p.is_file() and p.suffix in (".yaml", ".yml", ".tpl")
    }
    return Chart(root, metadata, values, schema, templates)


def coalesce(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over defaults: maps merge, anything else replaces, null deletes."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = value
    return out


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    *parents, last = dotted.split(".")
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[last] = value
    return out


def merge_values(
    chart: Chart,
    values_files: Sequence[str | Path] = (),
    set_values: dict[str, Any] | None = None,
    set_files: dict[str, str | Path] | None = None,
) -> dict[str, Any]:
    values = chart.values
    for f in values_files:
        values = coalesce(values, yaml.safe_load(Path(f).read_text()) or {})
    for key, value in (set_values or {}).items():
        values = coalesce(values, _nested(key, value))
    for key, path in (set_files or {}).items():
        values = coalesce(values, _nested(key, Path(path).read_text()))
    return values


def validate_values(chart: Chart, values: dict[str, Any]) -> None:
    if chart.schema is None:
        return
    import jsonschema  # only needed when validating; the renderer itself needs PyYAML alone

    errors = sorted(jsonschema.Draft7Validator(chart.schema).iter_errors(values), key=lambda e: e.path)
    if errors:
        lines = [f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors]
        raise TemplateError("values don't meet the specifications of the schema:\n" + "\n".join(lines))


# Helm's InstallOrder (pkg/release/util/kind_sorter.go); unknown kinds go last, alphabetically.
_INSTALL_ORDER = (
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)


@dataclass
class Manifest:
    source: str  # "kubegpu/templates/x.yaml"
    text: str
    obj: dict[str, Any]


def render(
    chart: Chart,
    values: dict[str, Any],
    release: str = "release-name",
    namespace: str = "default",
    show_only: list[str] | None = None,
    validate: bool = True,
) -> list[Manifest]:
    if validate:
        validate_values(chart, values)
    parsed, defines = chart.parsed()
    meta = {k[:1].upper() + k[1:]: v for k, v in chart.metadata.items()}
    chart_name = chart.metadata["name"]
    manifests: list[Manifest] = []
    for name, nodes in parsed.items():
        top = {
            "Values": values,
            "Release": {
                "Name": release,
                "Namespace": namespace,
                "Service": "Helm",
                "IsInstall": True,
                "IsUpgrade": False,
            },
            "Chart": meta,
            "Template": {"Name": f"{chart_name}/{name}", "BasePath": f"{chart_name}/templates"},
        }
        text = Renderer(defines).run(nodes, top, _Scope(top))  # every file runs: validation templates fail
        if Path(name).name.startswith("_") or (show_only and name not in show_only):
            continue
        for doc in re.split(r"(?:^|\n)---[ \t]*(?=\n|$)", text):
            doc = doc.strip()
            if not doc:
                continue
            try:
                obj = yaml.safe_load(
                    doc + "\n"
                )  # as printed and applied: a final block scalar keeps its newline
            except yaml.YAMLError as err:
                raise TemplateError(f"{name} rendered invalid YAML: {err}\n{doc}") from None
            if obj is None:
                continue
            if not isinstance(obj, dict) or "kind" not in obj:
                raise TemplateError(f"{name} rendered a document without a kind:\n{doc}")
            manifests.append(Manifest(f"{chart_name}/{name}", doc, obj))
    if show_only:
        missing = set(show_only) - set(parsed)
        if missing:
            raise TemplateError(f"could not find template(s) {sorted(missing)} in chart")

    def order(m: Manifest) -> tuple[int, str]:
        kind = m.obj["kind"]
        return (_INSTALL_ORDER.index(kind), "") if kind in _INSTALL_ORDER else (len(_INSTALL_ORDER), kind)

    return sorted(manifests, key=order)  # stable: same kind keeps template order, as in Helm


def format_manifests(manifests: list[Manifest]) -> str:
    return "".join(f"---\n# Source: {m.source}\n{m.text}\n" for m in manifests)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("template", help="render a chart like `helm template`")
    t.add_argument("chart")
    t.add_argument("-f", "--values", action="append", default=[])
    t.add_argument("--set", action="append", default=[], help="KEY=VALUE, VALUE parsed as YAML")
    t.add_argument("--set-file", action="append", default=[], help="KEY=PATH")
    t.add_argument("-s", "--show-only", action="append", default=[])
    t.add_argument("--name", default="release-name")
    t.add_argument("-n", "--namespace", default="default")
    args = ap.parse_args(argv)
    chart = load_chart(args.chart)
    try:
        set_values = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
        set_files = dict(s.split("=", 1) for s in args.set_file)
        values = merge_values(chart, args.values, set_values, set_files)
        out = render(chart, values, args.name, args.namespace, args.show_only or None)
    except TemplateError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(format_manifests(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
