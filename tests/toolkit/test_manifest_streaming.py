"""Manifests read fast and streamed: the data built from each document's nodes is PyYAML's, and a line
asked for after the node tree was dropped is the line it was."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.toolkit.manifests import _LOADER, _construct, parse_text

scalars = st.sampled_from(
    [
        "1",
        "-7",
        "0x1f",
        "1_000",
        "1.5",
        ".inf",
        "true",
        "no",
        "~",
        "null",
        "2026-12-03",
        "'quoted'",
        "café",
        "x",
    ]
)
keys = st.sampled_from(["a", "b", "name", "1", "true", "limits"])
values = st.recursive(
    scalars.map(lambda s: ("scalar", s)),
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda v: ("seq", v))
        | st.dictionaries(keys, inner, max_size=3).map(lambda v: ("map", v))
    ),
    max_leaves=10,
)


def render(value: tuple, indent: int = 0) -> str:
    kind, body = value
    pad = "  " * indent
    if kind == "scalar":
        return body
    if kind == "seq":
        return "[" + ", ".join(render(v) for v in body) + "]" if body else "[]"
    if not body:
        return "{}"
    return "{" + ", ".join(f"{k}: {render(v)}" for k, v in body.items()) + "}" + pad[:0]


def both(text: str) -> tuple[object, object]:
    fast = _LOADER(text)
    slow = yaml.CSafeLoader(text)
    try:
        return _construct(fast, fast.get_single_node()), slow.get_single_data()
    finally:
        fast.dispose()
        slow.dispose()


@settings(max_examples=150, deadline=None)
@given(values)
def test_the_fast_path_builds_what_pyyaml_builds(value: tuple) -> None:
    text = f"root: {render(value)}\n"
    fast, slow = both(text)
    assert fast == slow


def test_aliases_are_shared_and_unusual_documents_go_to_pyyaml() -> None:
    fast, slow = both("a: &x {k: [1, 2]}\nb: *x\nc: !!set {p: null}\nd:\n  <<: *x\n  e: 3\n")
    assert fast == slow
    fast, _ = both("a: &x [1]\nb: *x\n")
    assert isinstance(fast, dict) and fast["a"] is fast["b"]


def test_a_line_asked_for_after_the_node_tree_was_dropped_is_the_right_one() -> None:
    docs = [
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  containers:\n  - name: c{i}\n"
        for i in range(3)
    ]
    text = "# é\n" + "---\n".join(docs)
    manifests = parse_text(text, "f.yaml")
    third = manifests.workloads[2].source
    assert third.node is None  # not kept: composed again on demand
    assert third.line(("spec", "containers", 0, "name")) == 1 + 7 * 2 + 2 + 7
    assert manifests.workloads[0].source.line(("metadata", "name")) == 5


def test_a_json_file_is_composed_for_lines_only_when_asked_and_as_before() -> None:
    """JSON's data comes from the JSON parser; its node tree (for line numbers) is composed only when a
    finding first asks for a line. JSON that YAML cannot compose (a surrogate pair escape) has no lines."""
    pod = (
        '{\n  "kind": "Pod",\n  "metadata": {"name": "p"},\n  "spec": {\n    "containers": [\n'
        '      {"name": "c"}\n    ]\n  }\n}\n'
    )
    manifests = parse_text(pod, "p.json")
    source = manifests.workloads[0].source
    assert source.node is None
    assert source.line(("spec", "containers", 0, "name")) == 6
    assert source.line(("metadata",)) == 3
    emoji = pod.replace('"name": "p"', '"name": "\\ud83d\\ude00"')
    manifests = parse_text(emoji, "p.json")
    assert manifests.workloads[0].name == "\U0001f600"
    assert manifests.workloads[0].source.line(("spec",)) is None
    assert manifests.workloads[0].source.line(("spec",)) is None
