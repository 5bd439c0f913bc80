"""Properties of the value parsers every setting goes through: numbers, booleans, lists, XID lists."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kubegpu.settings.goparse import parse_bool, parse_list
from kubegpu.settings.values import BadValue, parse_number, parse_whole_number, parse_xid_list

GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


@given(st.text(max_size=12))
def test_parse_bool_is_gos_strconv_parsebool(text: str) -> None:
    if text in GO_TRUE:
        assert parse_bool(text) is True
    elif text in GO_FALSE:
        assert parse_bool(text) is False
    else:
        with pytest.raises(ValueError, match="use true or false"):
            parse_bool(text)


@given(st.sampled_from(sorted(GO_TRUE | GO_FALSE)))
def test_every_go_spelling(text: str) -> None:
    assert parse_bool(text) is (text in GO_TRUE)


ITEM = st.text(alphabet=st.characters(blacklist_characters=",", blacklist_categories=("Cs",)), max_size=8)


@given(st.lists(ITEM, max_size=6))
def test_parse_list_keeps_every_nonblank_item_trimmed_in_order(items: list[str]) -> None:
    assert parse_list(",".join(items)) == [i.strip() for i in items if i.strip()]
    assert parse_list(items) == [i.strip() for i in items if i.strip()]  # a repeated flag


@given(st.lists(st.text(max_size=8), max_size=6))
def test_parse_list_never_yields_blank_or_comma_items(items: list[str]) -> None:
    for item in parse_list(items):
        assert item == item.strip() and item and "," not in item


BOUNDS = {"minimum": 0.0, "maximum": 86_400.0}


@given(st.floats(min_value=0, max_value=86_400, exclude_min=True))
def test_positive_seconds_round_trip(value: float) -> None:
    assert parse_number(repr(value), positive=True, **BOUNDS) == value


@given(st.text(max_size=16))
def test_seconds_are_finite_within_bounds_or_refused_with_the_fix(text: str) -> None:
    try:
        value = parse_number(text, positive=True, **BOUNDS)
    except BadValue as err:
        assert str(err) in ("use a finite number greater than 0", "use at most 86400")
    else:
        assert math.isfinite(value) and 0 < value <= 86_400


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_text_parses_only_when_finite_and_in_range(value: float) -> None:
    ok = math.isfinite(value) and 0 <= value <= 86_400
    try:
        assert parse_number(str(value), positive=False, **BOUNDS) == value and ok
    except BadValue:
        assert not ok


@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_whole_numbers_within_bounds(value: int) -> None:
    try:
        assert parse_whole_number(str(value), minimum=0, maximum=65535) == value
    except BadValue as err:
        assert not 0 <= value <= 65535
        assert str(err) == "use a whole number from 0 to 65535"


@given(st.text(max_size=60))
@example("0\x1f")  # Unicode space to str.strip(), not to int(): was a ValueError, not a clear error
@example("\x1c5")
def test_whole_number_text_parses_or_is_refused(text: str) -> None:
    try:
        value = parse_whole_number(text, minimum=1, maximum=64)
    except BadValue:
        return
    assert 1 <= value <= 64 and text.strip().lstrip("+") in (str(value), f"0{value}", f"00{value}")


@given(st.text(max_size=40))
@example("1\x1c")
@example("\x1f2.5")
def test_number_text_parses_or_is_refused(text: str) -> None:
    try:
        value = parse_number(text, minimum=0, maximum=100, positive=False)
    except BadValue:
        return
    assert 0 <= value <= 100 and float(text) == value


@given(st.text(max_size=40))
def test_xid_lists_always_parse(text: str) -> None:
    xids = parse_xid_list(text)
    assert all(i >= 0 for i in xids.ids)
    assert not (xids.all and xids.ids and text.lower().rstrip().endswith(("all", "xids")))


@given(st.lists(st.integers(min_value=0, max_value=1000), max_size=8))
def test_xid_numbers_round_trip(ids: list[int]) -> None:
    xids = parse_xid_list(", ".join(str(i) for i in ids))
    assert xids.ids == frozenset(ids) and not xids.all and xids.malformed == ()
    assert str(xids) == ",".join(str(i) for i in sorted(set(ids)))
