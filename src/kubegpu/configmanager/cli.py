"""`kubegpu config-manager`: NVIDIA's config-manager flags, env vars and defaults (device plugin v0.20)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import GoBool
from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.configmanager.manager import Settings, run
from kubegpu.configmanager.procsignal import DEFAULT_PROCESS_TO_SIGNAL
from kubegpu.configmanager.selection import DEFAULT_NODE_LABEL, go_list, unknown_fallbacks
from kubegpu.settings.goparse import parse_list

log = logging.getLogger("kubegpu.configmanager")


def _bool_option(name: str, envvar: str, default: bool, help: str) -> Any:
    return click.option(
        name,
        type=GoBool(),
        is_flag=False,
        flag_value=True,
        default=default,
        envvar=envvar,
        show_envvar=True,
        show_default=True,
        help=help,
    )


def _option(name: str, envvar: str, help: str, default: str = "") -> Any:
    return click.option(
        name, default=default, envvar=envvar, show_envvar=True, show_default=bool(default), help=help
    )


@click.command("config-manager", context_settings={"max_content_width": 110})
@_bool_option("--oneshot", "ONESHOT", False, "check and update the config only once and then exit")
@_option("--kubeconfig", "KUBECONFIG", "absolute path to the kubeconfig file (empty: the in-cluster config)")
@_option("--node-name", "NODE_NAME", "the name of the node to watch for label changes on (required)")
@_option(
    "--node-label",
    "NODE_LABEL",
    "the name of the node label to use for selecting a config",
    default=DEFAULT_NODE_LABEL,
)
@_option(
    "--config-file-srcdir",
    "CONFIG_FILE_SRCDIR",
    "the path to the directory containing available device configuration files (required)",
)
@_option(
    "--config-file-dst", "CONFIG_FILE_DST", "the path to destination device configuration file (required)"
)
@_option("--default-config", "DEFAULT_CONFIG", "the default config to use if no label is set")
@click.option(
    "--fallback-strategies",
    multiple=True,
    envvar="FALLBACK_STRATEGIES",
    show_envvar=True,
    help="ordered list of fallback strategies to use to set a default config when none is provided: "
    "named (a file called `default`), single (the only file), empty (/dev/null: all defaults); "
    "comma-separated or repeated",
)
@_bool_option(
    "--send-signal", "SEND_SIGNAL", True, "send a signal to <process-to-signal> once a config change is made"
)
@click.option(
    "--signal",
    "signal_number",
    type=int,
    default=int(signal.SIGHUP),
    envvar="SIGNAL",
    show_envvar=True,
    show_default=True,
    help="the signal to send to <process-to-signal> if <send-signal> is set (1 = SIGHUP)",
)
@_option(
    "--process-to-signal",
    "PROCESS_TO_SIGNAL",
    "the name of the process to signal if <send-signal> is set, matched against argv[0] (or its base "
    "name) of the processes in /proc; NVIDIA's `nvidia-device-plugin` works too when the plugin runs "
    "under that name",
    default=DEFAULT_PROCESS_TO_SIGNAL,
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def config_manager(
    oneshot: bool,
    kubeconfig: str,
    node_name: str,
    node_label: str,
    config_file_srcdir: str,
    config_file_dst: str,
    default_config: str,
    fallback_strategies: tuple[str, ...],
    send_signal: bool,
    signal_number: int,
    process_to_signal: str,
    verbose: bool,
) -> None:
    """Point the plugin's config file at the one this node's label selects, and signal the plugin.

    Watches this node's `nvidia.com/device-plugin.config` label. The label names a file in
    --config-file-srcdir (the ConfigMap of configs); --config-file-dst (`/config/config.yaml`, the plugin's
    CONFIG_FILE) becomes a symlink to it, or to /dev/null for the empty config. Without the label:
    --default-config, else the fallbacks in order. A label naming no file is an error: the command exits
    1 and the plugin keeps its config. Run it as an init container with ONESHOT=true SEND_SIGNAL=false and
    as a sidecar (shareProcessNamespace: true) that signals the plugin.
    """
    setup_logging(verbose)
    settings = Settings(
        node_name=node_name,
        config_file_srcdir=config_file_srcdir,
        config_file_dst=config_file_dst,
        node_label=node_label,
        default_config=default_config,
        fallback_strategies=tuple(parse_list(fallback_strategies)),
        oneshot=oneshot,
        send_signal=send_signal,
        signal=signal_number,
        process_to_signal=process_to_signal,
    )
    try:
        settings.validate()
        if unknown := unknown_fallbacks(settings.fallback_strategies):
            log.warning(
                "Unknown fallback strategies %s (known: named, single, empty); "
                "this fails once the config-manager has to fall back to them",
                go_list(unknown),
            )
        # Imported here: `kubernetes` takes a while to import, and --help or a flag error need not wait.
        from kubegpu.configmanager.watch import NodeLabelWatcher, connect

        watcher = NodeLabelWatcher(connect(kubeconfig), node_name, node_label)
        run(settings, watcher.labels())
    except ConfigManagerError as err:
        log.error("%s", err)
        sys.exit(1)


if __name__ == "__main__":  # `python -m kubegpu.configmanager.cli`, before the subcommand is registered
    config_manager()
