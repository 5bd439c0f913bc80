"""Click parameter types shared by kubegpu's commands."""

from __future__ import annotations

from typing import Any

import click

from kubegpu.settings.nvidia_config import parse_bool


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
