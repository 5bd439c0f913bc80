"""The plugin's settings as `kubegpu plugin` starts with them and `kubegpu config check` checks them.

One validation of every flag, env var and config-file value for both, so the two accept and refuse exactly
the same settings with the same text: `config check` once exited 0 with KUBEGPU_XID_ACTIONS=/nonexistent,
which the daemon refused. What needs the node itself (discovery, the IMEX channel devices, the HTTP port
being free) is checked later, by each on its own node.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubegpu.node.health import HealthSettings
from kubegpu.node.xids import XidCatalogError
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings, resolve


def validated_plugin_settings(flags: Mapping[str, FlagValue]) -> tuple[PluginSettings, HealthSettings]:
    """The merged, validated settings and the health settings they name (the XID actions file read).

    Raises ConfigError, each problem one line naming the setting and the fix.
    """
    settings = resolve(flags)
    try:
        health = HealthSettings.from_settings(settings.env)
    except XidCatalogError as err:
        raise ConfigError(str(err)) from err
    return settings, health
