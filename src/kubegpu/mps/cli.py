"""`kubegpu mps-daemon`: NVIDIA's `mps-control-daemon` binary as a kubegpu subcommand.

`run` is the manager (NVIDIA's default action), `mount-shm` the init step. The config flags are NVIDIA's
two, `--config-file`/CONFIG_FILE and `--mig-strategy`/MIG_STRATEGY, built from the plugin's own flag table
and resolved by the plugin's own `resolve`, so the daemon and the plugin agree on every resource name.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import flag_option
from kubegpu.node.mps_paths import CONTAINER_ROOT, MpsRoot
from kubegpu.settings.flags import FLAGS, FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings, resolve

log = logging.getLogger("kubegpu.mps")

# NVIDIA's two flags, plus kubegpu's opt-ins that change resource names and devices: a plugin that
# honours `rename`/`devices` must find its daemons under the same names, so the daemon takes them too.
DAEMON_FLAGS = ("config-file", "mig-strategy", "allow-resource-customization", "strict-config")
_SPECS = tuple(spec for spec in FLAGS if spec.name in DAEMON_FLAGS)


def _daemon_flag_options(func: Any) -> Any:
    for spec in reversed(_SPECS):
        func = flag_option(spec)(func)
    return func


def daemon_flags(ctx: click.Context, params: dict[str, Any], root: Path) -> dict[str, FlagValue]:
    """The flags for `resolve`, explicit when given on the command line or through their env var."""
    flags = {}
    for spec in _SPECS:
        key = spec.name.replace("-", "_")
        source = ctx.get_parameter_source(key)
        flags[spec.name] = FlagValue(
            params[key], source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        )
    # NVIDIA's daemon never validates mpsRoot (it always works under /mps); the plugin's validation
    # requires it with MPS, so an unset one defaults to where this daemon works. The file's value wins.
    flags["mps-root"] = FlagValue(str(root), explicit=False)
    return flags


_root_option = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=CONTAINER_ROOT,
    envvar="KUBEGPU_MPS_DAEMON_ROOT",
    show_envvar=True,
    show_default=True,
    help="Where the host's MPS root (the plugin's --mps-root) is mounted; pipes, logs and .ready go here.",
)


@click.group("mps-daemon", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def mps_daemon() -> None:
    """The MPS control daemons for resources shared with MPS (NVIDIA's mps-control-daemon).

    Run it as a DaemonSet on nodes labelled nvidia.com/mps.capable=true, privileged, with hostPID and the
    host's MPS root mounted at /mps; `mount-shm` is its init container.
    """


@mps_daemon.command("run")
@_root_option
@click.option("--retry-interval", type=float, default=30.0, show_default=True,
              envvar="KUBEGPU_MPS_RETRY_SECONDS", show_envvar=True,
              help="Seconds before retrying after a daemon failed to start.")  # fmt: skip
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds each nvidia-smi or nvidia-cuda-mps-control call may take.")  # fmt: skip
@click.option("--follow-logs/--no-follow-logs", default=True, show_default=True,
              help="Copy each daemon's control.log to stdout (tail -f), as NVIDIA does.")  # fmt: skip
@click.option("--selinux-fs", type=click.Path(path_type=Path), default=Path("/sys/fs/selinux"), hidden=True,
              envvar="KUBEGPU_SELINUX_FS")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@_daemon_flag_options
@click.pass_context
def run_cmd(
    ctx: click.Context,
    root: Path,
    retry_interval: float,
    timeout_s: float,
    follow_logs: bool,
    selinux_fs: Path,
    verbose: bool,
    **params: Any,
) -> None:
    """Start one MPS control daemon per shared resource; stop them on SIGTERM, restart them on SIGHUP."""
    from kubegpu.mps.daemon import DaemonOptions
    from kubegpu.mps.manager import RunOptions, StartupError, serve

    setup_logging(verbose)
    flags = daemon_flags(ctx, params, root)

    def load_settings() -> PluginSettings:
        return resolve(flags)

    options = RunOptions(
        daemon=DaemonOptions(MpsRoot(root), selinux_fs, timeout_s, follow_logs), retry_s=retry_interval
    )
    try:
        code = asyncio.run(serve(load_settings, options))
    except (ConfigError, StartupError) as err:
        log.error("%s", err)
        sys.exit(1)
    sys.exit(code)


@mps_daemon.command("mount-shm")
@_root_option
@click.option("--meminfo", type=click.Path(dir_okay=False, path_type=Path), default=Path("/proc/meminfo"),
              show_default=True, help="Where MemTotal is read from (the tmpfs gets half of it).")  # fmt: skip
@click.option("--mountinfo", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/proc/self/mountinfo"), show_default=True,
              help="The mount table that says whether a tmpfs is already mounted.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the mount command instead of running it.")
def mount_shm_cmd(root: Path, meminfo: Path, mountinfo: Path, dry_run: bool) -> None:
    """Mount the tmpfs at <root>/shm that MPS clients share as /dev/shm (needs root)."""
    from kubegpu.mps.shm import mount_command, mount_shm, shm_size
    from kubegpu.node.mps_control import MpsCommandError

    setup_logging()
    shm_dir = MpsRoot(root).shm_dir
    if dry_run:
        click.echo(" ".join(mount_command(shm_dir, shm_size(meminfo))))
        return
    try:
        mount_shm(shm_dir, meminfo, mountinfo)
    except (MpsCommandError, OSError) as err:
        log.error("error mounting %s as tmpfs: %s", shm_dir, err)
        sys.exit(1)
