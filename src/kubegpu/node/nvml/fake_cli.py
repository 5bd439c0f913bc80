"""`kubegpu fake-nvml`: list the fake NVML's node profiles and inject faults into a running fake.

Run standalone as `python -m kubegpu.nvml.cli`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from kubegpu.node.nvml.fake_profile import ProfileError, list_profiles
from kubegpu.node.nvml.fake_state import StateDir, StateDirError
from kubegpu.node.nvml.fake_usage import UsageFile
from kubegpu.node.nvml.fake_use_options import describe_use, use_from_options, use_options
from kubegpu.node.nvml.pci import WHOLE_GPU
from kubegpu.settings.given import read_given
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import FAKE_NVML_INJECT
from kubegpu.settings.table import FAKE_NVML_ENV, lookup
from kubegpu.settings.values import help_text

_STATE_DIR = lookup(FAKE_NVML_INJECT, "state-dir")


@click.group("fake-nvml")
def fake_nvml() -> None:
    """The fake NVML: GPU nodes without GPUs, for demos and tests.

    A process started with KUBEGPU_FAKE_NVML=<profile> sees the profile's GPUs through the NVML API
    instead of the real driver. Give it KUBEGPU_FAKE_NVML_STATE=<dir> too, and `inject` (run with the
    same KUBEGPU_FAKE_NVML_STATE) can make its GPUs fail while it runs. Faults stay in that directory,
    across restarts too, until `inject --recover` or until the directory is removed.
    """


@fake_nvml.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list of objects) instead of a table.")
def profiles(as_json: bool) -> None:
    """List the node profiles shipped with kubegpu.

    Use a name as KUBEGPU_FAKE_NVML=<name>, or write your own profile and pass its .yaml path.
    """
    try:
        summaries = list_profiles()
    except ProfileError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(s) for s in summaries], indent=2))
        return
    from kubegpu.common import output

    rows = [[s.name, s.gpus, s.description] for s in summaries]
    title = f"Fake NVML profiles ({FAKE_NVML_ENV}=<name>)"
    output.print_table(output.console(), ["Name", "GPUs", "Description"], rows, title=title)


@fake_nvml.command("inject")
@click.option(_STATE_DIR.option, _STATE_DIR.key, default=None, metavar="PATH", help=help_text(_STATE_DIR))
@click.option("--gpu", type=click.IntRange(min=0), help="GPU index (as nvidia-smi numbers them).")
@click.option("--xid", type=click.IntRange(min=0), help="Raise an XID critical error event, e.g. 48 or 79.")
@click.option(
    "--lost", is_flag=True, help="The GPU falls off the bus: XID 79, then every NVML call on it fails."
)
@click.option("--ecc", type=click.Choice(["single", "double"]), help="Raise an ECC error event (no XID).")
@click.option("--wait-error", is_flag=True, help="The next NVML event wait fails with NVML_ERROR_UNKNOWN.")
@click.option(
    "--flaky",
    type=click.FloatRange(0.0, 1.0),
    help="From now on this fraction of NVML calls on the GPU fail with NVML_ERROR_UNKNOWN (0 stops it).",
)
@click.option(
    "--recover", is_flag=True, help="Undo --lost, --flaky and pending ECC row remaps, as a GPU reset would."
)
@click.option(
    "--gi",
    type=click.IntRange(min=0),
    help="With --xid: the MIG GPU instance id the event names; with --process: the one they run on.",
)
@click.option("--ci", type=click.IntRange(min=0), help="With --xid: the MIG compute instance id.")
@use_options
def inject(
    state_dir: str | None,
    gpu: int | None,
    xid: int | None,
    lost: bool,
    ecc: str | None,
    wait_error: bool,
    flaky: float | None,
    recover: bool,
    gi: int | None,
    ci: int | None,
    **use: Any,
) -> None:
    """Inject one fault into a running fake NVML.

    \b
    Examples:
      kubegpu fake-nvml inject --gpu 0 --xid 48
      kubegpu fake-nvml inject --gpu 3 --lost
      kubegpu fake-nvml inject --gpu 2 --flaky 0.05
      kubegpu fake-nvml inject --gpu 3 --recover
      kubegpu fake-nvml inject --wait-error
      kubegpu fake-nvml inject --gpu 1 --utilization 85 --process 4242:20480:60 --process 4343:8192:25

    The use options (--utilization ... --process) can be combined; each sets only what it names, and
    --process (repeatable, PID:MIB[:SM %]) replaces the GPU's processes (those of --gi on a MIG GPU).
    """
    use_changes, processes = use_from_options(use, gi)
    actions = {"--xid": xid is not None, "--lost": lost, "--ecc": ecc is not None}
    actions |= {"--wait-error": wait_error, "--flaky": flaky is not None, "--recover": recover}
    actions |= {"a use option": bool(use_changes) or processes is not None}
    chosen = [name for name, on in actions.items() if on]
    if len(chosen) != 1:
        raise click.UsageError(f"give exactly one of {', '.join(actions)} (got {len(chosen)})")
    if ci is not None and xid is None:
        raise click.UsageError("--ci only goes with --xid")
    if gi is not None and xid is None and processes is None:
        raise click.UsageError("--gi only goes with --xid or --process")
    if (gpu is None) != wait_error:
        raise click.UsageError(
            "--wait-error affects every GPU, drop --gpu" if wait_error else f"{chosen[0]} needs --gpu INDEX"
        )
    state = _state_dir(state_dir)
    try:
        if gpu is not None:
            _check_gpu(state, gpu)
        if xid is not None:
            assert gpu is not None
            state.inject_xid(gpu, xid, WHOLE_GPU if gi is None else gi, WHOLE_GPU if ci is None else ci)
            done = f"XID {xid} on GPU {gpu}" + (
                f" (GI {gi}, CI {ci})" if gi is not None or ci is not None else ""
            )
        elif lost:
            assert gpu is not None
            state.inject_lost(gpu)
            done = f"GPU {gpu} fallen off the bus (XID 79)"
        elif ecc is not None:
            assert gpu is not None
            state.inject_ecc(gpu, "double" if ecc == "double" else "single")
            done = f"{ecc}-bit ECC error on GPU {gpu}"
        elif flaky is not None:
            assert gpu is not None
            state.inject_flaky(gpu, flaky)
            done = f"flaky NVML calls ({flaky:.0%}) on GPU {gpu}"
        elif recover:
            assert gpu is not None
            state.recover(gpu)
            done = f"GPU {gpu} recovered"
        elif use_changes or processes is not None:
            assert gpu is not None
            UsageFile(state).set_gpu(gpu, use_changes, processes, gi)
            done = f"{describe_use(use_changes, processes)} on GPU {gpu}"
        else:
            state.inject_wait_error()
            done = "an NVML event wait error"
    except StateDirError as err:  # a torn or foreign state file
        raise click.UsageError(str(err)) from err
    click.echo(f"injected {done} into {state.path}")


def _state_dir(option: str | None) -> StateDir:
    """--state-dir, else KUBEGPU_FAKE_NVML_STATE (read by the settings package, as every command's)."""
    try:
        path = read_given([_STATE_DIR], {_STATE_DIR.name: option})[_STATE_DIR.name].value
        return StateDir.named(path)
    except (ConfigError, StateDirError) as err:
        raise click.UsageError(str(err)) from err


def _check_gpu(state: StateDir, gpu: int) -> None:
    meta = state.read_meta()
    if meta is None:
        click.echo(
            f"warning: no fake NVML has started with {state.path} yet; GPU {gpu} is not checked", err=True
        )
        return
    count = len(meta.get("gpus", []))
    if gpu >= count:
        valid = f"use 0..{count - 1}" if count else "it has none"
        raise click.BadParameter(
            f"the fake NVML (profile {meta.get('profile')}) has no GPU {gpu}: {valid}", param_hint="--gpu"
        )


if __name__ == "__main__":
    fake_nvml(prog_name="kubegpu fake-nvml")
