"""NVIDIA's precedence between the plugin's flags (and their env vars) and the config file.

A flag given on the command line or through its env var overwrites the file; otherwise the file's value
stands, and the default fills only what the file left unset. So CLI > env > file > default. The flags
themselves are declared in `kubegpu.settings.table`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import Config
from kubegpu.settings.schema import nested_model
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command

PLUGIN_SETTINGS = for_command(PLUGIN)


def _get(config: Config, path: tuple[str, ...]) -> Any:
    node: Any = config
    for key in path:
        node = getattr(node, key, None)
        if node is None:
            return None
    return node


def _set(config: Config, path: tuple[str, ...], value: Any) -> None:
    node: Any = config
    for key in path[:-1]:
        child = getattr(node, key)
        if child is None:
            child = nested_model(type(node), key)()  # e.g. PluginFlags() for "plugin"
            setattr(node, key, child)
        node = child
    setattr(node, path[-1], value)


def merge_flags(config: Config, flags: Mapping[str, FlagValue]) -> Config:
    """Apply NVIDIA's precedence to a parsed file: explicit flags win; defaults fill only unset keys."""
    merged = copy.deepcopy(config)
    for spec in PLUGIN_SETTINGS:
        given = flags.get(spec.name)
        if not spec.path or given is None:
            continue
        if given.explicit or (not spec.explicit_only and _get(merged, spec.path) is None):
            value = list(given.value) if spec.kind == "list" else given.value
            _set(merged, spec.path, spec.convert(value) if spec.convert else value)
    if not merged.flags.nvidiaDevRoot:
        merged.flags.nvidiaDevRoot = merged.flags.nvidiaDriverRoot
    return merged
