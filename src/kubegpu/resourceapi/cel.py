"""DRA's CEL environment for device selectors, on cel-python (celpy), the pure-Python CEL implementation.

What an expression sees (k8s.io/dynamic-resource-allocation/cel, compile.go):
- `device.driver` (string); `device.attributes["<domain>"].<name>` (int, bool, string, or a semver for
  `version` attributes); `device.capacity["<domain>"].<name>` (a quantity). Attribute and capacity names
  without a domain are under the driver's. An unknown domain gives an empty map; an unknown name is an
  evaluation error, which aborts allocation (so robust selectors check with `has()` or `in`).
- `cel.bind(name, value, expr)` (cel-go's ext.Bindings, enabled for DRA).
- The Kubernetes CEL libraries selectors use in practice: quantity (`quantity`, `isQuantity`, `sign`,
  `isInteger`, `asInteger`, `asApproximateFloat`, `add`, `sub`, `compareTo`, `isGreaterThan`,
  `isLessThan`), semver (`semver`, `isSemver`, `major`, `minor`, `patch`, `compareTo`, `isGreaterThan`,
  `isLessThan`), cel-go's strings extension (`charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`,
  `replace`, `split`, `substring`, `trim`, `join`), the Kubernetes lists library (`isSorted`, `sum`, `max`,
  `indexOf`, `lastIndexOf`; `min` is celpy's own) and regex (`find`, `findAll`), on top of CEL's standard
  functions and macros.
Not available: `sets.*`, `url`, `ip`/`cidr`, `format`, optional types, and cost limits (celpy has no
cost model; selectors here are short and evaluated on a handful of devices).

Compilation checks what the Kubernetes type checker would reject and celpy would only find at run time:
syntax, identifiers other than `device` (and macro/bind variables), unknown functions, and fields of
`device` other than driver/attributes/capacity. Type errors inside the maps are found at evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import celpy
import lark
import lark.exceptions
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, base_functions

from kubegpu.resourceapi.cel_device import MISSING, CelError, DeviceActivation, device_activation
from kubegpu.resourceapi.cel_library import KUBERNETES_FUNCTIONS, eval_error, type_name

__all__ = [
    "DEVICE_FIELDS",
    "KNOWN_FUNCTIONS",
    "CelError",
    "DeviceActivation",
    "Selector",
    "attribute_references",
    "compile_error",
    "compile_selector",
    "device_activation",
]

DEVICE_FIELDS = ("driver", "attributes", "capacity")
_MACROS = frozenset({"has", "dyn", "map", "filter", "all", "exists", "exists_one", "min", "reduce"})
_BINDERS = frozenset({"map", "filter", "all", "exists", "exists_one"})


KNOWN_FUNCTIONS = frozenset(KUBERNETES_FUNCTIONS) | frozenset(base_functions) | _MACROS


# ---- compiling and evaluating ------------------------------------------------------------------


class _Evaluator(Evaluator):
    """celpy's evaluator plus the `cel.bind(var, init, expr)` macro."""

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        return _Evaluator(ast, activation=self.activation)

    def member_dot_arg(self, tree: lark.Tree) -> Any:
        member, method = tree.children[0], tree.children[1]
        if getattr(method, "value", None) == "bind" and _ident_of(member) == "cel":
            args = tree.children[2].children if len(tree.children) > 2 else []
            name = _ident_of(args[0]) if len(args) == 3 else None
            if name is None:
                return eval_error("cel.bind() needs a variable name, a value and an expression")
            value = self.visit(args[1])
            if isinstance(value, CELEvalError):
                return value
            return self.sub_evaluator(args[2]).evaluate({name: value})
        return super().member_dot_arg(tree)


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _Evaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


_ENVIRONMENT = celpy.Environment(runner_class=_Runner)


def _ident_of(tree: Any) -> str | None:
    """The identifier an expression consists of, or None when it is anything else."""
    node = tree
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _walk(tree: lark.Tree) -> Iterator[lark.Tree]:
    yield tree
    for child in tree.children:
        if isinstance(child, lark.Tree):
            yield from _walk(child)


def _static_check(ast: lark.Tree) -> str | None:
    """What the Kubernetes type checker would reject that celpy only finds when evaluating."""
    bound = {"device"}
    for node in _walk(ast):
        if node.data == "member_dot_arg":
            method = str(node.children[1])
            args = node.children[2].children if len(node.children) > 2 else []
            if (method in _BINDERS or (method == "bind" and _ident_of(node.children[0]) == "cel")) and args:
                name = _ident_of(args[0])
                if name:
                    bound.add(name)
    for node in _walk(ast):
        if node.data == "member_dot_arg":
            method = str(node.children[1])
            if method == "bind" and _ident_of(node.children[0]) == "cel":
                continue
            if method not in KNOWN_FUNCTIONS:
                return f"undeclared reference to '{method}'"
        elif node.data == "ident_arg":
            function = str(node.children[0])
            if function not in KNOWN_FUNCTIONS:
                return f"undeclared reference to '{function}'"
        elif node.data == "ident":
            name = str(node.children[0])
            if name not in bound and name != "cel":
                return f"undeclared reference to '{name}'"
        elif node.data == "member_dot" and _ident_of(node.children[0]) == "device":
            field = str(node.children[1])
            if field not in DEVICE_FIELDS:
                return f"undefined field '{field}'"
    return None


# Where a selector reads a device: device.attributes["<domain>"].<name> (or ["<name>"]), the same for
# capacity, "<name>" in device.attributes["<domain>"], and device.driver.
_Q = r"""(?:"([^"\\]*)"|'([^'\\]*)')"""
_ACCESS = re.compile(
    rf"device\s*\.\s*(attributes|capacity)\s*\[\s*{_Q}\s*\]\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)(?![\w\s]*\()|\[\s*{_Q}\s*\])"
)
_PRESENCE = re.compile(rf"{_Q}\s+in\s+device\s*\.\s*(attributes|capacity)\s*\[\s*{_Q}\s*\]")
_DRIVER = re.compile(r"device\s*\.\s*driver\b")
_MEMO_LIMIT = 4096


def attribute_references(expression: str) -> list[tuple[str, str, str]]:
    """(attributes|capacity, domain, name) of every attribute and capacity `expression` names, in order,
    each once."""
    found: list[tuple[str, str, str]] = []
    for m in _ACCESS.finditer(expression):
        domain = m.group(2) if m.group(2) is not None else m.group(3)
        name = m.group(4) or (m.group(5) if m.group(5) is not None else m.group(6))
        found.append((m.group(1), domain, name))
    for m in _PRESENCE.finditer(expression):
        name = m.group(1) if m.group(1) is not None else m.group(2)
        domain = m.group(4) if m.group(4) is not None else m.group(5)
        found.append((m.group(3), domain, name))
    return list(dict.fromkeys(found))


def _projection(expression: str) -> tuple[tuple[str, str, str], ...] | None:
    """What the selector reads of a device, when that is all it can read (no other use of `device`):
    devices equal in these values get the same answer. None when the text reads more."""
    rest = _DRIVER.sub(" ", _PRESENCE.sub(" ", _ACCESS.sub(" ", expression)))
    if re.search(r"\bdevice\b", rest):
        return None
    return tuple(attribute_references(expression))


@dataclass(frozen=True)
class Selector:
    """A compiled selector; `matches(activation)` evaluates it on one device.

    Evaluating CEL with cel-python costs milliseconds, and a cluster repeats the same GPU model on every
    node: when the selector reads only named attributes and capacities (most do), the answer is kept per
    distinct set of those values, so explain and lint stay linear in the number of distinct devices."""

    expression: str
    _program: Any
    _reads: tuple[tuple[str, str, str], ...] | None = None
    _memo: dict[Any, bool | str] = field(default_factory=dict, compare=False, repr=False)

    def _key(self, activation: Mapping[str, Any]) -> Any:
        if self._reads is None:
            return None
        if isinstance(activation, DeviceActivation):  # plain values: no CEL map is assembled for a hit
            return (activation.driver, *(activation.plain(*read) for read in self._reads))
        device = activation.get("device")
        if not isinstance(device, celtypes.MapType):
            return None
        values: list[Any] = [dict.get(device, celtypes.StringType("driver"))]
        for what, domain, name in self._reads:
            value: Any = MISSING
            by_domain = dict.get(device, celtypes.StringType(what))  # plain lookups: no CEL errors
            if isinstance(by_domain, dict):
                values_of = dict.get(by_domain, celtypes.StringType(domain))
                if isinstance(values_of, dict):
                    value = dict.get(values_of, celtypes.StringType(name), MISSING)
            values.append(value if value is MISSING else (type(value).__name__, value))
        try:
            hash(tuple(values))
        except TypeError:
            return None
        return tuple(values)

    def matches(self, activation: Mapping[str, Any]) -> bool:
        """True/False, or CelError for an evaluation error or a non-bool result (allocation aborts)."""
        if isinstance(activation, DeviceActivation):  # explain and the allocator ask about the same device
            answer = activation.answers.get(self.expression)
            if answer is None:
                try:
                    answer = self._matches(activation)
                except CelError as err:
                    answer = str(err)
                activation.answers[self.expression] = answer
            if isinstance(answer, str):
                raise CelError(answer)
            return answer
        return self._matches(activation)

    def _matches(self, activation: Mapping[str, Any]) -> bool:
        key = self._key(activation)
        if key is not None and key in self._memo:
            known = self._memo[key]
            if isinstance(known, str):
                raise CelError(known)
            return known
        try:
            result = self._evaluate(activation)
        except CelError as err:
            self._remember(key, str(err))
            raise
        self._remember(key, result)
        return result

    def _remember(self, key: Any, answer: bool | str) -> None:
        if key is None:
            return
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = answer

    def _evaluate(self, activation: Mapping[str, Any]) -> bool:
        try:
            result = self._program.evaluate(dict(activation))
        except CELEvalError as err:
            raise CelError(_message(err)) from None
        if isinstance(result, CELEvalError):
            raise CelError(_message(result))
        if not isinstance(result, celtypes.BoolType | bool):
            raise CelError(f"CEL result of type {type_name(result)} could not be converted to bool")
        return bool(result)


def _message(err: CELEvalError) -> str:
    """cel-go's wording where celpy's differs ("no such key: minor")."""
    first = err.args[0] if err.args else "evaluation error"
    if first == "no such key" and len(err.args) > 2 and err.args[2]:
        return f"no such key: {err.args[2][0]}"
    if isinstance(first, str) and (m := re.fullmatch(r"no such member in mapping: '(.*)'", first)):
        return f"no such key: {m.group(1)}"
    if first == "modulus or divide by zero":
        return "division by zero"
    if isinstance(first, str) and first.startswith("undeclared reference") and "(in activation" in first:
        return first.split(" (in activation")[0]
    if len(err.args) > 2 and isinstance(err.args[2], tuple) and err.args[2] and err.args[1] is ValueError:
        return str(err.args[2][0])
    return str(first)


def _syntax_error(expression: str, err: celpy.CELParseError) -> str:
    """What the parser tripped on, from lark's exception under celpy's (which only draws a caret)."""
    cause = err.__cause__ or err.__context__
    token = getattr(cause, "token", None)
    if isinstance(cause, lark.exceptions.UnexpectedToken) and token is not None:
        if token.type == "$END" or not str(token):
            return "unexpected end of input"
        return f"mismatched input {str(token)!r}"
    column = int(getattr(err, "column", 0) or 0)
    lines = expression.splitlines() or [""]
    line = lines[min(int(getattr(err, "line", 1) or 1), len(lines)) - 1]
    if 0 < column <= len(line):
        return f"token recognition error at: {line[column - 1]!r}"
    return "invalid expression"


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile once (cached, as the scheduler's CEL cache does); CelError("compilation failed: ...")."""
    try:
        ast = _ENVIRONMENT.compile(expression)
    except celpy.CELParseError as err:
        where = f"{err.line}:{err.column}" if getattr(err, "line", None) else "1:1"
        raise CelError(
            f"compilation failed: ERROR: <input>:{where}: Syntax error: {_syntax_error(expression, err)}"
        ) from None
    problem = _static_check(ast)
    if problem:
        raise CelError(f"compilation failed: ERROR: <input>: {problem}")
    return Selector(
        expression, _ENVIRONMENT.program(ast, functions=KUBERNETES_FUNCTIONS), _projection(expression)
    )


def syntax_tree(expression: str) -> lark.Tree:
    """The expression's parse tree (cel-python's grammar); CelError when it does not parse."""
    try:
        return _ENVIRONMENT.compile(expression)
    except celpy.CELParseError as err:
        raise CelError(f"compilation failed: {_syntax_error(expression, err)}") from None


def compile_error(expression: str) -> str | None:
    """The compile error of `expression`, or None when it compiles (for API validation and lint)."""
    try:
        compile_selector(expression)
    except CelError as err:
        return str(err)
    return None
