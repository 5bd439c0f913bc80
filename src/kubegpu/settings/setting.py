"""What one setting is: a flag and/or env vars, its type, default, validation and documentation.

Every flag and env var of every kubegpu command is one `Setting` in `kubegpu.settings.table.SETTINGS`. The
CLI builds its options from them, `kubegpu.settings.given` reads and validates their values (command line
and environment) once at start, the daemon's start-up log and `kubegpu config check` print them, and the
README's settings tables are checked against them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# str: any text. path: a non-empty path. bool: Go's strconv.ParseBool. list: comma list (repeatable: also
# whitespace-separated and repeated flags). int / float / seconds: a finite number within the bounds.
# duration: a Go duration or "infinite" (GFD). xids: NVIDIA's comma list of XIDs or "all" (malformed
# entries are logged and skipped, as NVIDIA does). gpus: which GPUs go to DRA (`settings.dra_selection`).
Kind = Literal["str", "path", "bool", "list", "int", "float", "seconds", "duration", "xids", "gpus"]
# Whose name and meaning the setting has: NVIDIA's (same spelling, default and errors as NVIDIA's binaries)
# or kubegpu's own (KUBEGPU_*).
Owner = Literal["nvidia", "kubegpu"]
# How an env var set to "" counts. "unset": as if it were not there (the next env var, else the default).
# "urfave": GFD's urfave/cli rule: the first env var present wins even when empty; "" is false for a
# boolean, is ignored for a duration and is the value itself for text. "value": "" is the value itself
# (a text setting whose help says "" turns something off).
EmptyEnv = Literal["unset", "urfave", "value"]

# The commands that take settings, as a user types them after `kubegpu`.
PLUGIN = "plugin"
CONFIG_CHECK = "config check"
MPS_DAEMON = "mps-daemon run"
MPS_MOUNT_SHM = "mps-daemon mount-shm"
LABELS = "labels"
CONFIG_MANAGER = "config-manager"
FAKE_NVML_INJECT = "fake-nvml inject"
DOCTOR = "doctor"
DRA = "dra"
COMMANDS = (
    PLUGIN, CONFIG_CHECK, MPS_DAEMON, MPS_MOUNT_SHM, LABELS, CONFIG_MANAGER, FAKE_NVML_INJECT, DOCTOR, DRA
)  # fmt: skip

ONE_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Setting:
    name: str  # the flag's spelling without dashes; for an env-only setting, a name for logs and JSON
    envvars: tuple[str, ...]  # in order: the first one set wins
    default: Any  # the typed value (None: unset)
    kind: Kind
    help: str
    owner: Owner
    commands: tuple[str, ...]
    flag: bool = True  # False: an env var only, no command-line flag
    aliases: tuple[str, ...] = ()  # further flag spellings, with their dashes ("--nvidia-driver-root", "-o")
    path: tuple[str, ...] = ()  # the NVIDIA config file key it fills, e.g. ("flags", "migStrategy")
    # The accepted values. NVIDIA's choices are checked after the config file is merged (a file's value can
    # be wrong too), with NVIDIA's texts (`kubegpu.settings.plugin.validate`); kubegpu's when parsed.
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # int / seconds: the smallest value allowed
    maximum: float | None = None  # int / seconds: the largest value allowed
    positive: bool = False  # seconds: 0 is refused too (a retry or probe interval of 0 would busy-loop)
    repeatable: bool = False  # list: the flag may be repeated; an env value splits on whitespace too
    empty_env: EmptyEnv = "unset"
    # NVIDIA's imex.* keys: the flag overwrites the file only when given, never with its default.
    explicit_only: bool = False
    # Turns the parsed value into the config value (e.g. strings into channel IDs); raises ConfigError.
    convert: Callable[[Any], Any] | None = None
    hidden: bool = False  # not in --help (test hooks)

    @property
    def option(self) -> str:
        """`--name`, or "" for an env-only setting."""
        return f"--{self.name}" if self.flag else ""

    @property
    def key(self) -> str:
        """The keyword click passes the flag's value under."""
        return self.name.replace("-", "_")

    @property
    def label(self) -> str:
        """How logs and reports name it: the env var operators set in a DaemonSet, else the flag."""
        return self.envvars[0] if self.envvars else self.option
