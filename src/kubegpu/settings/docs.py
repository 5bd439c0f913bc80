"""The README's settings tables, written from the settings table (`python -m kubegpu.settings.docs`).

tests/settings/test_readme_tables.py fails when the README's tables and these disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubegpu.settings.feature_gates import GATES, Gate
from kubegpu.settings.setting import DRA, PLUGIN, Setting
from kubegpu.settings.table import SETTINGS
from kubegpu.settings.values import default_text

KUBEGPU_HEADER = ("flag", "env var", "default", "commands", "what")
NVIDIA_HEADER = ("flag (aliases)", "env var(s)", "default", "config key")
NVIDIA_DRA_HEADER = ("NVIDIA DRA driver flag", "env var", "default", "what")
GATES_HEADER = ("feature gate", "NVIDIA default", "stage", "in kubegpu")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _codes(items: Sequence[str]) -> str:
    return ", ".join(_code(i) for i in items)


def kubegpu_rows() -> list[tuple[str, ...]]:
    """Every kubegpu setting of every command."""
    return [
        (
            _code(s.option),
            _codes(s.envvars),
            _code(default_text(s)),
            ", ".join(s.commands),
            s.help,
        )
        for s in SETTINGS
        if s.owner == "kubegpu"
    ]


def nvidia_plugin_rows() -> list[tuple[str, ...]]:
    """NVIDIA's flags and env vars of the plugin."""

    return [
        (_flag(s), _codes(s.envvars), _code(default_text(s)), _code(".".join(s.path)))
        for s in SETTINGS
        if s.owner == "nvidia" and PLUGIN in s.commands
    ]


def nvidia_dra_rows() -> list[tuple[str, ...]]:
    """NVIDIA's DRA driver (gpu-kubelet-plugin) flags that `kubegpu dra` takes under the same names."""
    return [
        (_flag(s), _codes(s.envvars), _code(default_text(s)), s.help)
        for s in SETTINGS
        if s.owner == "nvidia" and DRA in s.commands and s.flag
    ]


def gate_rows() -> list[tuple[str, ...]]:
    """NVIDIA's DRA driver feature gates and what each does in `kubegpu dra`."""

    def status(gate: Gate) -> str:
        if not gate.implemented:
            return f"refused at start when on (not implemented yet): {gate.what}"
        return gate.what

    return [
        (_code(g.name), _code(str(g.default).lower()), g.stage, status(g))
        for g in GATES
        if g.scope != "logging"
    ]


def _flag(s: Setting) -> str:
    aliases = f" ({_codes(s.aliases)})" if s.aliases else ""
    return _code(s.option) + aliases


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print("NVIDIA's flags and env vars of the plugin:\n")
    print(markdown(NVIDIA_HEADER, nvidia_plugin_rows()))
    print("\nNVIDIA's DRA driver flags of `kubegpu dra`:\n")
    print(markdown(NVIDIA_DRA_HEADER, nvidia_dra_rows()))
    print("\nNVIDIA's DRA driver feature gates:\n")
    print(markdown(GATES_HEADER, gate_rows()))
    print("\nkubegpu's own settings:\n")
    print(markdown(KUBEGPU_HEADER, kubegpu_rows()))
