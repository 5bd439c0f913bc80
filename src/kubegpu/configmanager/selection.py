"""Which config file a node gets: NVIDIA's selection rules, fallbacks and error texts (v0.20).

Pure except for reading the directory listing (`available_configs`) and logging what was tried, which
NVIDIA's config-manager logs with the same words.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path

from kubegpu.configmanager.errors import ConfigManagerError, go_os_error

log = logging.getLogger("kubegpu.configmanager")

FALLBACK_NAMED = "named"
FALLBACK_SINGLE = "single"
FALLBACK_EMPTY = "empty"
FALLBACK_STRATEGIES = (FALLBACK_NAMED, FALLBACK_SINGLE, FALLBACK_EMPTY)

# The file the `named` fallback looks for.
NAMED_FALLBACK_CONFIG = "default"

# The selection result that means "no file": the destination then points at /dev/null, which the plugin
# reads as an empty config, i.e. all defaults.
EMPTY_CONFIG = ""


def available_configs(srcdir: str | Path) -> list[str]:
    """The selectable file names in `srcdir`, sorted.

    A ConfigMap mounted as a volume holds bookkeeping entries (`..data`, `..2024_05_01_...`) next to the
    keys; those start with `..` and are never configs. Directories are skipped too (NVIDIA skips real
    directories; we also skip symlinks to directories, which could never be read as a config file).
    """
    try:
        with os.scandir(srcdir) as entries:
            names = [e.name for e in entries if not e.name.startswith("..") and not _is_dir(e)]
    except OSError as err:
        reason = go_os_error("open", err)
        raise ConfigManagerError(
            f"error getting list of configuration files: error reading directory: {reason}"
        ) from err
    return sorted(names)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # vanished between listing and stat: not a directory we need to skip
        return False


def select_config(
    label: str,
    available: Collection[str],
    default_config: str = "",
    fallbacks: Sequence[str] = (),
) -> str:
    """The config name the label value selects, or `EMPTY_CONFIG`; raises ConfigManagerError.

    Order, as NVIDIA: a non-empty label must name an existing file (no fallback: a typo in a label must
    not silently give the node another config); no label → `default_config`, which must exist; no
    default → each fallback in the given order.
    """
    if not available:
        raise ConfigManagerError("no configuration files available")

    if label:
        if label not in available:
            raise ConfigManagerError(f"specified config {label} does not exist")
        return label

    if default_config:
        log.info("No value set. Selecting default name: %s", default_config)
        if default_config not in available:
            # NVIDIA before v0.20.1 printed the (empty) label here, `specified config  does not exist`;
            # v0.20.1 names the default, as we do.
            raise ConfigManagerError(f"specified config {default_config} does not exist")
        return default_config

    log.info("No value set and no default set. Attempting fallback strategies: %s", go_list(fallbacks))
    for fallback in fallbacks:
        if fallback == FALLBACK_NAMED:
            log.info("Attempting to find config named: %s", NAMED_FALLBACK_CONFIG)
            if NAMED_FALLBACK_CONFIG in available:
                return NAMED_FALLBACK_CONFIG
            log.info("No configuration named '%s' was found", NAMED_FALLBACK_CONFIG)
        elif fallback == FALLBACK_SINGLE:
            log.info("Attempting to see if only a single config is available...")
            if len(available) == 1:
                return next(iter(available))
            log.info("More than one configuration was found: %s", go_list(sorted(available)))
        elif fallback == FALLBACK_EMPTY:
            log.info("Falling back to an empty configuration")
            return EMPTY_CONFIG
        else:
            # Reported only when reached, as NVIDIA does: `named,typo` works while `default` exists.
            raise ConfigManagerError(f"unknown fallback strategy: {fallback}")

    raise ConfigManagerError("no config was set, no default was provided, and all fallbacks failed")


def unknown_fallbacks(fallbacks: Sequence[str]) -> list[str]:
    """The strategies that are none of NVIDIA's, for a warning at start-up (before one is ever reached)."""
    return [f for f in fallbacks if f not in FALLBACK_STRATEGIES]


def go_list(items: Sequence[str]) -> str:
    """A string slice as Go's %v prints it: `[named single]`."""
    return "[" + " ".join(items) + "]"
