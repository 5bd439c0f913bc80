"""`kubegpu config check FILE`: what a node would advertise with this config, before it is rolled out.

It runs the daemon's own code path (flags and env vars validated as at start, config precedence and
validation, discovery, `build_resources`) on a fake node profile or on this node's NVML, and prints the
resources and the device IDs the kubelet would see, every warning, every error with its field path, and the
settings outside the config file with where each came from (as the daemon's start-up log shows them).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from kubegpu.allocation.from_settings import imex_problem, resource_options
from kubegpu.allocation.resources import ResourceError, build_resources
from kubegpu.common import output
from kubegpu.common.files import FileProblem, decode_text, read_bytes
from kubegpu.configcheck.sources import PLAIN, VALUES, Named, Source, classify
from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.configmanager.selection import EMPTY_CONFIG, select_config
from kubegpu.node.discovery import discover, explain_nvml_error, nvml_session
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.node.plugin_settings import validated_plugin_settings
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import CONFIG_FILE_LIMIT, ConfigError
from kubegpu.settings.plugin import MPS_ROOT_MISSING
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
        if self.bad_input:
            return output.EXIT_USAGE
        return output.EXIT_FINDINGS if self.errors else output.EXIT_OK

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
        settings, _ = validated_plugin_settings(flags)
    except ConfigError as err:
        report.errors.extend(err.problems)
        return report
    report.settings = settings.effective
    report.warnings.extend(settings.warnings)
    if problem := imex_problem(settings):  # the daemon refuses to start over it, with or without GPUs
        report.errors.append(problem)
        return report
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
        resources = build_resources(inventory, resource_options(settings))
    except ResourceError as err:
        report.errors.append(str(err))
        return report
    for resource in resources:
        report.resources[resource.name] = [d.id for d in resource.devices]
        report.sharing[resource.name] = resource.sharing
    return report


def _node(profile: str | None) -> str:
    return profile or "this node (real NVML)"


# NVIDIA's text (MPS_ROOT_MISSING) is kept; config check adds where the value comes from on a cluster.
_MPS_ROOT_HINT = (
    " (the Helm chart sets it from mps.root, /run/nvidia/mps by default: check with "
    "--mps-root /run/nvidia/mps or give the values file)"
)


def _explain_mps_root(report: CheckReport) -> None:
    report.errors = [e + _MPS_ROOT_HINT if e.endswith(MPS_ROOT_MISSING) else e for e in report.errors]


@dataclass
class SourceReport:
    """`config check` on a ConfigMap or a values file: one CheckReport per key, under its key name."""

    file: str
    kind: str
    node: str
    configs: list[tuple[str, CheckReport]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the ConfigMap's or values file's own
    warnings: list[str] = field(default_factory=list)
    unlabelled: str | None = None  # values: the key a node without the label gets ("" for an empty config)
    bad_input: bool = False

    @property
    def exit_code(self) -> int:
        if self.bad_input:
            return output.EXIT_USAGE
        own = output.EXIT_FINDINGS if self.errors else output.EXIT_OK
        return max([own, *(r.exit_code for _, r in self.configs)])

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "source": self.kind,
            "node": self.node,
            "configs": [{"key": key, **r.to_json()} for key, r in self.configs],
            "unlabelled": self.unlabelled,
            "warnings": self.warnings,
            "errors": self.errors,
        }


def check_source(
    file: str, source: Source, flags: dict[str, FlagValue], profile: str | None, key: str | None
) -> SourceReport:
    """Check every config of a ConfigMap or values file (or the one `key` names) as a node would get it.

    Each config is written to a file of its own, as config-manager's ConfigMap volume holds it, and checked
    with `check`: the daemon reads exactly those bytes.
    """
    report = SourceReport(file, source.kind, _node(profile), errors=list(source.problems))
    report.warnings = list(source.warnings)
    if source.unusable:
        report.errors, report.bad_input = [source.unusable], True
        return report
    chosen = source.configs
    if key is not None:
        keys = [n.key for n in source.configs]
        try:  # config-manager's rule and words for a label that names no key
            select_config(key, {*keys, *(n.bare for n in source.configs)})
        except ConfigManagerError as err:
            report.errors = [f"{err} in {file} (its keys: {', '.join(keys) or 'none'})"]
            report.bad_input = True
            return report
        chosen = [n for n in source.configs if key in (n.key, n.bare)]
    elif source.kind == VALUES:
        report.unlabelled = _unlabelled(source, report)
    if source.kind == VALUES and not flags["mps-root"].explicit:
        flags = {**flags, "mps-root": FlagValue(source.mps_root, True, "MPS_ROOT (the chart's mps.root)")}
    with tempfile.TemporaryDirectory(prefix="kubegpu-config-check-") as tmp:
        for index, named in enumerate(chosen):
            report.configs.append(
                (named.key, _check_one(file, Path(tmp) / str(index), named, flags, profile))
            )
    return report


def _check_one(
    shown: str, directory: Path, named: Named, flags: dict[str, FlagValue], profile: str | None
) -> CheckReport:
    directory.mkdir(mode=0o700)
    path = directory / "config"  # any name: every mention of the scratch copy is replaced below
    path.write_bytes(named.data)
    one = check({**flags, "config-file": FlagValue(str(path), True, "--config-file")}, profile)
    _explain_mps_root(one)
    one.config_file = f"{shown}[{named.key}]"
    # The config's name in the file, not the scratch copy (deleted by the time anyone reads the report).
    one.errors = [e.replace(str(path), one.config_file) for e in one.errors]
    one.warnings = [w.replace(str(path), one.config_file) for w in one.warnings]
    one.settings = tuple(
        replace(e, given=replace(e.given, value=one.config_file)) if e.setting.name == "config-file" else e
        for e in one.settings
    )
    return one


def _unlabelled(source: Source, report: SourceReport) -> str | None:
    """What config-manager gives a node without the label, from the values' default and fallbacks."""
    try:
        return select_config("", [n.key for n in source.configs], source.default, source.fallbacks)
    except ConfigManagerError as err:
        report.errors.append(f"nodes without the nvidia.com/device-plugin.config label: {err}")
        return None


def render(report: CheckReport, console: Console, settings_table: bool = True) -> None:
    """Tables on a terminal (IDs and names never cut), one plain line per row when piped."""
    line = partial(output.print_line, console)
    line(f"config {report.config_file or '(none: defaults)'} on {report.node}")
    rows = [
        [name, str(len(ids)), report.sharing[name], _shown_ids(ids)] for name, ids in report.resources.items()
    ]
    output.print_table(
        console,
        ["resource", "devices", "sharing", "device IDs (as the kubelet sees them)"],
        rows,
        plain=lambda r: f"{r[0]}: {r[1]} devices, sharing {r[2]}: {r[3]}",
    )
    if settings_table:
        rows = [[e.setting.label, e.text or '""', f"{e.source} {e.via}".strip()] for e in report.settings]
        output.print_table(
            console,
            ["setting", "value", "source"],
            rows,
            title="settings outside the config file",
            plain=lambda r: f"setting {r[0]}={r[1]} ({r[2]})",
        )
    _verdict(report.warnings, report.errors, console)
    if not report.errors:
        line("OK: the plugin would start with this config", "green")


def _shown_ids(ids: list[str]) -> str:
    """The first four IDs whole (time-sliced replicas differ only at the end), and how many more."""
    return ", ".join(ids[:4]) + (f", ... ({len(ids) - 4} more)" if len(ids) > 4 else "")


def _verdict(warnings: list[str], errors: list[str], console: Console) -> None:
    for warning in warnings:
        output.print_line(console, f"warning: {warning}", "yellow")
    for error in errors:
        output.print_line(console, f"error: {error}", "red")


def render_source(report: SourceReport, console: Console) -> None:
    """Each config under its key, then the ConfigMap's or values file's own findings and a verdict."""
    line = partial(output.print_line, console)
    for index, (_, one) in enumerate(report.configs):
        render(one, console, settings_table=index == len(report.configs) - 1)
        line("")
    if report.unlabelled is not None:
        got = "an empty config (all defaults)" if report.unlabelled == EMPTY_CONFIG else report.unlabelled
        line(f"nodes without the nvidia.com/device-plugin.config label get: {got}")
    _verdict(report.warnings, report.errors, console)
    failed = [key for key, one in report.configs if one.errors]
    if failed:
        line(f"FAILED: {len(failed)} of {len(report.configs)} configs: {', '.join(failed)}", "red")
    elif not report.errors:
        line(f"OK: the plugin would start with each of the {len(report.configs)} configs", "green")


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
@click.option("--key", metavar="NAME", help="Check only this config of a ConfigMap or values file (the value "
              "of a node's nvidia.com/device-plugin.config label).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: resources, warnings, errors.")
@_setting_options
def check_cmd(file: str, profile: str | None, key: str | None, as_json: bool, **params: Any) -> None:
    """Validate FILE and show the resources and device IDs a node would advertise with it.

    FILE is a config file, a ConfigMap (every data key is checked, under its name; several ConfigMaps or
    other objects may share the file, e.g. `helm template` output) or a Helm values file (its
    config.map). Flags and env vars apply with the daemon's precedence, so `MIG_STRATEGY=mixed kubegpu
    config check FILE --profile a100-mig` shows what the daemon would do there. Exit code 1 when there are
    errors, 2 when FILE cannot be used.
    """
    from kubegpu.cli.params import given_values

    data = b""
    try:
        data = read_bytes(file, limit=CONFIG_FILE_LIMIT, what="config file")
        source = classify(decode_text(data, file, what="config file"), file)
    except FileProblem as err:
        if isinstance(err.__cause__, OSError) or "not a regular file" in err.problem:  # cannot be read at all
            report = CheckReport(config_file=file, node=_node(profile), errors=[str(err)], bad_input=True)
            _show(report, as_json)
        source = Source(PLAIN)  # too large, not text: the plain check says so in the plugin's words
    if key is not None and source.kind == PLAIN:
        report = CheckReport(config_file=file, node=_node(profile), bad_input=True)
        report.errors = [
            f"--key {key}: {file} is a plain config, not a ConfigMap or Helm values file; drop --key"
        ]
        _show(report, as_json)
    try:
        flags = given_values(params, CONFIG_CHECK)  # a bad flag or env var: the daemon would not start
    except ConfigError as err:
        report = CheckReport(config_file=file, node=_node(profile), errors=list(err.problems))
        _show(report, as_json)
    if source.kind != PLAIN:
        _show(check_source(file, source, flags, profile, key), as_json)
    flags["config-file"] = FlagValue(file, True, "--config-file")  # FILE takes the flag's place
    report = check(flags, profile)
    _explain_mps_root(report)
    _show(report, as_json)


def _show(report: CheckReport | SourceReport, as_json: bool) -> NoReturn:
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    elif report.bad_input:
        output.error(report.errors[0], report.exit_code)
    elif isinstance(report, SourceReport):
        render_source(report, output.console())
    else:
        render(report, output.console())
    sys.exit(report.exit_code)


def _add_driver_check() -> None:
    from kubegpu.configcheck.dra import check_dra_cmd

    config_group.add_command(check_dra_cmd)


_add_driver_check()
