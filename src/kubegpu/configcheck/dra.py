"""`kubegpu config check-dra`: would `kubegpu dra` start with these flags, env vars and feature gates?

The driver's own check (`settings.dra_driver.driver_flags`), on the same flags and env vars, without NVML, the
kubelet or the API server: component-base's and NVIDIA's texts for the gates, NVIDIA's for the flags,
kubegpu's refusal of a gate it does not implement yet, and the warnings the driver would log.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click

from kubegpu.cli.params import given_values, setting_options
from kubegpu.common import output
from kubegpu.settings.dra_driver import driver_flags
from kubegpu.settings.feature_gates import FeatureGates
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import DRA


@dataclass
class DriverCheck:
    gates: FeatureGates | None = None
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "feature_gates": dict(self.gates.enabled) if self.gates is not None else None,
            "warnings": self.warnings,
            "errors": self.errors,
        }


def check_driver(params: dict[str, Any]) -> DriverCheck:
    """The driver's start-up checks of its flags and env vars (`params`: click's values)."""
    report = DriverCheck()
    try:
        flags = driver_flags(given_values(params, DRA))
    except ConfigError as err:
        report.errors.extend(err.problems)
        return report
    report.gates = flags.gates
    report.warnings.extend(flags.warnings)
    return report


@click.command("check-dra")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: gates, warnings, errors.")
@setting_options(DRA)
def check_dra_cmd(as_json: bool, **params: Any) -> None:
    """Check `kubegpu dra`'s flags, env vars and feature gates as the driver checks them at start.

    Takes the driver's flags (and reads its env vars: FEATURE_GATES, CONSUMABLE_SHARES, ...). Exit code 1 when
    the driver would refuse to start.
    """
    report = check_driver(params)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = output.console()
        if report.gates is not None:
            output.print_line(console, f"feature gates: {report.gates.text()}")
        for warning in report.warnings:
            output.print_line(console, f"warning: {warning}", "yellow")
        for error in report.errors:
            output.print_line(console, f"error: {error}", "red")
        if not report.errors:
            output.print_line(console, "OK: the DRA driver would start with these flags", "green")
    sys.exit(output.EXIT_FINDINGS if report.errors else output.EXIT_OK)
