"""What a config reload changed, as one log line (NVIDIA logs the whole merged config on every start; a
reload logs only the difference, so a SIGHUP every minute does not flood the log)."""

from __future__ import annotations

import json
from typing import Any

MAX_CHANGES = 8  # more than this are counted, not listed: the line stays one readable line


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}.{index}"))
        return out
    return {prefix: value}


def config_changes(before: str, after: str) -> str:
    """The changed fields of two merged configs (the JSON of `log_json`), e.g.
    `flags.migStrategy "none" -> "mixed", sharing.timeSlicing.resources.0.replicas 2 -> 4`."""
    old, new = _flatten(json.loads(before)), _flatten(json.loads(after))
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if old.get(path, _MISSING) != new.get(path, _MISSING):
            changes.append(f"{path} {_text(old.get(path, _MISSING))} -> {_text(new.get(path, _MISSING))}")
    if not changes:
        return "config unchanged"
    shown = ", ".join(changes[:MAX_CHANGES])
    more = f" and {len(changes) - MAX_CHANGES} more" if len(changes) > MAX_CHANGES else ""
    return f"config changed: {shown}{more}"


class _Missing:
    pass


_MISSING = _Missing()


def _text(value: Any) -> str:
    return "(unset)" if value is _MISSING else json.dumps(value)
