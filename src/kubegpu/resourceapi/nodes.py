"""Which node a slice or device is reachable from: nodeName, allNodes, or a core NodeSelector, matched as
component-helpers' nodeaffinity does (terms ORed; within a term matchExpressions on labels and matchFields
on metadata.name ANDed; operators In, NotIn, Exists, DoesNotExist, Gt, Lt)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any] | str) -> Node:
        """A Node from API JSON, or just a name."""
        if isinstance(obj, str):
            return cls(obj)
        meta = obj.get("metadata") or {}
        return cls(str(meta.get("name") or ""), dict(meta.get("labels") or {}))


def _requirement(requirement: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    values = list(requirement.get("values") or [])
    present = key in values_of
    value = values_of.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    for term in selector.get("nodeSelectorTerms") or []:
        expressions = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not expressions and not fields:
            continue  # an empty term matches nothing
        if all(_requirement(r, node.labels) for r in expressions) and all(
            _requirement(r, {"metadata.name": node.name}) for r in fields
        ):
            return True
    return False


def reachable(node: Node, node_name: str, all_nodes: bool, node_selector: Mapping[str, Any] | None) -> bool:
    """nodeMatches in the structured allocator."""
    if node_name:
        return node.name == node_name
    if all_nodes:
        return True
    if node_selector is not None:
        return selector_matches(node_selector, node)
    return False
