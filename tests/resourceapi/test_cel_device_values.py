"""A device's CEL variable is assembled only when an expression is evaluated on it; the selector memo reads
plain values instead. Both must see the same device: for any attributes (with and without a domain, a bare
"/name", names holding a slash) the plain value of each (domain, name) is present exactly where the CEL map
has a key, and two devices whose plain values agree get the same answer from any selector."""

from __future__ import annotations

from typing import Any

import pytest
from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.resourceapi.cel import CelError, compile_selector, device_activation

DRIVER = "gpu.nvidia.com"
DOMAINS = ("", DRIVER, "resource.kubernetes.io", "example.com/x")
IDENTS = ("type", "index", "a/b", "memory")

values = st.one_of(
    st.builds(lambda v: {"string": v}, st.sampled_from(["gpu", "mig", "Tesla T4"])),
    st.builds(lambda v: {"int": v}, st.integers(-3, 3)),
    st.builds(lambda v: {"bool": v}, st.booleans()),
    st.builds(lambda v: {"version": v}, st.sampled_from(["1.2.3", "7.5.0", "550.90.7"])),
)
names = st.builds(
    lambda d, i, bare: f"/{i}" if bare else (f"{d}/{i}" if d else i),
    st.sampled_from(DOMAINS),
    st.sampled_from(IDENTS),
    st.booleans(),
)


def cel_lookup(activation: Any, what: str, domain: str, name: str) -> Any:
    by_domain = dict.get(activation["device"], celtypes.StringType(what))
    values_of = dict.get(by_domain, celtypes.StringType(domain)) if by_domain is not None else None
    return dict.get(values_of, celtypes.StringType(name)) if values_of is not None else None


@settings(max_examples=200, deadline=None)
@given(
    attributes=st.dictionaries(names, values, max_size=6),
    capacity=st.dictionaries(names, st.sampled_from([{"value": "16Gi"}, {"value": "40Gi"}]), max_size=3),
)
def test_plain_values_are_where_the_cel_map_has_keys(
    attributes: dict[str, Any], capacity: dict[str, Any]
) -> None:
    activation = device_activation(DRIVER, attributes, capacity)
    for what in ("attributes", "capacity"):
        for domain in (DRIVER, "resource.kubernetes.io", "example.com/x", "example.com"):
            for name in IDENTS:
                cel = cel_lookup(activation, what, domain, name)
                plain = activation.plain(what, domain, name)
                assert (cel is None) == (plain is activation.plain("attributes", "no.such", "x")), (
                    what, domain, name, cel, plain,
                )  # fmt: skip
                if cel is not None and what == "attributes":
                    kind, value = plain
                    assert {
                        "string": celtypes.StringType,
                        "int": celtypes.IntType,
                        "bool": celtypes.BoolType,
                    }.get(kind, type(cel)) is type(cel)
                    if kind != "version":
                        assert cel == value


@settings(max_examples=100, deadline=None)
@given(a=st.dictionaries(names, values, max_size=5), b=st.dictionaries(names, values, max_size=5))
def test_the_memo_gives_each_device_the_answer_cel_gives(a: dict[str, Any], b: dict[str, Any]) -> None:
    expressions = [
        f"device.attributes['{DRIVER}'].type == 'gpu'",
        f"'index' in device.attributes['{DRIVER}'] && device.attributes['{DRIVER}'].index > 0",
        "device.attributes['resource.kubernetes.io'].type == 'mig'",
    ]
    for expression in expressions:
        selector = compile_selector(expression)
        for attributes in (a, b, a):
            activation = device_activation(DRIVER, dict(attributes), {})
            try:
                fresh = compile_selector.__wrapped__(expression).matches(activation)  # a new memo: CEL runs
            except CelError as err:
                with pytest.raises(CelError) as memo_err:
                    selector.matches(activation)
                assert str(memo_err.value) == str(err)
            else:
                assert selector.matches(activation) is fresh


def test_a_value_cel_cannot_take_fails_when_the_device_is_seen_whatever_reads_it() -> None:
    with pytest.raises(CelError) as err:
        device_activation(DRIVER, {"type": {"string": "gpu"}, "driverVersion": {"version": "550.90"}}, {})
    assert (
        str(err.value)
        == "attribute driverVersion: parse semantic version: '550.90' is not a semantic version"
    )
    with pytest.raises(CelError) as err:
        device_activation(DRIVER, {"odd": {"float": 1.5}}, {})
    assert str(err.value) == "attribute odd: unsupported attribute value"
