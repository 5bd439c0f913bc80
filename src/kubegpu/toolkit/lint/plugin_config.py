"""The one fact `lint` needs from the device plugin's config file: whether shared resources reject requests
above 1 (`failRequestsGreaterThanOne`).

The file is read by the plugin's own config model, so lint refuses what the plugin refuses, with the same
error text, and takes the plugin's defaults (MPS rejects requests above 1 unless told otherwise) and its
choice of strategy (MPS over time-slicing).
"""

from __future__ import annotations

from pathlib import Path

from kubegpu.settings.nvidia_config import apply_sharing_defaults, load_config_file


def fail_requests_greater_than_one(path: str | Path) -> bool | None:
    """True/False when the config shares GPUs and says (or implies) it; None when it shares nothing.

    Raises ConfigError, with the plugin's text, for a file the plugin would refuse to start with.
    """
    config, _ = load_config_file(path)
    apply_sharing_defaults(config)
    if config.sharing is None:
        return None
    _, block = config.sharing.strategy()
    return None if block is None else bool(block.failRequestsGreaterThanOne)
