"""`kubegpu plugin`: the device plugin daemon's command."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import given_values, setting_options
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings, resolve
from kubegpu.settings.setting import PLUGIN

log = logging.getLogger("kubegpu")


@click.command("plugin")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@setting_options(PLUGIN)
def plugin_cmd(verbose: bool, **params: Any) -> None:
    """Run the device plugin daemon on this node.

    Flags, env vars and the config file are NVIDIA's (k8s-device-plugin v0.20): a flag on the command line
    beats its env var, which beats the config file, which beats the default.
    """
    setup_logging(verbose)
    from kubegpu.node.plugin_settings import validated_plugin_settings  # (here too)
    from kubegpu.plugin.filewatch import file_identity  # here, not at import: `--help` stays light

    try:
        flags = given_values(params, PLUGIN)  # every flag and env var, validated once, here
        # Taken before the read: a change made while the daemon starts is reloaded once the watch is armed.
        config_file = str(flags["config-file"].value) if "config-file" in flags else ""
        config_identity = file_identity(Path(config_file)) if config_file else None
        settings, health = validated_plugin_settings(flags)  # as `config check` validates them
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)

    from kubegpu.plugin.daemon import Daemon, StartupError

    def reload_settings() -> PluginSettings:
        return resolve(flags)

    try:
        daemon = Daemon(
            settings, reload_settings=reload_settings, config_identity=config_identity, health_settings=health
        )
        code = asyncio.run(daemon.run())
    except StartupError as err:
        log.error("%s", err)
        sys.exit(1)
    except OSError as err:  # the HTTP endpoint (or the plugin directory) cannot be set up
        log.error("%s", start_failure(err, settings))
        sys.exit(1)
    sys.exit(code)


def start_failure(err: OSError, settings: PluginSettings) -> str:
    """One line for an OSError at start, naming the setting to change where one is to blame."""
    where = f"{settings.http_address or '*'}:{settings.http_port}"
    if isinstance(err, socket.gaierror):
        return (
            f"cannot serve the HTTP endpoint on {where}: the address {settings.http_address!r} does not "
            f"resolve ({err.strerror}); set --http-address (KUBEGPU_HTTP_ADDRESS) to an IP address of "
            "this node"
        )
    if err.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) and settings.http_port:
        return (
            f"cannot serve the HTTP endpoint on {where}: {err.strerror}; choose another --http-port "
            "(KUBEGPU_HTTP_PORT) or --http-address, or stop what holds it"
        )
    return f"cannot start: {err.strerror or err} ({err.filename or 'no file'})"
