"""The `kubegpu` command line."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys

# gRPC's C core logs connection chatter (GOAWAY on shutdown, ...) to stderr at INFO; keep errors only.
# Must be set before grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
from typing import Any

import click
from click.core import ParameterSource

from kubegpu import __version__
from kubegpu.cli.params import GoBool
from kubegpu.settings.nvidia_config import (
    FLAGS,
    ConfigError,
    FlagSpec,
    FlagValue,
    PluginSettings,
    parse_list,
    resolve,
)

log = logging.getLogger("kubegpu")


def setup_logging(verbose: bool = False) -> None:
    """One line per record: time, level, component, message (NVIDIA's plugin logs the same way, via klog)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )


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


class LazyGroup(click.Group):
    """A click group whose subcommands are named "module:attribute" and imported on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: dict[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_commands])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_commands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.version_option(__version__, prog_name="kubegpu")
def main() -> None:
    """kubegpu: a Kubernetes GPU device plugin (a drop-in for NVIDIA's) and the SRE tools around it.

    Start with `kubegpu demo` to see a simulated GPU node, kubelet and plugin at work.
    """


def plugin_flag_options(func: Any) -> Any:
    """Add every NVIDIA plugin flag (with its env var) to a command."""
    for spec in reversed(FLAGS):
        func = flag_option(spec)(func)
    return func


@main.command("plugin")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@plugin_flag_options
@click.pass_context
def plugin_cmd(ctx: click.Context, verbose: bool, **params: Any) -> None:
    """Run the device plugin daemon on this node.

    Flags, env vars and the config file are NVIDIA's (k8s-device-plugin v0.20): a flag on the command line
    beats its env var, which beats the config file, which beats the default.
    """
    setup_logging(verbose)
    flags = flag_values(ctx, params)
    try:
        settings = resolve(flags)
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)

    from kubegpu.plugin.daemon import Daemon, StartupError

    def reload_settings() -> PluginSettings:
        return resolve(flags)

    try:
        code = asyncio.run(Daemon(settings, reload_settings=reload_settings).run())
    except StartupError as err:
        log.error("%s", err)
        sys.exit(1)
    sys.exit(code)


# Subcommands in their own packages, imported only when invoked: the daemon should not pay (in start-up
# time and resident memory) for the simulator, the fake NVML, the demo and rich.
main.lazy_commands.update(
    {
        "demo": "kubegpu.demo.run:demo_cmd",
        "kubelet-sim": "kubegpu.kubeletsim.cli:kubelet_sim",
        "fake-nvml": "kubegpu.node.nvml.fake_cli:fake_nvml",
        "lint": "kubegpu.toolkit.cli:lint",
        "explain": "kubegpu.toolkit.cli:explain",
        "doctor": "kubegpu.toolkit.cli:doctor",
        "config": "kubegpu.configcheck.check:config_group",
        "labels": "kubegpu.labels.cli:labels",
        "config-manager": "kubegpu.configmanager.cli:config_manager",
        "mps-daemon": "kubegpu.mps.cli:mps_daemon",
    }
)
