"""Go durations, as GFD's `--sleep-interval` / `GFD_SLEEP_INTERVAL` / `flags.gfd.sleepInterval` take them.

`parse_go_duration` is Go's `time.ParseDuration` (same grammar, same overflow rules, same error texts), so a
value GFD accepts is accepted here with the same meaning and one it rejects is rejected with its message.
`format_go_duration` is Go's `Duration.String()`, used when the settings are logged. GFD also accepts
`infinite`: label once, then sleep until a signal.
"""

from __future__ import annotations

INFINITE = (1 << 63) - 1  # Go's math.MaxInt64 nanoseconds, what GFD stores for "infinite"
INFINITE_TEXT = "infinite"

_MAX = 1 << 63  # Go computes in uint64 and checks against 1<<63
_NS, _US, _MS, _S = 1, 1_000, 1_000_000, 1_000_000_000
_UNITS = {
    "ns": _NS,
    "us": _US,
    "\u00b5s": _US,  # µ, the micro sign
    "\u03bcs": _US,  # μ, the Greek letter mu
    "ms": _MS,
    "s": _S,
    "m": 60 * _S,
    "h": 3600 * _S,
}


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"  # ASCII only, as Go; str.isdigit() would accept other scripts' digits


def _quote(text: str) -> str:
    """Go's time.quote: non-ASCII and control characters become \\xNN per UTF-8 byte."""
    out = ['"']
    for c in text:
        if ord(c) >= 0x80 or c < " ":
            try:  # surrogateescape gives back the raw byte of an env var that was not valid UTF-8
                raw = c.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = c.encode("utf-8", "surrogatepass")
            out.extend(f"\\x{b:02x}" for b in raw)
        else:
            out.append("\\" + c if c in '"\\' else c)
    out.append('"')
    return "".join(out)


def _leading_int(s: str) -> tuple[int, str]:
    x, i = 0, 0
    while i < len(s) and _is_digit(s[i]):
        if x > _MAX // 10:
            raise OverflowError
        x = x * 10 + ord(s[i]) - ord("0")
        if x > _MAX:
            raise OverflowError
        i += 1
    return x, s[i:]


def _leading_fraction(s: str) -> tuple[int, float, str]:
    """Digits after the dot: (value, scale, rest). Digits past 63 bits are consumed but ignored, as in Go."""
    x, scale, i, overflow = 0, 1.0, 0, False
    while i < len(s) and _is_digit(s[i]):
        if not overflow:
            y = x * 10 + ord(s[i]) - ord("0")
            if x > (_MAX - 1) // 10 or y > _MAX:
                overflow = True
            else:
                x, scale = y, scale * 10
        i += 1
    return x, scale, s[i:]


def parse_go_duration(text: str) -> int:
    """Nanoseconds in a Go duration ("60s", "1m30s", "1.5h", "-2ms"). Raises ValueError with Go's text."""
    invalid = ValueError(f"time: invalid duration {_quote(text)}")
    s, neg, total = text, False, 0
    if s and s[0] in "-+":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    while s:
        if not (s[0] == "." or _is_digit(s[0])):
            raise invalid
        before = len(s)
        try:
            whole, s = _leading_int(s)
        except OverflowError:
            raise invalid from None
        has_whole = before != len(s)
        frac, scale, has_frac = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            before = len(s)
            frac, scale, s = _leading_fraction(s)
            has_frac = before != len(s)
        if not has_whole and not has_frac:
            raise invalid  # "." or ".s"
        i = 0
        while i < len(s) and s[i] != "." and not _is_digit(s[i]):
            i += 1
        if i == 0:
            raise ValueError(f"time: missing unit in duration {_quote(text)}")
        name, s = s[:i], s[i:]
        unit = _UNITS.get(name)
        if unit is None:
            raise ValueError(f"time: unknown unit {_quote(name)} in duration {_quote(text)}")
        if whole > _MAX // unit:
            raise invalid
        value = whole * unit
        if frac > 0:
            value += int(float(frac) * (float(unit) / scale))  # float64 arithmetic, truncated: Go's
            if value > _MAX:
                raise invalid
        total += value
        if total > _MAX:
            raise invalid
    if neg:
        return -total
    if total > _MAX - 1:
        raise invalid
    return total


def parse_sleep_interval(text: str) -> int:
    """A `--sleep-interval` value: a Go duration or `infinite` (INFINITE)."""
    return INFINITE if text == INFINITE_TEXT else parse_go_duration(text)


def _frac(v: int, prec: int) -> tuple[str, int]:
    """Go's fmtFrac: the last `prec` digits of v as a fraction without trailing zeros, and v without them."""
    digits: list[str] = []
    printing = False
    for _ in range(prec):
        digit = v % 10
        printing = printing or digit != 0
        if printing:
            digits.append(str(digit))
        v //= 10
    text = "." + "".join(reversed(digits)) if printing else ""
    return text, v


def format_go_duration(ns: int) -> str:
    """Go's Duration.String(): 0 -> "0s", 1500 -> "1.5µs", 90e9 -> "1m30s"; INFINITE -> "infinite"."""
    if ns == INFINITE:
        return INFINITE_TEXT
    u = abs(ns)
    sign = "-" if ns < 0 else ""
    if u == 0:
        return "0s"
    if u < _S:
        if u < _US:
            unit, prec = "ns", 0
        elif u < _MS:
            unit, prec = "\u00b5s", 3
        else:
            unit, prec = "ms", 6
        frac, u = _frac(u, prec)
        return f"{sign}{u}{frac}{unit}"
    frac, u = _frac(u, 9)
    out = f"{u % 60}{frac}s"
    u //= 60
    if u > 0:
        out = f"{u % 60}m{out}"
        u //= 60
        if u > 0:
            out = f"{u}h{out}"
    return sign + out
