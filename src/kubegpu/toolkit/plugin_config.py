"""The one fact `lint` needs from the device plugin's config file (NVIDIA's v1 schema): whether shared
resources reject requests above 1 (`failRequestsGreaterThanOne`, which defaults to true under MPS)."""

from __future__ import annotations

from pathlib import Path

import yaml


class PluginConfigError(ValueError):
    """The config file cannot be read; the message names the file and the problem."""


def fail_requests_greater_than_one(path: str | Path) -> bool | None:
    """True/False when the config shares GPUs and says (or implies) it; None when it shares nothing."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise PluginConfigError(f"cannot read plugin config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise PluginConfigError(f"plugin config {path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PluginConfigError(f"plugin config {path} must be a mapping with version: v1")
    sharing = data.get("sharing") or {}
    if not isinstance(sharing, dict):
        raise PluginConfigError(f"plugin config {path}: `sharing` must be a mapping (timeSlicing or mps)")
    mps, slicing = sharing.get("mps"), sharing.get("timeSlicing")
    # MPS wins when both are present, as in the plugin; MPS defaults the flag to true (v0.20).
    for block, default in ((mps, True), (slicing, False)):
        if isinstance(block, dict) and block.get("resources"):
            value = block.get("failRequestsGreaterThanOne")
            return default if value is None else bool(value)
    return None
