"""Kubernetes quantity parsing: examples from apimachinery's behaviour, then properties."""

from __future__ import annotations

import contextlib
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.common import quantity
from kubegpu.common.quantity import QuantityError

DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("2Ki", Fraction(2048)),
        ("1e3", Fraction(1000)),
        ("1E", Fraction(10**18)),  # E alone is exa, not an exponent
        ("1.5e-3", Fraction(3, 2000)),
        ("+7", Fraction(7)),
        ("-2m", Fraction(-2, 1000)),
        ("1.", Fraction(1)),  # apimachinery accepts a trailing dot ...
        (".5", Fraction(1, 2)),  # ... and a leading one
        ("0.0000000001", Fraction(1, 10**9)),  # finer than 1n rounds up to 1n
        ("100n", Fraction(1, 10**7)),
        ("Gi", Fraction(0)),  # a bare unit is zero to apimachinery, odd as that is
    ],
)
def test_parses_like_apimachinery(text: str, expected: Fraction) -> None:
    assert quantity.parse(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1K", "1ki", "1e", "1.2.3", "1 Gi", "1Gi1", "0x10", "1e1.5"])
def test_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        quantity.parse(text)


def test_numbers_from_yaml_are_quantities() -> None:
    assert quantity.value(2) == 2
    assert quantity.parse(0.5) == Fraction(1, 2)
    with pytest.raises(QuantityError, match="boolean"):
        quantity.parse(True)


def test_scheduler_units_round_up() -> None:
    assert quantity.milli("0.0001") == 1  # 0.1m of CPU still costs 1m
    assert quantity.milli("1.5") == 1500
    assert quantity.value("1.2") == 2
    assert quantity.value("1Gi") == 2**30
    assert quantity.is_integer("2") and not quantity.is_integer("1500m")


def test_error_names_the_fix() -> None:
    with pytest.raises(QuantityError, match="Ki Mi Gi"):
        quantity.parse("4GB")


digits = st.text(alphabet="0123456789", min_size=1, max_size=12)


@given(whole=digits, suffix=st.sampled_from(sorted(DECIMAL)))
def test_decimal_suffixes_scale_by_powers_of_ten(whole: str, suffix: str) -> None:
    expected = Fraction(int(whole)) * Fraction(10) ** DECIMAL[suffix]
    # Kubernetes keeps nano precision, rounding the rest up.
    nanos = expected * 10**9
    assert quantity.parse_nanos(whole + suffix) == -(-nanos.numerator // nanos.denominator)


@given(whole=st.integers(min_value=0, max_value=10**6), suffix=st.sampled_from(sorted(BINARY)))
def test_binary_suffixes_scale_by_powers_of_two(whole: int, suffix: str) -> None:
    assert quantity.parse(f"{whole}{suffix}") == min(whole * 2 ** BINARY[suffix], 2**63 - 1)


@given(whole=digits, frac=digits, exp=st.integers(min_value=-20, max_value=20))
def test_exponent_form_equals_plain_decimal(whole: str, frac: str, exp: int) -> None:
    value = Fraction(int(whole)) + Fraction(int(frac), 10 ** len(frac))
    nanos = value * Fraction(10) ** exp * 10**9
    assert quantity.parse_nanos(f"{whole}.{frac}e{exp}") == -(-nanos.numerator // nanos.denominator)


@given(st.integers(min_value=0, max_value=10**15))
def test_milli_and_value_are_ceilings(nanos_in: int) -> None:
    text = f"{nanos_in}n"
    assert quantity.parse_nanos(text) == nanos_in
    assert quantity.milli(text) * 10**6 >= nanos_in > (quantity.milli(text) - 1) * 10**6
    assert quantity.value(text) * 10**9 >= nanos_in > (quantity.value(text) - 1) * 10**9


@given(st.text(max_size=12))
def test_never_crashes_on_garbage(text: str) -> None:
    with contextlib.suppress(QuantityError):
        quantity.parse_nanos(text)


@given(sign=st.sampled_from(["", "+", "-"]), whole=digits, suffix=st.sampled_from(sorted(DECIMAL | BINARY)))
def test_sign_only_flips(sign: str, whole: str, suffix: str) -> None:
    magnitude = quantity.parse_nanos(whole + suffix)
    assert quantity.parse_nanos(sign + whole + suffix) == (-magnitude if sign == "-" else magnitude)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("-1", "-1"),
        ("1.5", "1500m"),
        ("0.5", "500m"),
        ("2000", "2k"),
        ("1e3", "1e3"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("512Ki", "512Ki"),
        ("-1Gi", "-1Gi"),
        ("100n", "100n"),
        ("0", "0"),
        ("0.0", "0"),
    ],
)
def test_canonical_is_how_the_api_server_prints_a_quantity(text: str, shown: str) -> None:
    assert quantity.canonical(text) == shown


FORMAT_WRONG = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


@pytest.mark.parametrize(
    ("text", "apiserver"),
    [
        ("", FORMAT_WRONG),
        ("1.2.3", FORMAT_WRONG),
        ("1K", "unable to parse quantity's suffix"),
        ("1e", "unable to parse quantity's suffix"),
    ],
)
def test_errors_carry_apimachinerys_text(text: str, apiserver: str) -> None:
    with pytest.raises(QuantityError) as err:
        quantity.parse(text)
    assert err.value.apiserver == apiserver


@given(whole=digits, suffix=st.sampled_from(sorted(DECIMAL | BINARY)))
def test_canonical_keeps_the_value(whole: str, suffix: str) -> None:
    assert quantity.parse(quantity.canonical(whole + suffix)) == quantity.parse(whole + suffix)
