"""`kubegpu mps-daemon`: NVIDIA's `mps-control-daemon` binary as a kubegpu subcommand.

`run` is the manager (NVIDIA's default action), `mount-shm` the init step. The config flags are NVIDIA's
two, `--config-file`/CONFIG_FILE and `--mig-strategy`/MIG_STRATEGY, the plugin's own settings (declared once
in `kubegpu.settings.table`) resolved by the plugin's own `resolve`, so the daemon and the plugin agree on
every resource name.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import given_values, setting_options
from kubegpu.common.click_types import FiniteFloatRange
from kubegpu.node.mps_paths import MpsRoot
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings, resolve
from kubegpu.settings.setting import MPS_DAEMON, MPS_MOUNT_SHM

log = logging.getLogger("kubegpu.mps")


def daemon_flags(given: dict[str, FlagValue]) -> dict[str, FlagValue]:
    """The flags for the plugin's `resolve`: the daemon's settings, and where its MPS root is."""
    flags = dict(given)
    # NVIDIA's daemon never validates mpsRoot (it always works under /mps); the plugin's validation
    # requires it with MPS, so an unset one defaults to where this daemon works. The file's value wins.
    flags["mps-root"] = FlagValue(str(given["root"].value), explicit=False)
    return flags


@click.group("mps-daemon", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def mps_daemon() -> None:
    """The MPS control daemons for resources shared with MPS (NVIDIA's mps-control-daemon).

    Run it as a DaemonSet on nodes labelled nvidia.com/mps.capable=true, privileged, with hostPID and the
    host's MPS root mounted at /mps; `mount-shm` is its init container.
    """


@mps_daemon.command("run")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=0, min_open=True), default=30.0,
              show_default=True,
              help="Seconds each nvidia-smi or nvidia-cuda-mps-control call may take.")  # fmt: skip
@click.option("--follow-logs/--no-follow-logs", default=True, show_default=True,
              help="Copy each daemon's control.log to stdout (tail -f), as NVIDIA does.")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@setting_options(MPS_DAEMON)
def run_cmd(timeout_s: float, follow_logs: bool, verbose: bool, **params: Any) -> None:
    """Start one MPS control daemon per shared resource; stop them on SIGTERM, restart them on SIGHUP."""
    from kubegpu.mps.daemon import DaemonOptions
    from kubegpu.mps.manager import RunOptions, StartupError, serve

    setup_logging(verbose)
    try:
        given = given_values(params, MPS_DAEMON)  # every flag and env var, validated once, here
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)
    flags = daemon_flags(given)

    def load_settings() -> PluginSettings:
        return resolve(flags)

    daemon = DaemonOptions(MpsRoot(given["root"].value), given["selinux-fs"].value, timeout_s, follow_logs)
    options = RunOptions(daemon=daemon, retry_s=given["retry-interval"].value)
    try:
        code = asyncio.run(serve(load_settings, options))
    except (ConfigError, StartupError) as err:
        log.error("%s", err)
        sys.exit(1)
    sys.exit(code)


@mps_daemon.command("mount-shm")
@setting_options(MPS_MOUNT_SHM)
@click.option("--meminfo", type=click.Path(dir_okay=False, path_type=Path), default=Path("/proc/meminfo"),
              show_default=True, help="Where MemTotal is read from (the tmpfs gets half of it).")  # fmt: skip
@click.option("--mountinfo", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/proc/self/mountinfo"), show_default=True,
              help="The mount table that says whether a tmpfs is already mounted.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the mount command instead of running it.")
def mount_shm_cmd(meminfo: Path, mountinfo: Path, dry_run: bool, **params: Any) -> None:
    """Mount the tmpfs at <root>/shm that MPS clients share as /dev/shm (needs root)."""
    from kubegpu.node.mps_control import MpsCommandError
    from kubegpu.node.mps_shm import mount_command, mount_shm, shm_size

    setup_logging()
    try:
        root = given_values(params, MPS_MOUNT_SHM)["root"].value
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)
    shm_dir = MpsRoot(root).shm_dir
    if dry_run:
        click.echo(" ".join(mount_command(shm_dir, shm_size(meminfo))))
        return
    try:
        mount_shm(shm_dir, meminfo, mountinfo)
    except (MpsCommandError, OSError) as err:
        log.error("error mounting %s as tmpfs: %s", shm_dir, err)
        sys.exit(1)
