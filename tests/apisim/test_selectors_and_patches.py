"""Selector parsing and patch application, on generated input (hypothesis)."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.apisim.errors import ApiError
from kubegpu.apisim.patch import merge_patch, strategic_merge_patch
from kubegpu.apisim.selectors import parse_field_selector, parse_label_selector

KEYS = st.sampled_from(["gpu", "zone", "nvidia.com/gpu.product", "example.com/x"])
VALUES = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8)
LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


def matches(selector: str, labels: dict[str, str]) -> bool:
    return all(r.matches(labels) for r in parse_label_selector(selector))


@given(labels=LABELS, key=KEYS, value=VALUES)
def test_equality_and_inequality_are_complements(labels: dict[str, str], key: str, value: str) -> None:
    assert matches(f"{key}={value}", labels) == (labels.get(key) == value)
    assert matches(f"{key}=={value}", labels) == (labels.get(key) == value)
    assert matches(f"{key}!={value}", labels) != matches(f"{key}={value}", labels)


@given(labels=LABELS, key=KEYS, values=st.lists(VALUES, min_size=1, max_size=3))
def test_set_membership_is_a_disjunction_of_equalities(
    labels: dict[str, str], key: str, values: list[str]
) -> None:
    inside = matches(f"{key} in ({','.join(values)})", labels)
    assert inside == any(matches(f"{key}={v}", labels) for v in values)
    assert matches(f"{key} notin ({', '.join(values)})", labels) != inside


@given(labels=LABELS, key=KEYS)
def test_existence(labels: dict[str, str], key: str) -> None:
    assert matches(key, labels) == (key in labels)
    assert matches(f"!{key}", labels) == (key not in labels)


@given(labels=LABELS, a=KEYS, b=KEYS, value=VALUES)
def test_commas_are_and(labels: dict[str, str], a: str, b: str, value: str) -> None:
    assert matches(f"{a},{b}={value}", labels) == (matches(a, labels) and matches(f"{b}={value}", labels))


@given(st.text(max_size=30))
def test_any_text_parses_or_is_a_400(text: str) -> None:
    try:
        parse_label_selector(text)
    except ApiError as err:
        assert err.code == 400
    try:
        parse_field_selector(text, ("metadata.name", "spec.nodeName"))
    except ApiError as err:
        assert err.code == 400


@given(st.text(alphabet="ab,=\\!", max_size=10))
def test_field_selector_values_round_trip_through_escapes(value: str) -> None:
    escaped = value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    (req,) = parse_field_selector(f"spec.nodeName={escaped}", ("spec.nodeName",))
    assert (req.label, req.equal, req.value) == ("spec.nodeName", True, value)


def test_field_selector_forms() -> None:
    reqs = parse_field_selector("spec.nodeName=a,spec.driver!=b", ("spec.nodeName", "spec.driver"))
    assert [(r.label, r.equal, r.value) for r in reqs] == [
        ("spec.nodeName", True, "a"),
        ("spec.driver", False, "b"),
    ]
    with pytest.raises(ApiError) as err:
        parse_field_selector("nodeName", ("spec.nodeName",))
    assert err.value.message == "invalid selector: 'nodeName'; can't understand 'nodeName'"


JSON_LEAF = st.one_of(st.integers(), st.booleans(), st.text(max_size=4))
JSON = st.recursive(
    JSON_LEAF,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from("abcd"), children, max_size=3)
    ),
    max_leaves=8,
)
OBJECTS = st.dictionaries(st.sampled_from("abcd"), JSON, max_size=4)
PATCHES = st.dictionaries(st.sampled_from("abcd"), st.one_of(st.none(), JSON), max_size=4)


@given(target=OBJECTS, patch=PATCHES)
def test_merge_patch_is_idempotent_and_sets_what_it_names(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    for key, value in patch.items():
        if value is None:
            assert key not in once
        elif not isinstance(value, dict):
            assert once[key] == value
    for key in target.keys() - patch.keys():
        assert once[key] == target[key]


@given(target=OBJECTS)
def test_an_empty_patch_changes_nothing(target: dict[str, Any]) -> None:
    assert merge_patch(target, {}) == target
    assert strategic_merge_patch(target, {}) == target


@given(target=OBJECTS, patch=PATCHES)
def test_strategic_merge_without_merge_keys_is_a_merge_patch(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    """Outside the lists that have a patch merge key, and without directives, the two agree."""
    assert strategic_merge_patch(target, patch) == merge_patch(target, patch)


def test_strategic_merge_merges_reserved_for_by_uid_and_honours_directives() -> None:
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "a", "uid": "1"}]}, "metadata": {}}
    added = strategic_merge_patch(
        claim, {"status": {"reservedFor": [{"resource": "pods", "name": "b", "uid": "2"}]}}
    )
    assert [r["uid"] for r in added["status"]["reservedFor"]] == ["1", "2"]
    removed = strategic_merge_patch(added, {"status": {"reservedFor": [{"uid": "1", "$patch": "delete"}]}})
    assert removed["status"]["reservedFor"] == [{"resource": "pods", "name": "b", "uid": "2"}]
    replaced = strategic_merge_patch(added, {"status": {"reservedFor": [{"$patch": "replace"}]}})
    assert replaced["status"]["reservedFor"] == []
    finalized = strategic_merge_patch(
        {"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["b", "a"]}}
    )
    assert finalized["metadata"]["finalizers"] == ["a", "b"]
    dropped = strategic_merge_patch(finalized, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})
    assert dropped["metadata"]["finalizers"] == ["b"]
    with pytest.raises(ApiError) as err:
        strategic_merge_patch(claim, {"status": {"reservedFor": [{"name": "no-uid"}]}})
    assert err.value.code == 400
