"""PATCH bodies: JSON merge patch (RFC 7386) and Kubernetes' strategic merge patch.

The official Python client sends a dict body as `application/strategic-merge-patch+json` for built-in
resources and as `application/merge-patch+json` for custom resources (CustomObjectsApi). Strategic merge
differs from a merge patch in lists: a list whose Go field carries a patch merge key is merged element by
element on that key instead of being replaced. The lists that have one among the served resources are in
`MERGE_KEYS`; every other list is replaced, as the field is `atomic` upstream. The directives `$patch`
(replace/delete/merge), `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (ordering only,
ignored here) and `$retainKeys` are understood.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import bad_request

# Path of a list (map keys from the object's root, "*" for any map key) -> its patch merge key; "" marks
# a list of primitives merged as a set.
MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): "",
    ("status", "reservedFor"): "uid",  # ResourceClaimStatus.ReservedFor: patchMergeKey=uid
    ("status", "conditions"): "type",  # NodeStatus.Conditions
    ("status", "addresses"): "type",  # NodeStatus.Addresses
    ("spec", "taints"): "key",  # NodeSpec.Taints
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise bad_request("the body of a strategic merge patch must be a JSON object")
    return _merge_map(target if isinstance(target, dict) else {}, patch, ())


def _merge_map(target: dict[str, Any], patch: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    result = copy.deepcopy(target)
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list) and isinstance(value, list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        child = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                existing = result.get(key)
                result[key] = _merge_map(existing if isinstance(existing, dict) else {}, value, child)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, child)
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_key(path: tuple[str, ...]) -> str | None:
    for pattern, key in MERGE_KEYS.items():
        if len(pattern) == len(path) and all(p in ("*", q) for p, q in zip(pattern, path, strict=True)):
            return key
    return None


def _merge_list(target: Any, patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    key = _merge_key(path)
    current = copy.deepcopy(target) if isinstance(target, list) else []
    if key is None:
        replaced = [v for v in patch if not (isinstance(v, dict) and v.get("$patch") == "replace")]
        return copy.deepcopy(replaced)
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    if key == "":  # a set of primitives
        return current + [copy.deepcopy(v) for v in patch if v not in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (i for i, e in enumerate(current) if isinstance(e, dict) and e.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                current.pop(index)
        elif index is None:
            current.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            current[index] = _merge_map(current[index], item, path)
    return current
