"""Click options built from the settings table, and the values the commands get from them.

Click only collects what was typed on the command line (every option defaults to None); the settings
package reads the env vars, applies the defaults and validates everything in one go (`read_given`), so
every command reports a bad flag or env var the same way: one line naming it, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import click

from kubegpu.settings.given import FlagValue, read_given
from kubegpu.settings.setting import Setting
from kubegpu.settings.table import for_command
from kubegpu.settings.values import help_text

_METAVARS = {
    "bool": "BOOLEAN",
    "int": "INTEGER",
    "float": "FLOAT",
    "seconds": "SECONDS",
    "duration": "DURATION",
    "path": "PATH",
}


def setting_option(setting: Setting) -> Callable[[Any], Any]:
    names = [setting.option, *setting.aliases]
    common: dict[str, Any] = {
        "default": None,
        "help": help_text(setting),
        "hidden": setting.hidden,
        "metavar": _METAVARS.get(setting.kind, "TEXT"),
    }
    if setting.kind == "bool":
        # `--pass-device-specs` alone means true; `--fail-on-init-error=false` works, as with NVIDIA's flags.
        return click.option(*names, setting.key, is_flag=False, flag_value="true", **common)
    if setting.repeatable:
        return click.option(*names, setting.key, multiple=True, **common)
    return click.option(*names, setting.key, **common)


def setting_options(command: str) -> Callable[[Any], Any]:
    """Add the flags of `kubegpu <command>` to a click command, in the table's order."""

    def decorate(func: Any) -> Any:
        for setting in reversed(for_command(command)):
            if setting.flag:
                func = setting_option(setting)(func)
        return func

    return decorate


def given_values(params: Mapping[str, Any], command: str) -> dict[str, FlagValue]:
    """Every setting of `kubegpu <command>`: click's `params`, else the environment, else the default.

    Validated; raises SettingError (a ConfigError) naming every bad value, one line each.
    """
    settings = for_command(command)
    return read_given(settings, {s.name: params.get(s.key) for s in settings if s.flag})
