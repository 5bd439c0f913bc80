"""Properties of the label-value sanitiser and of the Go duration parser behind --sleep-interval."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kubegpu.labels.naming import sanitise
from kubegpu.settings.goduration import INFINITE, format_go_duration, parse_go_duration, parse_sleep_interval

ALLOWED = re.compile(r"[A-Za-z0-9\-_. ]")
NS = 1
S = 1_000_000_000
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.text())
@example("NVIDIA-TITAN-X-(Pascal)")
@example(" \t\n ")
def test_sanitised_values_hold_only_label_characters(text: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9\-_.]*", sanitise(text))


@given(st.text())
def test_sanitise_is_idempotent(text: str) -> None:
    once = sanitise(text)
    assert sanitise(once) == once


@given(st.text())
def test_sanitise_keeps_every_allowed_character_in_order(text: str) -> None:
    # only characters outside the label alphabet are dropped; spaces become the '-' separators
    kept = "".join(c for c in text if ALLOWED.fullmatch(c) and c != " ")
    assert sanitise(text).replace("-", "") == kept.replace("-", "")


@given(st.lists(st.text(alphabet="abcXYZ019_.", min_size=1), min_size=1))
def test_sanitise_joins_words_with_one_dash(words: list[str]) -> None:
    assert sanitise("  " + "   ".join(words) + " ") == "-".join(words)


@given(INT64)
@example(0)
@example(-(2**63))
@example(1500)
def test_format_then_parse_is_the_identity(ns: int) -> None:
    assert parse_sleep_interval(format_go_duration(ns)) == ns


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 999))
def test_units_add_up(h: int, m: int, s: int, ms: int) -> None:
    assert parse_go_duration(f"{h}h{m}m{s}s{ms}ms") == ((h * 60 + m) * 60 + s) * S + ms * 1_000_000


@given(st.integers(0, 2**63 - 1))
def test_nanoseconds_are_exact(ns: int) -> None:
    assert parse_go_duration(f"{ns}ns") == ns * NS


@given(st.integers(0, 10**6), st.integers(0, 999_999_999))
def test_fractional_seconds(whole: int, frac: int) -> None:
    digits = f"{frac:09d}"
    assert parse_go_duration(f"{whole}.{digits}s") == whole * S + frac


@given(st.text(max_size=30))
def test_parser_accepts_or_raises_value_error(text: str) -> None:
    try:
        result = parse_go_duration(text)
    except ValueError as err:
        assert str(err).startswith("time: ")
    else:
        assert -(2**63) <= result <= 2**63 - 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", 'time: invalid duration ""'),
        ("60", 'time: missing unit in duration "60"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        (".s", 'time: invalid duration ".s"'),
        ("1h-1m", 'time: unknown unit "h-" in duration "1h-1m"'),  # Go reads units up to a digit
        ("9223372037s", 'time: invalid duration "9223372037s"'),  # past MaxInt64 nanoseconds
        ("1\u00e9s", 'time: unknown unit "\\xc3\\xa9s" in duration "1\\xc3\\xa9s"'),
        ("infinite", 'time: invalid duration "infinite"'),  # only --sleep-interval knows "infinite"
        ("1\udcffs", 'time: unknown unit "\\xffs" in duration "1\\xffs"'),  # a non-UTF-8 byte in an env var
        ("1\ud800s", 'time: unknown unit "\\xed\\xa0\\x80s" in duration "1\\xed\\xa0\\x80s"'),
    ],
)
def test_go_error_texts(text: str, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_go_duration(text)
    assert str(caught.value) == error


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("+5s", 5 * S),
        ("-1.5h", -5400 * S),
        ("1.5\u00b5s", 1500),
        ("1\u03bcs", 1000),
        ("300ms", 300_000_000),
        ("2h45m", 9900 * S),
        (".5s", S // 2),
        ("1.s", S),
        ("9223372036.854775807s", 2**63 - 1),
        ("0.1234567891s", 123_456_789),  # digits past nanoseconds are truncated
    ],
)
def test_go_durations(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0, "0s"), (1, "1ns"), (1500, "1.5µs"), (2_000_000, "2ms"), (90 * S, "1m30s"), (3600 * S, "1h0m0s")],
)
def test_go_duration_strings(ns: int, text: str) -> None:
    assert format_go_duration(ns) == text


def test_infinite() -> None:
    assert parse_sleep_interval("infinite") == INFINITE == 2**63 - 1
    assert format_go_duration(INFINITE) == "infinite"
