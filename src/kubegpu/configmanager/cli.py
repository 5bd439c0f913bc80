"""`kubegpu config-manager`: NVIDIA's config-manager flags, env vars and defaults (device plugin v0.20)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import given_values, setting_options
from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.configmanager.manager import Settings, run
from kubegpu.configmanager.selection import go_list, unknown_fallbacks
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import CONFIG_MANAGER

log = logging.getLogger("kubegpu.configmanager")


@click.command("config-manager", context_settings={"max_content_width": 110})
@setting_options(CONFIG_MANAGER)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def config_manager(verbose: bool, **params: Any) -> None:
    """Point the plugin's config file at the one this node's label selects, and signal the plugin.

    Watches this node's `nvidia.com/device-plugin.config` label. The label names a file in
    --config-file-srcdir (the ConfigMap of configs); --config-file-dst (`/config/config.yaml`, the plugin's
    CONFIG_FILE) becomes a symlink to it, or to /dev/null for the empty config. Without the label:
    --default-config, else the fallbacks in order. A label naming no file is an error: the command exits
    1 and the plugin keeps its config. Run it as an init container with ONESHOT=true SEND_SIGNAL=false and
    as a sidecar (shareProcessNamespace: true) that signals the plugin.
    """
    setup_logging(verbose)
    try:
        given = {name: flag.value for name, flag in given_values(params, CONFIG_MANAGER).items()}
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)
    settings = Settings(
        node_name=given["node-name"],
        config_file_srcdir=given["config-file-srcdir"],
        config_file_dst=given["config-file-dst"],
        node_label=given["node-label"],
        default_config=given["default-config"],
        fallback_strategies=tuple(given["fallback-strategies"]),
        oneshot=given["oneshot"],
        send_signal=given["send-signal"],
        signal=given["signal"],
        process_to_signal=given["process-to-signal"],
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

        watcher = NodeLabelWatcher(connect(given["kubeconfig"]), settings.node_name, settings.node_label)
        run(settings, watcher.labels())
    except ConfigManagerError as err:
        log.error("%s", err)
        sys.exit(1)


if __name__ == "__main__":  # `python -m kubegpu.configmanager.cli`, before the subcommand is registered
    config_manager()
