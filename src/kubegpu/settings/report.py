"""The effective settings and where each came from, as the start-up log and `kubegpu config check` show them.

Settings that fill a config file key are left out: their merged values are in the config dump ("Running
with config:"). What is left is what no config file shows: kubegpu's own settings, NVIDIA's env-only health
variables, the kubelet socket and the config file's path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubegpu.settings.given import FlagValue, Source, default_value
from kubegpu.settings.setting import Setting
from kubegpu.settings.values import text_of


@dataclass(frozen=True, slots=True)
class Effective:
    setting: Setting
    given: FlagValue

    @property
    def text(self) -> str:
        return text_of(self.setting, self.given.value)

    @property
    def source(self) -> Source:
        return self.given.source

    @property
    def via(self) -> str:
        """The flag or env var it came through, when the label does not say it already ("" otherwise)."""
        origin = self.given.origin
        return origin if self.source != "default" and origin != self.setting.label else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.setting.name,
            "flag": self.setting.option or None,
            "env": list(self.setting.envvars),
            "value": self.text,
            "source": self.source,
            "origin": self.given.origin or None,
            "owner": self.setting.owner,
        }


def effective(settings: Sequence[Setting], given: Mapping[str, FlagValue]) -> tuple[Effective, ...]:
    """The settings outside the config file, each with its value and source (a default when not given)."""
    return tuple(
        Effective(s, given.get(s.name) or default_value(s)) for s in settings if not s.path and not s.hidden
    )


def _shown(text: str) -> str:
    return json.dumps(text) if text == "" or any(c.isspace() for c in text) else text


def render_block(entries: Sequence[Effective]) -> str:
    """One line per setting, its source first: `  flag     KUBEGPU_HTTP_PORT=8080 (--http-port)`."""
    lines = []
    for entry in entries:
        via = f" ({entry.via})" if entry.via else ""
        lines.append(f"  {entry.source:<7}  {entry.setting.label}={_shown(entry.text)}{via}")
    return "\n".join(lines)
