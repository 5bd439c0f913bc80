"""`kubegpu labels`: NVIDIA GPU Feature Discovery's labels, with GFD's flags and env vars."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.labels.loop import SignalWaiter, serve
from kubegpu.labels.settings import GFD_FLAGS, GfdFlag, LabelSettings, given_flags, resolve_settings
from kubegpu.settings.flags import FlagValue
from kubegpu.settings.goduration import format_go_duration
from kubegpu.settings.nvidia_config import ConfigError

log = logging.getLogger("kubegpu.labels")


def _default_text(flag: GfdFlag) -> str:
    if flag.kind == "duration":
        return format_go_duration(flag.default)
    if flag.kind == "bool":
        return str(flag.default).lower()
    return repr(flag.default) if flag.default == "" else flag.default


def _option(flag: GfdFlag) -> Callable[[Any], Any]:
    names = [f"--{flag.name}", *flag.aliases]
    # No click defaults or envvars: settings.py needs to know what was given where (and click would skip
    # an empty env var, which GFD honours, e.g. GFD_OUTPUT_FILE="" for stdout).
    help_text = f"{flag.help} [env: {', '.join(flag.envvars)}; default: {_default_text(flag)}]"
    key = flag.name.replace("-", "_")
    if flag.kind == "bool":
        # `--oneshot` alone means true; `--oneshot=false` works, as with GFD's flags.
        return click.option(
            *names, key, is_flag=False, flag_value="true", default=None, metavar="BOOL", help=help_text
        )
    metavar = "DURATION" if flag.kind == "duration" else "TEXT"
    return click.option(*names, key, default=None, metavar=metavar, help=help_text)


def _gfd_options(func: Any) -> Any:
    for flag in reversed(GFD_FLAGS):
        func = _option(flag)(func)
    return func


@click.command("labels", context_settings={"max_content_width": 110})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@_gfd_options
def labels(verbose: bool, **params: str | None) -> None:
    """Label this node as NVIDIA's GPU Feature Discovery does (nvidia.com/gpu.product, gpu.count, ...).

    Writes the labels to NFD's features.d file (or stdout), once or every --sleep-interval, and removes
    the file on exit. SIGHUP reloads the config file. Flags, env vars and the config file are GFD's
    (k8s-device-plugin v0.20): a flag beats its env var, which beats the config file, which beats the
    default.
    """
    setup_logging(verbose)
    cli_values = {flag.name: params[flag.name.replace("-", "_")] for flag in GFD_FLAGS}
    try:
        given: dict[str, FlagValue] = given_flags(cli_values, os.environ)
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)

    def load_settings() -> LabelSettings:
        return resolve_settings(given)

    waiter = SignalWaiter().install()
    try:
        code = serve(load_settings, waiter)
    finally:
        waiter.restore()
    log.info("Exiting")
    sys.exit(code)
