"""Text to typed value for each kind of setting, with the one-line error that names the fix.

`parse(setting, text, origin)` is what `kubegpu.settings.given` calls for every value it finds on the
command line or in the environment. The errors say which flag or env var, the bad value and what to write:

    KUBEGPU_HEALTH_PROBE_SECONDS='inf' is not a valid number of seconds: use a finite number greater than 0,
    e.g. 5 (the default)

NVIDIA's settings keep the words of NVIDIA's binaries, byte for byte: Go's flag package for the command
line (`invalid value "10" for flag -sleep-interval: ...`), urfave/cli v2 for env vars (`could not parse
"yes" as bool value from environment variable "FAIL_ON_INIT_ERROR" for flag fail-on-init-error: ...`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.common.quoting import VALUE_LIMIT, quote_id
from kubegpu.settings.dra_selection import GpuSelectionError, parse_gpu_selection
from kubegpu.settings.goduration import format_go_duration, parse_sleep_interval
from kubegpu.settings.goparse import parse_bool, parse_list
from kubegpu.settings.gotext import go_quote
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import Setting


class SettingError(ConfigError):
    """Bad values of flags or env vars; one line per bad value, each naming it, its value and the fix."""


class BadValue(ValueError):
    """A value a kind's parser refuses; the message is the fix ("use ...")."""


@dataclass(frozen=True, slots=True)
class XidList:
    """NVIDIA's DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS value: all (or xids), or XID numbers."""

    all: bool = False
    ids: frozenset[int] = frozenset()
    malformed: tuple[str, ...] = ()  # entries that are not XIDs: NVIDIA logs and skips them

    def __str__(self) -> str:
        return "all" if self.all else ",".join(str(i) for i in sorted(self.ids))


def parse_xid_list(text: str) -> XidList:
    """NVIDIA's rule: comma list, trimmed, case-insensitive; `all`/`xids` discards ids listed before it."""
    want_all, ids, malformed = False, set[int](), []
    for item in text.split(","):
        token = item.strip().lower()
        if not token:
            continue
        if token in ("all", "xids"):
            want_all, ids = True, set()
            continue
        try:
            xid = int(token)
        except ValueError:
            malformed.append(item)
            continue
        if xid < 0:
            malformed.append(item)
            continue
        ids.add(xid)
    return XidList(want_all, frozenset(ids), tuple(malformed))


# ASCII digits only, as Go's strconv: Python's float() and int() would also take "1_000" and other scripts'
# digits, which no other tool reading the same manifest would.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
# What int() and float() skip around a number; str.strip() would also take "\x1c".."\x1f" and other
# Unicode spaces, which they refuse with a ValueError instead of our error.
_ASCII_SPACE = " \t\n\v\f\r"


def _number_text(value: float) -> str:
    return f"{value:g}"


def parse_number(text: str, *, minimum: float | None, maximum: float | None, positive: bool) -> float:
    """A finite number within the bounds; BadValue says what to use instead."""
    low = "greater than 0" if positive else None
    if low is None and minimum is not None:
        low = f"of {_number_text(minimum)} or more"
    fix = f"use a finite number {low}" if low else "use a finite number"
    if not _DECIMAL.fullmatch(text.strip(_ASCII_SPACE)):
        raise BadValue(fix)
    value = float(text)
    if not math.isfinite(value) or (positive and value <= 0) or (minimum is not None and value < minimum):
        raise BadValue(fix)
    if maximum is not None and value > maximum:
        raise BadValue(f"use at most {_number_text(maximum)}")
    return value


def parse_whole_number(text: str, *, minimum: float | None, maximum: float | None) -> int:
    fix = "use a whole number"
    if minimum is not None and maximum is not None:
        fix += f" from {_number_text(minimum)} to {_number_text(maximum)}"
    elif minimum is not None:
        fix += f" of {_number_text(minimum)} or more"
    elif maximum is not None:
        fix += f" of at most {_number_text(maximum)}"
    # (the length bound: Python refuses over 4300 digits)
    if len(text) > 40 or not _INTEGER.fullmatch(text.strip(_ASCII_SPACE)):
        raise BadValue(fix)
    value = int(text.strip())  # what was matched: str.strip takes more than int() does ("0\x1f")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise BadValue(fix)
    return value


def parse_path(text: str) -> Path:
    path = text.strip()
    if not path:
        raise BadValue("use a non-empty path")
    return Path(path)


def _what(setting: Setting) -> str:
    # The kinds of kubegpu's own settings whose text can be refused (NVIDIA's have NVIDIA's words).
    return {
        "bool": "boolean",
        "int": "whole number",
        "seconds": "number of seconds",
        "path": "path",
        "gpus": "GPU selection",
    }.get(setting.kind, "value")


def default_text(setting: Setting) -> str:
    """The default as a user would write it (`true`, `60`, `envvar`, `1m0s`); "" when there is none."""
    return text_of(setting, setting.default)


def text_of(setting: Setting, value: Any) -> str:
    """A typed value as a user would write it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if setting.kind == "duration":
        return format_go_duration(value)
    if isinstance(value, float):
        return _number_text(value)
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def help_text(setting: Setting) -> str:
    """The help text with click's own `[env var: ...; default: ...]` suffix."""
    extras = []
    if setting.envvars:
        extras.append(f"env var: {', '.join(setting.envvars)}")
    default = default_text(setting) or '""'
    extras.append(f"default: {default}")
    if setting.minimum is not None and setting.maximum is not None:
        low = "<" if setting.positive else "<="
        extras.append(f"{_number_text(setting.minimum)}{low}x<={_number_text(setting.maximum)}")
    return f"{setting.help}  [{'; '.join(extras)}]"


def _parse_kind(setting: Setting, text: str | Sequence[str]) -> Any:
    if setting.kind == "list":
        return parse_list(text)
    assert isinstance(text, str)
    if setting.kind == "bool":
        try:
            return parse_bool(text)
        except ValueError:
            raise BadValue("use true or false") from None  # (NVIDIA's bools have strconv's words instead)
    if setting.kind in ("seconds", "float"):
        return parse_number(text, minimum=setting.minimum, maximum=setting.maximum, positive=setting.positive)
    if setting.kind == "int":
        return parse_whole_number(text, minimum=setting.minimum, maximum=setting.maximum)
    if setting.kind == "duration":
        try:
            return parse_sleep_interval(text)
        except ValueError as err:
            raise BadValue(str(err)) from None
    if setting.kind == "path":
        return parse_path(text)
    if setting.kind == "xids":
        return parse_xid_list(text)
    if setting.kind == "gpus":
        try:
            return parse_gpu_selection(text)
        except GpuSelectionError as err:
            raise BadValue(err.fix) from None
    return text


def parse(setting: Setting, text: str | Sequence[str], origin: str) -> Any:
    """The typed value of `text`, given by `origin` ("--http-port" or "KUBEGPU_HTTP_PORT").

    Raises SettingError with the one-line message. A repeatable list takes the repeated flag's values.
    """
    try:
        return _parse_kind(setting, text)
    except BadValue as err:
        raise SettingError(error_text(setting, text, origin, str(err))) from None


def error_text(setting: Setting, text: str | Sequence[str], origin: str, fix: str) -> str:
    shown = text if isinstance(text, str) else ",".join(text)
    if setting.owner == "nvidia":
        message = _nvidia_error_text(setting, shown[:VALUE_LIMIT], origin, fix)
        if len(shown) > VALUE_LIMIT:  # Go's %q is kept; the cut is said after the quoted part
            message = message.replace(
                go_quote(shown[:VALUE_LIMIT]),
                f"{go_quote(shown[:VALUE_LIMIT])}... ({len(shown)} characters)",
                1,
            )
        return message
    default = default_text(setting)
    example = f", e.g. {default} (the default)" if default else ""
    return f"{origin}={quote_id(shown, VALUE_LIMIT)} is not a valid {_what(setting)}: {fix}{example}"


def _nvidia_error_text(setting: Setting, shown: str, origin: str, fix: str) -> str:
    """NVIDIA's binaries' words: Go's flag package for the command line, urfave/cli v2 for env vars.

    A bool is a cli.BoolFlag; --sleep-interval a cli.GenericFlag (it takes `infinite` too) whose parse
    error is time.ParseDuration's.
    """
    quoted = go_quote(shown)
    if setting.kind == "bool":
        if origin.startswith("-"):
            return f"invalid boolean value {quoted} for -{setting.name}: parse error"
        reason = f"strconv.ParseBool: parsing {quoted}: invalid syntax"
        source = _env_source(origin)
        return f"could not parse {quoted} as bool value from {source} for flag {setting.name}: {reason}"
    # A number Go's strconv refuses gets its words; one it takes but kubegpu's bounds refuse, kubegpu's fix.
    syntax = {"int": (_INTEGER, "ParseInt"), "float": (_DECIMAL, "ParseFloat")}.get(setting.kind)
    unparsable = syntax is not None and not syntax[0].fullmatch(shown)
    if origin.startswith("-"):
        return f"invalid value {quoted} for flag -{setting.name}: {'parse error' if unparsable else fix}"
    if setting.kind == "duration":
        return f"could not parse {quoted} from {_env_source(origin)} as value for flag {setting.name}: {fix}"
    if syntax is not None and unparsable:
        fix = f"strconv.{syntax[1]}: parsing {quoted}: invalid syntax"
    go_type = {"float": "float64"}.get(setting.kind, setting.kind)  # (Go's int is int)
    source = _env_source(origin)
    return f"could not parse {quoted} as {go_type} value from {source} for flag {setting.name}: {fix}"


def _env_source(name: str) -> str:
    return f"environment variable {go_quote(name)}"
