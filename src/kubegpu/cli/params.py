"""Click parameter types shared by kubegpu's commands."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from kubegpu.settings.flags import FLAGS, FlagSpec, FlagValue
from kubegpu.settings.goparse import parse_bool, parse_list


class GoBool(click.ParamType):
    """Booleans spelled the way NVIDIA's flags and env vars accept them (Go's strconv.ParseBool):
    `--oneshot`, `--oneshot=false`, `ONESHOT=true`."""

    name = "boolean"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> bool:
        if isinstance(value, bool):
            return value
        try:
            return parse_bool(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


def flag_option(spec: FlagSpec) -> Any:
    names = [f"--{spec.name}", *(f"--{a}" for a in spec.aliases)]
    common: dict[str, Any] = {
        "envvar": list(spec.envvars),
        "show_envvar": True,
        "help": spec.help,
        "show_default": True,
    }
    if spec.kind == "bool":
        # `--pass-device-specs` alone means true, `--fail-on-init-error=false` works as with NVIDIA's flags.
        return click.option(
            *names, type=GoBool(), is_flag=False, flag_value=True, default=spec.default, **common
        )
    if spec.kind == "list":
        return click.option(*names, default=",".join(spec.default), **common)
    if spec.kind in ("int", "float"):
        kind = click.IntRange(min=0, max=65535) if spec.kind == "int" else click.FloatRange(min=0)
        return click.option(*names, type=kind, default=spec.default, **common)
    return click.option(*names, default=spec.default, **common)


def flag_values(ctx: click.Context, params: dict[str, Any]) -> dict[str, FlagValue]:
    out = {}
    for spec in FLAGS:
        key = spec.name.replace("-", "_")
        value = params[key]
        if spec.kind == "list":
            value = parse_list(value)
        source = ctx.get_parameter_source(key)
        out[spec.name] = FlagValue(
            value, source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        )
    return out


def plugin_flag_options(func: Any) -> Any:
    """Add every NVIDIA plugin flag (with its env var) to a command."""
    for spec in reversed(FLAGS):
        func = flag_option(spec)(func)
    return func
