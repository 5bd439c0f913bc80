"""The plugin's settings as `kubegpu plugin` starts with them and `kubegpu config check` checks them.

One validation of every flag, env var and config-file value for both, so the two accept and refuse exactly
the same settings with the same text: `config check` once exited 0 with KUBEGPU_XID_ACTIONS=/nonexistent,
which the daemon refused. What needs the node itself (discovery, the IMEX channel devices, the HTTP port
being free) is checked later, by each on its own node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kubegpu.common.unix_socket import socket_path_problem
from kubegpu.node.health import HealthSettings
from kubegpu.node.xids import XidCatalogError
from kubegpu.settings.choices import DEFAULT_KUBELET_SOCKET
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import PluginSettings, resolve

# The shortest socket the plugin serves beside kubelet.sock (NVIDIA's name for nvidia.com/gpu): a directory
# with no room for it can serve no resource.
_SHORTEST_PLUGIN_SOCKET = "nvidia-gpu.sock"


def validated_plugin_settings(flags: Mapping[str, FlagValue]) -> tuple[PluginSettings, HealthSettings]:
    """The merged, validated settings and the health settings they name (the XID actions file read).

    Raises ConfigError, each problem one line naming the setting and the fix.
    """
    settings = resolve(flags)
    socket_problems = _socket_problems(settings)
    if socket_problems:
        raise ConfigError("; ".join(socket_problems), socket_problems)
    try:
        health = HealthSettings.from_settings(settings.env)
    except XidCatalogError as err:
        raise ConfigError(str(err)) from err
    return settings, health


def _socket_problems(settings: PluginSettings) -> list[str]:
    """The unix sockets the settings name or build that the kernel cannot bind or dial (over 107 bytes):
    gRPC failed on every attempt and the plugin retried forever. One problem per setting."""
    kubelet_flag = "--kubelet-socket (KUBELET_SOCKET)"
    kubelet = settings.kubelet_socket
    plugin_socket = os.path.join(os.path.dirname(kubelet or DEFAULT_KUBELET_SOCKET), _SHORTEST_PLUGIN_SOCKET)
    problems = [
        (kubelet and socket_path_problem(kubelet_flag, kubelet, kubelet))
        or socket_path_problem(kubelet_flag, kubelet, plugin_socket, "the plugin's socket beside it")
    ]
    if pod_resources := settings.pod_resources_socket:
        flag = "--pod-resources-socket (KUBEGPU_POD_RESOURCES_SOCKET)"
        problems.append(socket_path_problem(flag, pod_resources, pod_resources))
    return [p for p in problems if p]
