"""Kubernetes resource quantities (`500m`, `1.5Gi`, `1e3`), parsed the way apimachinery parses them.

Values are exact: a quantity is held as an integer number of nano-units, which is also the finest
precision Kubernetes keeps (it rounds anything finer *up* to 1n). The scheduler then turns a quantity
into `MilliValue()` for CPU and `Value()` for everything else, both rounding up; `milli()` and `value()`
do the same so the toolkit counts exactly what kube-scheduler counts.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

NANO = 10**9
# apimachinery caps binary-SI quantities at the largest int64.
_MAX_INT64 = 2**63 - 1

_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_MAX_EXPONENT = 1000
_UNITS = (
    "use one of n u m k M G T P E (powers of 1000), Ki Mi Gi Ti Pi Ei (powers of 1024) "
    "or e<N>, e.g. 500m, 2Gi"
)


# apimachinery's parse errors (resource.ErrFormatWrong, resource.ErrSuffix): what the API server answers
# when it cannot decode a quantity.
SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT_WRONG = f"quantities must match the regular expression '{SPLIT_RE}'"
ERR_SUFFIX = "unable to parse quantity's suffix"


class QuantityError(ValueError):
    """A string that Kubernetes would reject as a resource quantity.

    `apiserver` is apimachinery's own error for it (ERR_FORMAT_WRONG, ERR_SUFFIX), or "" where Kubernetes
    would accept it and only we refuse (an exponent so large it would eat the machine)."""

    def __init__(self, message: str, apiserver: str = "") -> None:
        super().__init__(message)
        self.apiserver = apiserver


def _split(text: str) -> tuple[bool, str, str, str]:
    """Split into (positive, integer digits, fraction digits, suffix) like apimachinery's
    parseQuantityString, quirks included: "1." and ".5" are numbers, and so is a bare sign."""
    positive, pos, end = True, 0, len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    whole = text[start:pos]
    frac = ""
    if pos < end and text[pos] == ".":
        pos += 1
        fstart = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        frac = text[fstart:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos != end:
        raise QuantityError(
            f"quantity {text!r} is not a number followed by an optional unit; {_UNITS}", ERR_FORMAT_WRONG
        )
    return positive, whole, frac, text[suffix_start:]


def _multiplier(suffix: str, text: str) -> tuple[Fraction, bool]:
    """(multiplier, is_binary) of a suffix; raises on one Kubernetes does not know."""
    if suffix in _DECIMAL_SI:
        return Fraction(10) ** _DECIMAL_SI[suffix], False
    if suffix in _BINARY_SI:
        return Fraction(2 ** _BINARY_SI[suffix]), True
    if len(suffix) > 1 and suffix[0] in "eE":
        exp = suffix[1:]
        body = exp[1:] if exp[0] in "+-" else exp
        if body and all(ch in _DIGITS for ch in body):
            if abs(int(exp)) > _MAX_EXPONENT:  # guard against 1e999999999 eating the machine
                raise QuantityError(f"quantity {text!r} has an exponent beyond ±{_MAX_EXPONENT}")
            return Fraction(10) ** int(exp), False
    raise QuantityError(f"quantity {text!r} has an unknown unit {suffix!r}; {_UNITS}", ERR_SUFFIX)


@lru_cache(maxsize=8192)
def _parse_text(text: str) -> int:
    if not text:
        raise QuantityError("quantity is empty; write a number such as 1, 500m or 2Gi", ERR_FORMAT_WRONG)
    positive, whole, frac, suffix = _split(text)
    mult, binary = _multiplier(suffix, text)
    number = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    amount = number * mult
    if binary and amount > _MAX_INT64:
        amount = Fraction(_MAX_INT64)
    nanos = amount * NANO
    # Kubernetes rounds a non-zero amount up (away from zero) to the next nano.
    whole_nanos = -(-nanos.numerator // nanos.denominator)
    return whole_nanos if positive else -whole_nanos


def parse_nanos(raw: str | int | float) -> int:
    """The quantity as an exact integer count of nano-units (1 == 1n; 1_000_000_000 == 1).

    Accepts what a manifest may hold: a string, or a bare YAML/JSON number.
    """
    if isinstance(raw, bool):
        # The API server reads `true` as the text "true", which is no quantity.
        raise QuantityError(
            f"quantity {raw!r} is a boolean; write a number such as 1 or 500m", ERR_FORMAT_WRONG
        )
    if isinstance(raw, int):
        return raw * NANO
    if isinstance(raw, float):
        raw = repr(raw)
    if not isinstance(raw, str):
        raise QuantityError(f"quantity {raw!r} is not a string or a number", ERR_FORMAT_WRONG)
    return _parse_text(raw)


def _suffix_of(raw: str | int | float) -> str:
    text = raw if isinstance(raw, str) else repr(raw) if isinstance(raw, float) else str(raw)
    return _split(text)[3]


_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SI.items()}
_BINARY_BY_SHIFT = {shift: suffix for suffix, shift in _BINARY_SI.items()}


def canonical(raw: str | int | float) -> str:
    """`Quantity.String()`: the canonical form the API server prints a quantity in (`1.5` -> `1500m`,
    `2000` -> `2k`, `1024Mi` -> `1Gi`), in the format its suffix chose (decimal SI, binary SI, exponent)."""
    nanos = parse_nanos(raw)
    if nanos == 0:
        return "0"
    suffix = _suffix_of(raw)
    binary = suffix in _BINARY_SI
    exponent_form = len(suffix) > 1 and suffix[0] in "eE"
    if binary and nanos % NANO == 0 and abs(nanos) >= 1024 * NANO:
        amount, shift = nanos // NANO, 0
        while amount % 1024 == 0 and shift < 60:
            amount, shift = amount // 1024, shift + 10
        return f"{amount}{_BINARY_BY_SHIFT.get(shift, '')}"
    # Decimal: strip the trailing zeros, then lower the exponent to a multiple of 3 (AsCanonicalBytes).
    mantissa, exponent = nanos, -9
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    extra = exponent % 3
    mantissa, exponent = mantissa * 10**extra, exponent - extra
    if not exponent_form and exponent in _DECIMAL_BY_EXPONENT:
        return f"{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
    return f"{mantissa}e{exponent}" if exponent else str(mantissa)


def parse(raw: str | int | float) -> Fraction:
    """The exact value of a quantity (after Kubernetes' rounding up to 1n)."""
    return Fraction(parse_nanos(raw), NANO)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def milli(raw: str | int | float) -> int:
    """`Quantity.MilliValue()`: the value in thousandths, rounded up (how the scheduler counts CPU)."""
    return ceil_div(parse_nanos(raw), NANO // 1000)


def value(raw: str | int | float) -> int:
    """`Quantity.Value()`: the value rounded up to an integer (memory, pods, extended resources)."""
    return ceil_div(parse_nanos(raw), NANO)


def is_integer(raw: str | int | float) -> bool:
    """Whether the quantity is a whole number, as extended resources such as GPUs must be."""
    return parse_nanos(raw) % NANO == 0


def format_bytes(amount: int) -> str:
    """A byte count for people: 1.5Gi, 512Mi, 80Gi."""
    for unit, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if abs(amount) >= 1 << shift:
            scaled = amount / (1 << shift)
            text = f"{scaled:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return str(amount)


def format_milli(amount: int) -> str:
    """Milli-units for people: 1500 -> 1.5, 250 -> 250m."""
    if amount % 1000 == 0:
        return str(amount // 1000)
    if abs(amount) >= 1000:
        return f"{amount / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{amount}m"
