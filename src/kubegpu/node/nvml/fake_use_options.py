"""The use options of `kubegpu fake-nvml inject`: what a GPU is doing, as `usage.json` records it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from kubegpu.node.nvml.fake_usage import ProcessUse, parse_process

F = TypeVar("F", bound=Callable[..., Any])

# option name -> (GpuUse field, click type, help)
_OPTIONS: dict[str, tuple[str, click.ParamType, str]] = {
    "--utilization": (
        "utilization",
        click.IntRange(0, 100),
        "GPU utilisation in % (what NVML and DCGM report).",
    ),
    "--memory-util": ("memory_util", click.IntRange(0, 100), "Memory (copy) utilisation in %."),
    "--memory-used": (
        "memory_used_mib",
        click.IntRange(min=0),
        "MiB of GPU memory in use besides the processes' own (contexts, reservations).",
    ),
    "--power": ("power_w", click.FloatRange(min=0.0), "Power draw in W."),
    "--temperature": ("temperature_c", click.IntRange(min=0), "GPU temperature in C."),
    "--sm-clock": ("sm_clock_mhz", click.IntRange(min=0), "SM clock in MHz."),
}


def use_options(command: F) -> F:
    """Add the use options to `inject`."""
    for option, (key, kind, help_) in reversed(_OPTIONS.items()):
        command = click.option(option, key, type=kind, default=None, help=help_)(command)
    command = click.option(
        "--mps", "mps_clients", is_flag=True, help="With --process: they are MPS clients of the GPU."
    )(command)
    command = click.option(
        "--process",
        "process_specs",
        multiple=True,
        metavar="PID:MIB[:SM]",
        help="A compute process: its PID, GPU memory in MiB and SM utilisation in % (repeatable); replaces "
        "the GPU's processes. --process none leaves it with none.",
    )(command)
    return command


def use_from_options(
    use: Mapping[str, Any], gi: int | None
) -> tuple[dict[str, Any], list[ProcessUse] | None]:
    """The GpuUse fields to change and the processes to set (None: leave them), from the options given."""
    changes = {key: use[key] for key, _, _ in _OPTIONS.values() if use.get(key) is not None}
    specs: tuple[str, ...] = use.get("process_specs") or ()
    if use.get("mps_clients") and not specs:
        raise click.UsageError("--mps only goes with --process")
    if not specs:
        return changes, None
    if specs == ("none",):
        return changes, []
    processes = []
    for spec in specs:
        try:
            pid, mib, sm = parse_process(spec)
        except ValueError as err:
            raise click.BadParameter(str(err).removeprefix("--process "), param_hint="--process") from None
        processes.append(ProcessUse(pid, mib, sm, gi=gi, mps=bool(use.get("mps_clients"))))
    return changes, processes


def describe_use(changes: Mapping[str, Any], processes: list[ProcessUse] | None) -> str:
    said = [f"{key}={value}" for key, value in changes.items()]
    if processes is not None:
        said.append(f"{len(processes)} process{'es' if len(processes) != 1 else ''}")
    return ", ".join(said)
