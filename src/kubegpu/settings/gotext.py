"""Values as Go writes them: numbers as strconv and encoding/json print them, and short JSON previews.

The texts NVIDIA's errors quote (`json: cannot unmarshal number 1e+21 into ...`, `invalid deviceListStrategy:
["envvar",1]`) and the strings sigs.k8s.io/yaml makes of numbers aimed at string fields, so that kubegpu's
copies of those texts are byte for byte NVIDIA's.
"""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from typing import Any


def go_float_name(value: float) -> str:
    return "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"


def go_format_float32_g(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32): how sigs.k8s.io/yaml writes a float as a string."""
    if not math.isfinite(value):
        return go_float_name(value)
    single = struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.5e38 else value
    if single == 0:
        return "-0" if math.copysign(1, single) < 0 else "0"
    for digits in range(1, 10):  # the shortest decimal that reads back as the same float32
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent_text = text.split("e")
    exponent = int(exponent_text)
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    if exponent < -4 or exponent >= 6:  # %e when the exponent is < -4 or >= the shortest precision (6)
        return f"{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    sign = "-" if mantissa.startswith("-") else ""
    significant = mantissa.lstrip("-").replace(".", "")
    point = exponent + 1
    if point <= 0:
        return f"{sign}0.{'0' * -point}{significant}"
    if point >= len(significant):
        return f"{sign}{significant}{'0' * (point - len(significant))}"
    return f"{sign}{significant[:point]}.{significant[point:]}"


def go_json_number(value: int | float) -> str:
    """How Go's encoding/json writes a number: the text a later decode sees and its errors quote."""
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    shortest = Decimal(repr(value))  # the shortest digits that read back as the same float, as Go's -1
    if 1e-6 <= abs(value) < 1e21:
        text = format(shortest, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    sign, digits, exponent = shortest.as_tuple()
    assert isinstance(exponent, int)
    body = "".join(map(str, digits)).rstrip("0") or "0"
    mantissa = body[0] + (f".{body[1:]}" if len(body) > 1 else "")
    power = exponent + len(digits) - 1
    # Go writes at least two exponent digits, then trims "e-07" to "e-7".
    written = f"-{abs(power)}" if -10 < power < 0 else f"{'-' if power < 0 else '+'}{abs(power):02d}"
    return f"{'-' if sign else ''}{mantissa}e{written}"


def preview(value: Any, limit: int = 80, *, compact: bool = False) -> str:
    """`value` as JSON, cut at about `limit` characters without walking further (values may be shared
    and large). `compact` writes as Go's encoding/json does: sorted keys, no spaces."""
    out: list[str] = []
    budget = [limit]
    comma, colon = (",", ":") if compact else (", ", ": ")

    def emit(text: str) -> bool:
        out.append(text)
        budget[0] -= len(text)
        return budget[0] > 0

    def walk(v: Any) -> bool:
        if isinstance(v, dict):
            items = sorted(v.items()) if compact else v.items()
            if not emit("{"):
                return False
            for i, (k, item) in enumerate(items):
                if (i and not emit(comma)) or not emit(_json_string(k) + colon) or not walk(item):
                    return False
            return emit("}")
        if isinstance(v, list | tuple):
            if not emit("["):
                return False
            for i, item in enumerate(v):
                if (i and not emit(comma)) or not walk(item):
                    return False
            return emit("]")
        if isinstance(v, str):
            return emit(_json_string(v))
        if v is None:
            return emit("null")
        if isinstance(v, bool):
            return emit("true" if v else "false")
        if isinstance(v, int | float):
            return emit(go_json_number(v) if isinstance(v, int) or math.isfinite(v) else go_float_name(v))
        return emit(_json_string(str(v)))

    if walk(value):
        return "".join(out)
    return "".join(out)[:limit] + "..."


def _json_string(text: str) -> str:
    return json.dumps(text if len(text) <= 200 else text[:200] + "...", ensure_ascii=False)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(text: str) -> str:
    """Go's strconv.Quote (what `%q` prints): double quotes, Go's escapes, printable Unicode kept."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)
