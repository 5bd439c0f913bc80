"""Where each setting's value comes from: the command line, else its env var, else its default.

This is the one place that reads the environment for settings. Every value is parsed and validated here,
once, when a command starts; all bad values are reported together (`SettingError`, one line each).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.settings.setting import Setting
from kubegpu.settings.values import SettingError, parse

Source = Literal["flag", "env", "default"]
CliValue = str | Sequence[str] | None  # the raw text click got; a tuple for a repeatable flag; None: absent


@dataclass(frozen=True, slots=True)
class FlagValue:
    value: Any
    explicit: bool  # given on the command line or through an env var (what NVIDIA calls "set")
    origin: str = ""  # "--http-port" or "KUBEGPU_HTTP_PORT"; "" for the default

    @property
    def source(self) -> Source:
        if not self.explicit:
            return "default"
        return "flag" if self.origin.startswith("-") else "env"


def default_value(setting: Setting) -> FlagValue:
    default = list(setting.default) if setting.kind == "list" else setting.default
    return FlagValue(default, explicit=False)


def _from_env(setting: Setting, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(env var, text) of the env var that gives this setting, or None."""
    for name in setting.envvars:
        text = environ.get(name)
        if text is None:
            continue
        if text == "" and setting.empty_env == "unset":
            continue  # an empty env var counts as unset, as click and Kubernetes' `value: ""` users expect
        return name, text
    return None


def _given(setting: Setting, cli: CliValue, environ: Mapping[str, str]) -> FlagValue:
    if setting.flag and cli is not None and (isinstance(cli, str) or len(cli) > 0):
        return FlagValue(parse(setting, cli, setting.option), True, setting.option)
    found = _from_env(setting, environ)
    if found is None:
        return default_value(setting)
    name, text = found
    if text == "" and setting.empty_env == "value":
        return FlagValue(text, True, name)  # "" is a meaningful value here (e.g. "turn it off")
    if text == "":  # GFD's urfave/cli rule (empty_env="urfave")
        if setting.kind == "duration":
            return default_value(setting)  # ignored
        if setting.kind == "bool":
            return FlagValue(False, True, name)
        return FlagValue(text, True, name)
    if setting.kind == "list" and setting.repeatable:
        return FlagValue(parse(setting, text.split(), name), True, name)  # click's split of a repeated flag
    return FlagValue(parse(setting, text, name), True, name)


def read_given(
    settings: Sequence[Setting],
    cli: Mapping[str, CliValue] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, FlagValue]:
    """Every setting's value by name: `cli` (name -> raw text) beats the environment beats the default.

    `environ` is the process's environment unless given. Raises SettingError naming every bad value.
    """
    environ = os.environ if environ is None else environ
    cli = cli or {}
    out: dict[str, FlagValue] = {}
    problems: list[str] = []
    for setting in settings:
        try:
            out[setting.name] = _given(setting, cli.get(setting.name), environ)
        except SettingError as err:
            problems.extend(err.problems)
    if problems:
        raise SettingError("; ".join(problems), problems)
    return out


def value_of(given: Mapping[str, FlagValue], setting: Setting) -> Any:
    """A setting's value, or its default when `given` leaves it out (e.g. another command's flags)."""
    found = given.get(setting.name)
    return found.value if found is not None else default_value(setting).value
