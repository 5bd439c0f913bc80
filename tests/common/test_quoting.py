"""Quoting client text for logs and status messages: no forged lines, bounded length, NVIDIA's plain IDs."""

from __future__ import annotations

import ast

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.common.quoting import plain_id, quote_id, quote_ids

UUID = "GPU-8e4f2f5a-3c1d-4b7e-9a6f-1d2c3b4a5e6f"


def test_a_normal_id_is_quoted_like_repr() -> None:
    assert quote_id(UUID) == "'GPU-8e4f2f5a-3c1d-4b7e-9a6f-1d2c3b4a5e6f'"


def test_a_newline_cannot_start_a_log_line() -> None:
    forged = "GPU-x\n2026-01-01T00:00:00.000 ERROR kubegpu: GPU 0 is on fire"
    assert quote_id(forged, limit=200) == (
        "'GPU-x\\n2026-01-01T00:00:00.000 ERROR kubegpu: GPU 0 is on fire'"
    )


def test_terminal_escapes_and_unicode_separators_are_escaped() -> None:
    assert quote_id("a\x1b[2Jb\u2028c\u202ed") == "'a\\x1b[2Jb\\u2028c\\u202ed'"


def test_a_long_id_is_cut_and_its_length_said() -> None:
    assert quote_id("G" * 20_000, limit=8) == "'GGGGGGGG'... (20000 characters)"


def test_plain_id_keeps_nvidias_text_for_ordinary_ids() -> None:
    assert plain_id(UUID) == UUID
    assert plain_id("GPU-x") == "GPU-x"
    assert plain_id(f"{UUID}::17") == f"{UUID}::17"


def test_plain_id_quotes_what_could_mislead() -> None:
    assert plain_id("GPU-x\nfake") == "'GPU-x\\nfake'"
    assert plain_id("G" * 65) == "'" + "G" * 64 + "'... (65 characters)"


def test_quote_ids_shows_a_few_and_counts_the_rest() -> None:
    assert quote_ids(["a", "b"]) == "'a', 'b'"
    assert quote_ids(["a", "b", "c", "d", "e"]) == "'a', 'b', 'c' and 2 more"


@given(st.text(), st.integers(1, 100))
def test_quoted_text_is_one_bounded_printable_line(text: str, limit: int) -> None:
    out = quote_id(text, limit)
    assert out.isprintable()  # no newline, carriage return, escape or separator survives
    # repr escapes one character into at most 10 (\U0010ffff); quotes, `...` and the length come on top.
    assert len(out) <= 10 * limit + 40


@given(st.text(max_size=64))
def test_quoting_loses_nothing_when_not_cut(text: str) -> None:
    assert ast.literal_eval(quote_id(text)) == text


@given(st.text())
def test_plain_id_is_the_id_itself_or_a_quoted_one(text: str) -> None:
    out = plain_id(text)
    assert out.isprintable()
    if out != text:
        assert out == quote_id(text)
