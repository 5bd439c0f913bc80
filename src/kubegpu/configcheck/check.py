"""`kubegpu config check FILE`: what a node would advertise with this config, before it is rolled out.

It runs the daemon's own code path (config precedence and validation, discovery, `build_resources`) on a
fake node profile or on this node's NVML, and prints the resources and the device IDs the kubelet would
see, every warning, and every error with its field path.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kubegpu.allocation.from_settings import resource_options
from kubegpu.allocation.resources import ResourceError, build_resources
from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session
from kubegpu.node.nvml.backend import FAKE_ENV, load_nvml
from kubegpu.settings.flags import FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import resolve


@dataclass
class CheckReport:
    config_file: str
    node: str
    resources: dict[str, list[str]] = field(default_factory=dict)
    sharing: dict[str, str] = field(default_factory=dict)  # resource -> none / time-slicing / mps
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "config_file": self.config_file,
            "node": self.node,
            "resources": self.resources,
            "sharing": self.sharing,
            "warnings": self.warnings,
            "errors": self.errors,
        }


def check(flags: dict[str, FlagValue], profile: str | None) -> CheckReport:
    config_file = str(flags["config-file"].value)
    env = {FAKE_ENV: profile} if profile else None
    report = CheckReport(config_file=config_file, node=profile or "this node (real NVML)")
    try:
        settings = resolve(flags)
    except ConfigError as err:
        report.errors.extend(err.problems)
        return report
    report.warnings.extend(settings.warnings)
    try:
        backend = load_nvml(env)
    except ValueError as err:  # an unknown or broken profile
        report.errors.append(str(err))
        return report
    try:
        with nvml_session(backend.nvml):
            inventory = discover(backend)
    except backend.nvml.NVMLError as err:  # no driver or library here
        hint = "Use --profile to check against a fake node."
        report.errors.append(f"cannot discover GPUs: {err}. {explain_nvml_error(err)} {hint}")
        return report
    try:
        resources = build_resources(inventory, resource_options(settings))
    except ResourceError as err:
        report.errors.append(str(err))
        return report
    for resource in resources:
        report.resources[resource.name] = [d.id for d in resource.devices]
        report.sharing[resource.name] = resource.sharing
    return report


def render(report: CheckReport, console: Console) -> None:
    console.print(f"config {report.config_file or '(none: defaults)'} on {report.node}")
    if report.resources:
        table = Table("resource", "devices", "sharing", "device IDs (as the kubelet sees them)")
        for name, ids in report.resources.items():
            shown = ", ".join(ids[:4]) + (f", ... ({len(ids) - 4} more)" if len(ids) > 4 else "")
            table.add_row(name, str(len(ids)), report.sharing[name], shown)
        console.print(table)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", highlight=False)
    for error in report.errors:
        console.print(f"[red]error[/red]: {error}", highlight=False)
    if not report.errors:
        console.print("[green]OK[/green]: the plugin would start with this config")


def _plugin_flag_options(func: Any) -> Any:
    from kubegpu.cli.params import plugin_flag_options

    return plugin_flag_options(func)


@click.group("config")
def config_group() -> None:
    """Work with NVIDIA-format config files."""


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--profile", help="Fake node profile to check against (see `kubegpu fake-nvml profiles`); "
              "without it, this node's NVML is used.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: resources, warnings, errors.")
@_plugin_flag_options
@click.pass_context
def check_cmd(ctx: click.Context, file: str, profile: str | None, as_json: bool, **params: Any) -> None:
    """Validate FILE and show the resources and device IDs a node would advertise with it.

    Flags and env vars apply with the daemon's precedence, so `MIG_STRATEGY=mixed kubegpu config check
    FILE --profile a100-mig` shows what the daemon would do there. Exit code 1 when there are errors.
    """
    from kubegpu.cli.params import flag_values

    flags = flag_values(ctx, params)
    flags["config-file"] = FlagValue(file, True)
    report = check(flags, profile)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, Console())
    sys.exit(1 if report.errors else 0)
