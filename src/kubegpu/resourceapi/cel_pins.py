"""The string values a DRA selector compares a device attribute with: `device.attributes["<domain>"].<name>
== "<value>"` (or `["<name>"]`, either side of `==`), read from the CEL parse tree.

A pin is *required* when the selector is false whenever the comparison is: it is reached from the top only
through `&&` and parentheses. Under `||`, `!`, a ternary or a function call the selector may hold without it.
A value written with escapes is not read (no pin), so what is found is exactly what the text says.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import lark

from kubegpu.resourceapi.cel import CelError, syntax_tree

_PLAIN_STRING = re.compile(r"""^(?:"([^"\\\n]*)"|'([^'\\\n]*)')$""")


@dataclass(frozen=True, slots=True)
class Pin:
    domain: str
    name: str
    value: str
    required: bool


def attribute_pins(expression: str) -> list[Pin]:
    """Every `device.attributes[...]... == "<value>"` comparison of `expression`, in order, each once; none
    when it does not parse."""
    try:
        tree = syntax_tree(expression)
    except CelError:
        return []
    return list(dict.fromkeys(_pins(tree, required=True)))


def _pins(node: lark.Tree, required: bool) -> Iterator[Pin]:
    compared = _equality(node)
    if compared is not None:
        left, right = compared
        for access, literal in ((left, right), (right, left)):
            found, value = _attribute(access), _string(literal)
            if found is not None and value is not None:
                yield Pin(found[0], found[1], value, required)
                return
    # Only `&&` and nodes that merely wrap one child keep the selector false when a comparison is.
    keeps = len(node.children) == 1 or node.data == "conditionaland"
    for child in node.children:
        if isinstance(child, lark.Tree):
            yield from _pins(child, required and keeps)


def _equality(node: lark.Tree) -> tuple[lark.Tree, lark.Tree] | None:
    """(left, right) of `left == right`: cel-python's `relation(relation_eq(left), right)`."""
    if node.data != "relation" or len(node.children) != 2:
        return None
    head, right = node.children
    if not (isinstance(head, lark.Tree) and head.data == "relation_eq" and isinstance(right, lark.Tree)):
        return None
    left = head.children[0] if head.children else None
    return (left, right) if isinstance(left, lark.Tree) else None


def _inner(node: lark.Tree) -> lark.Tree:
    """Down through the nodes that wrap one subtree (expr, conditionalor, ..., primary)."""
    while len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
        node = node.children[0]
    return node


def _string(node: lark.Tree) -> str | None:
    node = _inner(node)
    if node.data != "literal" or len(node.children) != 1:
        return None
    found = _PLAIN_STRING.match(str(node.children[0]))
    if found is None:
        return None
    return found.group(1) if found.group(1) is not None else found.group(2)


def _domain(node: lark.Tree) -> str | None:
    """The domain of `device.attributes["<domain>"]`."""
    node = _inner(node)
    if node.data != "member_index" or len(node.children) != 2:
        return None
    base, index = node.children
    if not isinstance(base, lark.Tree) or not isinstance(index, lark.Tree):
        return None
    base = _inner(base)
    if base.data != "member_dot" or len(base.children) != 2 or str(base.children[1]) != "attributes":
        return None
    device = base.children[0]
    if not isinstance(device, lark.Tree):
        return None
    device = _inner(device)
    if device.data != "ident" or [str(c) for c in device.children] != ["device"]:
        return None
    return _string(index)


def _attribute(node: lark.Tree) -> tuple[str, str] | None:
    """(domain, name) of `device.attributes["<domain>"].<name>` or `...["<name>"]`."""
    node = _inner(node)
    if len(node.children) != 2 or not isinstance(node.children[0], lark.Tree):
        return None
    if node.data == "member_dot" and isinstance(node.children[1], lark.Token):
        name: str | None = str(node.children[1])
    elif node.data == "member_index" and isinstance(node.children[1], lark.Tree):
        name = _string(node.children[1])
    else:
        return None
    domain = _domain(node.children[0])
    return (domain, name) if domain is not None and name is not None else None
