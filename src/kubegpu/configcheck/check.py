"""`kubegpu config check FILE`: what a node would advertise with this config, before it is rolled out.

It runs the daemon's own code path (flags and env vars validated as at start, config precedence and
validation, discovery, `build_resources`) on a fake node profile or on this node's NVML, and prints the
resources and the device IDs the kubelet would see, every warning, every error with its field path, and the
settings outside the config file with where each came from (as the daemon's start-up log shows them).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kubegpu.allocation.from_settings import allocate_options, resource_options
from kubegpu.allocation.resources import ResourceError, build_resources
from kubegpu.common.files import FileProblem, read_bytes
from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import CONFIG_FILE_LIMIT, ConfigError
from kubegpu.settings.plugin import resolve
from kubegpu.settings.report import Effective
from kubegpu.settings.setting import CONFIG_CHECK


@dataclass
class CheckReport:
    config_file: str
    node: str
    resources: dict[str, list[str]] = field(default_factory=dict)
    sharing: dict[str, str] = field(default_factory=dict)  # resource -> none / time-slicing / mps
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    settings: tuple[Effective, ...] = ()
    bad_input: bool = False  # FILE or --profile unusable: exit 2 (bad usage or input), not 1 (findings)

    @property
    def exit_code(self) -> int:
        """0: the plugin would start; 1: it would not (the errors say why); 2: FILE or --profile unusable."""
        return 2 if self.bad_input else 1 if self.errors else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "config_file": self.config_file,
            "node": self.node,
            "resources": self.resources,
            "sharing": self.sharing,
            "warnings": self.warnings,
            "errors": self.errors,
            "settings": [e.to_json() for e in self.settings],
        }


def check(flags: dict[str, FlagValue], profile: str | None) -> CheckReport:
    config_file = str(flags["config-file"].value)
    report = CheckReport(config_file=config_file, node=_node(profile))
    try:
        settings = resolve(flags)
    except ConfigError as err:
        report.errors.extend(err.problems)
        return report
    report.settings = settings.effective
    report.warnings.extend(settings.warnings)
    try:
        backend = load_nvml(NvmlSelection.fake(profile) if profile else settings.env.nvml)
    except ValueError as err:  # an unknown or broken profile
        report.errors.append(str(err))
        report.bad_input = profile is not None
        return report
    try:
        with nvml_session(backend.nvml):
            inventory = discover(backend)
    except backend.nvml.NVMLError as err:  # no driver or library here
        hint = "Use --profile to check against a fake node."
        problem = f"cannot discover GPUs: {err}. {explain_nvml_error(err)} {hint}"
        if settings.flags.failOnInitError is False:  # the daemon stays up and retries, as NVIDIA's does
            report.warnings.append(f"{problem} (failOnInitError=false: the plugin would start and wait)")
        else:
            report.errors.append(problem)
        return report
    if not inventory.gpus:  # the daemon starts, advertises nothing and retries discovery
        report.warnings.append("no GPUs found: the plugin would start, advertising nothing until GPUs appear")
        return report
    try:
        allocate_options(settings)  # the daemon's next step: a required IMEX channel must exist here
        resources = build_resources(inventory, resource_options(settings))
    except (ResourceError, ImexChannelError) as err:
        report.errors.append(str(err))
        return report
    for resource in resources:
        report.resources[resource.name] = [d.id for d in resource.devices]
        report.sharing[resource.name] = resource.sharing
    return report


def _node(profile: str | None) -> str:
    return profile or "this node (real NVML)"


def render(report: CheckReport, console: Console) -> None:
    console.print(f"config {report.config_file or '(none: defaults)'} on {report.node}", soft_wrap=True)
    if report.resources:
        table = Table("resource", "devices", "sharing", "device IDs (as the kubelet sees them)")
        for name, ids in report.resources.items():
            shown = ", ".join(ids[:4]) + (f", ... ({len(ids) - 4} more)" if len(ids) > 4 else "")
            table.add_row(name, str(len(ids)), report.sharing[name], shown)
        console.print(table)
    if report.settings:
        settings = Table("setting", "value", "source", title="settings outside the config file")
        settings.columns[1].overflow = "fold"
        for entry in report.settings:
            settings.add_row(entry.setting.label, entry.text or '""', f"{entry.source} {entry.via}".strip())
        console.print(settings)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}", highlight=False, soft_wrap=True)
    for error in report.errors:
        console.print(f"[red]error[/red]: {error}", highlight=False, soft_wrap=True)
    if not report.errors:
        console.print("[green]OK[/green]: the plugin would start with this config")


def _setting_options(func: Any) -> Any:
    from kubegpu.cli.params import setting_options

    return setting_options(CONFIG_CHECK)(func)


@click.group("config")
def config_group() -> None:
    """Work with NVIDIA-format config files."""


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--profile", help="Fake node profile to check against (see `kubegpu fake-nvml profiles`); "
              "without it, this node's NVML is used.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: resources, warnings, errors.")
@_setting_options
def check_cmd(file: str, profile: str | None, as_json: bool, **params: Any) -> None:
    """Validate FILE and show the resources and device IDs a node would advertise with it.

    Flags and env vars apply with the daemon's precedence, so `MIG_STRATEGY=mixed kubegpu config check
    FILE --profile a100-mig` shows what the daemon would do there. Exit code 1 when there are errors.
    """
    from kubegpu.cli.params import given_values

    try:
        read_bytes(file, limit=CONFIG_FILE_LIMIT, what="config file")
    except FileProblem as err:
        if isinstance(err.__cause__, OSError) or "not a regular file" in err.problem:  # cannot be read at all
            report = CheckReport(config_file=file, node=_node(profile), errors=[str(err)], bad_input=True)
            _show(report, as_json)
    try:
        flags = given_values(params, CONFIG_CHECK)  # a bad flag or env var: the daemon would not start
    except ConfigError as err:
        report = CheckReport(config_file=file, node=_node(profile), errors=list(err.problems))
    else:
        flags["config-file"] = FlagValue(file, True, "--config-file")  # FILE takes the flag's place
        report = check(flags, profile)
    _show(report, as_json)


def _show(report: CheckReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    elif report.bad_input:
        click.echo(f"error: {report.errors[0]}", err=True)
    else:
        render(report, Console())
    sys.exit(report.exit_code)
