"""YAML as go-yaml v2 and sigs.k8s.io/yaml read it: scalars, limits, texts (Go's answers written out)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.settings.gotext import go_format_float32_g, go_json_number
from kubegpu.settings.goyaml import GoYamlError, TooManyNodes, load, resolve_plain
from kubegpu.settings.nvidia_config import ConfigError, parse_config_text

# go-yaml v2 resolve.go on plain scalars (tag ""), as a Go program prints the decoded interface{}.
RESOLVED = [
    ("yes", True), ("Yes", True), ("y", True), ("Y", True), ("on", True), ("TRUE", True),
    ("no", False), ("n", False), ("off", False), ("False", False),
    ("~", None), ("null", None), ("", None),
    ("4", 4), ("-4", -4), ("+4", 4), ("0x10", 16), ("0X1f", 31), ("010", 8), ("0o17", 15), ("0b101", 5),
    ("-0b101", -5), ("1_000", 1000), ("1__0", 10), ("0", 0), ("00", 0),
    ("9223372036854775807", 9223372036854775807), ("18446744073709551615", 18446744073709551615),
    ("08", 8.0), ("4.0", 4.0), ("1e3", 1000.0), ("1.", 1.0), (".5", 0.5), ("-.5e1", -5.0),
    ("99999999999999999999", 1e20),
    ("1e400", "1e400"), ("0x", "0x"), ("-", "-"), ("1:20", "1:20"), ("2001-12-14", "2001-12-14"),
    ("._5", "._5"), ("abc", "abc"), ("_1", "_1"), ("yess", "yess"), ("0xg", "0xg"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), RESOLVED)
def test_plain_scalars_resolve_as_go_yaml_v2(text: str, value: object) -> None:
    got = resolve_plain(text)
    assert got == value and type(got) is type(value)


def test_infinities_and_nan() -> None:
    assert resolve_plain(".inf") == math.inf and resolve_plain("-.Inf") == -math.inf
    assert math.isnan(resolve_plain(".NaN"))


# Go's encoding/json (float64, shortest) and strconv.FormatFloat(f, 'g', -1, 32), written out.
@pytest.mark.parametrize(
    ("value", "text"),
    [(4.0, "4"), (0.5, "0.5"), (-2.5, "-2.5"), (1e20, "100000000000000000000"), (1e21, "1e+21"),
     (1.5e-7, "1.5e-7"), (1e-10, "1e-10"), (123456789.0, "123456789"), (1e100, "1e+100"), (-0.0, "-0"),
     (7, "7")],
)  # fmt: skip
def test_json_numbers_as_go_writes_them(value: float, text: str) -> None:
    assert go_json_number(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(4.0, "4"), (1e6, "1e+06"), (4000000.0, "4e+06"), (0.1, "0.1"), (123456789.0, "1.2345679e+08"),
     (1.5, "1.5"), (-0.0001, "-0.0001"), (0.00001, "1e-05"), (math.inf, "+Inf"), (math.nan, "NaN")],
)  # fmt: skip
def test_floats_as_sigs_yaml_writes_them_into_strings(value: float, text: str) -> None:
    assert go_format_float32_g(value) == text


# YAML's printable characters (YAML 1.1 section 5.1): libyaml, and so go-yaml, refuses the others anywhere.
printable = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Cn"), blacklist_characters="\ufeff"), max_size=12
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | printable,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(printable, inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_json_reads_back_as_itself(value: object) -> None:
    # JSON is YAML: what sigs.k8s.io/yaml hands to encoding/json for a JSON file is the file's own value.
    # (Not with surrogate-pair escapes: libyaml, and so go-yaml, refuses "\ud800".)
    assert load(json.dumps(value, ensure_ascii=False)).value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [*a]\n", "yaml: anchor 'a' value contains itself"),
        ("a: &a {b: {c: [*a]}}\n", "yaml: anchor 'a' value contains itself"),
        ("a: *b\n", "yaml: unknown anchor 'b' referenced"),
        ("a: !!int abc\n", "yaml: cannot decode !!str `abc` as a !!int"),
        ("a: !!binary '***'\n", "yaml: !!binary value contains invalid base64 data"),
        ("a: &a 1\nb:\n  <<: *a\n", "yaml: map merge requires map or sequence of maps as the value"),
        ("flags: [\n", "yaml: line 1: did not find expected node content"),
        ("a: b\n c: d\n", "yaml: line 2: mapping values are not allowed in this context"),
        ("a: \x01\n", "yaml: control characters are not allowed"),
    ],
)
def test_go_yamls_refusals_with_its_texts(text: str, message: str) -> None:
    with pytest.raises(GoYamlError) as err:
        load(text)
    assert str(err.value) == message


def laughs(width: int, depth: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    return "\n".join(lines) + "\n"


def expanded(width: int, depth: int) -> int:
    """Decode operations go-yaml runs on `laughs`, counted by hand: the document, the mapping, its keys,
    each level's sequence (1 + width items), where an alias is 1 + the size of what it names."""
    size = 1 + width  # l0's sequence
    total = 1 + 1 + depth + size
    for _ in range(1, depth):
        size = 1 + width * (1 + size)
        total += size
    return total


@pytest.mark.parametrize(("width", "depth"), [(2, 2), (3, 3), (2, 5), (4, 3)])
def test_counts_decode_operations_as_go_yaml_does(width: int, depth: int) -> None:
    assert load(laughs(width, depth)).nodes == expanded(width, depth)


def test_the_alias_ratio_rule_of_go_yaml() -> None:
    # 10 x 3: 1,259 decodes, 1,110 from aliases (88%): allowed. 10 x 4: past 99% at 11,000+: refused.
    assert load(laughs(10, 3)).nodes == expanded(10, 3)
    with pytest.raises(GoYamlError, match=r"^yaml: document contains excessive aliasing$"):
        load(laughs(10, 4))


def test_a_billion_laughs_is_refused_without_being_built() -> None:
    with pytest.raises(GoYamlError, match="excessive aliasing"):
        load(laughs(10, 9))  # 10^9 nodes if expanded


def test_the_node_bound_is_kubegpus_own() -> None:
    text = "".join(f"k{i}: {i}\n" for i in range(10_000))  # 20,002 decode operations
    with pytest.raises(TooManyNodes, match="more than 20000 YAML nodes"):
        load(text)
    assert load(text, max_nodes=30_000).nodes == 20_002


def test_only_the_first_document_counts() -> None:
    assert load("a: 1\n---\n[broken\n").value == {"a": 1}


def test_keys_become_json_keys_as_sigs_yaml_writes_them() -> None:
    assert load("1: a\ntrue: b\n1.5: c\ny: d\n").value == {"1": "a", "true": "d", "1.5": "c"}


def test_values_behind_an_anchor_are_shared_not_copied() -> None:
    value = load("a: &a [1, 2]\nb: [*a, *a]\n").value
    assert value["b"][0] is value["a"] and value["b"][1] is value["a"]


_PIECES = [*"ab01.-_:&*!<>[]{},|'\"#?~ \n\t", "yes", "0x", "<<", "!!int", "!!binary", "&a", "*a", "\n  "]
yamlish = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)


@given(yamlish)
def test_any_text_is_a_document_or_go_yamls_error(text: str) -> None:
    try:
        document = load(text)
    except GoYamlError as err:
        assert "\n" not in str(err)
    else:
        assert document.nodes >= 0


@given(yamlish)
def test_any_text_is_a_config_or_a_one_line_config_error(text: str) -> None:
    try:
        parse_config_text(text)
    except ConfigError as err:
        assert "\n" not in str(err) and all("\n" not in p for p in err.problems)
