"""NVIDIA's v1 config file, its flags and env vars, and their precedence.

One table (`FLAGS`) names every flag once: its CLI spelling, aliases, env vars, default and the config key it
fills. The CLI builds its options from it and `merge_flags` applies NVIDIA's rule: a flag given on the command
line or through its env var overwrites the file; otherwise the file's value stands, and the default fills only
what the file left unset. So CLI > env > file > default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kubegpu.allocate import DEVICE_ID_STRATEGIES, DEVICE_LIST_STRATEGIES

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
MIG_STRATEGIES = ("none", "single", "mixed")
# Strategies whose Allocate output this build produces; CDI arrives with issue 4.
IMPLEMENTED_DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts")
IMPLEMENTED_MIG_STRATEGIES = ("none",)


class ConfigError(ValueError):
    """A config that cannot run. The message names the field and the fix."""


class _Model(BaseModel):
    # NVIDIA ignores unknown keys; we keep them (extra="allow") so we can warn about each by name.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class PluginFlags(_Model):
    passDeviceSpecs: bool | None = None
    deviceListStrategy: list[str] | None = None
    deviceIDStrategy: str | None = None
    cdiAnnotationPrefix: str | None = None
    nvidiaCTKPath: str | None = None
    containerDriverRoot: str | None = None
    sharedDevicesAllocationPolicy: str | None = None

    @field_validator("deviceListStrategy", mode="before")
    @classmethod
    def _string_or_list(cls, raw: Any) -> Any:
        # NVIDIA accepts "envvar" or ["envvar", "cdi-annotations"]; anything else is its exact error.
        if raw is None:
            return None
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
            return raw
        raise ValueError(f"invalid deviceListStrategy: {raw}")


class GfdFlags(_Model):
    oneshot: bool | None = None
    noTimestamp: bool | None = None
    sleepInterval: Any = None
    outputFile: str | None = None
    machineTypeFile: str | None = None


class Flags(_Model):
    migStrategy: str | None = None
    failOnInitError: bool | None = None
    mpsRoot: str | None = None
    nvidiaDriverRoot: str | None = None
    nvidiaDevRoot: str | None = None
    gdrcopyEnabled: bool | None = None
    gdsEnabled: bool | None = None
    mofedEnabled: bool | None = None
    useNodeFeatureAPI: bool | None = None
    deviceDiscoveryStrategy: str | None = None
    plugin: PluginFlags | None = None
    gfd: GfdFlags | None = None


class Config(_Model):
    """The v1 config file. `resources`, `sharing` and `imex` are read fully by the sharing work (issue 3)."""

    version: str | None = "v1"
    flags: Flags = Flags()
    resources: Any = None
    sharing: Any = None
    imex: Any = None


@dataclass(frozen=True, slots=True)
class FlagSpec:
    name: str  # CLI spelling without dashes
    envvars: tuple[str, ...]
    default: Any
    path: tuple[str, ...]  # config key, e.g. ("flags", "plugin", "deviceIDStrategy"); () = not in the file
    kind: Literal["str", "bool", "list"]
    help: str
    aliases: tuple[str, ...] = ()


FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        "mig-strategy",
        ("MIG_STRATEGY",),
        "none",
        ("flags", "migStrategy"),
        "str",
        "How MIG devices are exposed: none, single or mixed.",
    ),
    FlagSpec(
        "fail-on-init-error",
        ("FAIL_ON_INIT_ERROR",),
        True,
        ("flags", "failOnInitError"),
        "bool",
        "Exit when NVML cannot start (true) or stay up advertising nothing and keep retrying (false).",
    ),
    FlagSpec(
        "driver-root",
        ("NVIDIA_DRIVER_ROOT",),
        "/",
        ("flags", "nvidiaDriverRoot"),
        "str",
        "Root of the NVIDIA driver installation on the host.",
        ("nvidia-driver-root",),
    ),
    FlagSpec(
        "dev-root",
        ("NVIDIA_DEV_ROOT",),
        "",
        ("flags", "nvidiaDevRoot"),
        "str",
        "Root under which the host's /dev/nvidia* nodes live; empty means the driver root.",
        ("nvidia-dev-root",),
    ),
    FlagSpec(
        "pass-device-specs",
        ("PASS_DEVICE_SPECS",),
        False,
        ("flags", "plugin", "passDeviceSpecs"),
        "bool",
        "Also return the /dev/nvidia* device nodes in Allocate (needed with some CPU managers).",
    ),
    FlagSpec(
        "device-list-strategy",
        ("DEVICE_LIST_STRATEGY",),
        ("envvar",),
        ("flags", "plugin", "deviceListStrategy"),
        "list",
        "How the device list reaches the container runtime: envvar, volume-mounts (comma list allowed).",
    ),
    FlagSpec(
        "device-id-strategy",
        ("DEVICE_ID_STRATEGY",),
        "uuid",
        ("flags", "plugin", "deviceIDStrategy"),
        "str",
        "Name devices to the runtime by uuid or by index.",
    ),
    FlagSpec(
        "kubelet-socket",
        ("KUBELET_SOCKET",),
        DEFAULT_KUBELET_SOCKET,
        (),
        "str",
        'The kubelet\'s registration socket; "" serves the devices without registering.',
    ),
    FlagSpec(
        "config-file",
        ("CONFIG_FILE",),
        "",
        (),
        "str",
        "Path to an NVIDIA v1 config file (YAML or JSON).",
    ),
)


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool, which NVIDIA's flags use for env vars."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"invalid boolean {text!r}: use true or false")


def parse_list(text: str | Sequence[str]) -> list[str]:
    items = [text] if isinstance(text, str) else list(text)
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def load_config_file(path: str | Path) -> tuple[Config, list[str]]:
    """Parse a v1 config file; returns the config and warnings (unknown keys). Raises ConfigError."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(
            f"unable to read config file {path}: {err.strerror}; check --config-file / CONFIG_FILE"
        ) from err
    return parse_config_text(text, str(path))


def parse_config_text(text: str, source: str = "<config>") -> tuple[Config, list[str]]:
    try:
        raw = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise ConfigError(f"unable to parse config file {source}: error parsing config file: {err}") from err
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"unable to parse config file {source}: error parsing config file: "
            f"expected a mapping with 'version' and 'flags', got {type(raw).__name__}"
        )
    version = raw.get("version")
    if version not in (None, "", "v1"):
        raise ConfigError(
            f"unable to parse config file: error parsing config file: unknown version: {version}"
        )
    raw = {**raw, "version": "v1"}
    try:
        config = Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"invalid config file {source}: {_describe(err)}") from err
    return config, unknown_keys(config)


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg} (got {json.dumps(e.get('input'), default=str)})")
    return "; ".join(parts)


def unknown_keys(config: BaseModel, prefix: str = "") -> list[str]:
    """Warnings for keys NVIDIA would silently ignore."""
    out = [
        f"unknown config key {prefix}{key!s} is ignored; check its spelling and where it belongs"
        for key in (config.model_extra or {})
    ]
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            out.extend(unknown_keys(value, f"{prefix}{name}."))
    return out


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
            child = type(node).model_fields[key].annotation.__args__[0]()  # e.g. PluginFlags() for "plugin"
            setattr(node, key, child)
        node = child
    setattr(node, path[-1], value)


@dataclass(frozen=True, slots=True)
class FlagValue:
    value: Any
    explicit: bool  # given on the command line or via an env var


def merge_flags(config: Config, flags: Mapping[str, FlagValue]) -> Config:
    """Apply NVIDIA's precedence to a parsed file: explicit flags win; defaults fill only unset keys."""
    merged = config.model_copy(deep=True)
    for spec in FLAGS:
        given = flags.get(spec.name)
        if not spec.path or given is None:
            continue
        if given.explicit or _get(merged, spec.path) is None:
            _set(merged, spec.path, list(given.value) if spec.kind == "list" else given.value)
    if not merged.flags.nvidiaDevRoot:
        merged.flags.nvidiaDevRoot = merged.flags.nvidiaDriverRoot
    return merged


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The merged, validated settings the daemon runs with."""

    config: Config
    kubelet_socket: str
    config_file: str
    warnings: tuple[str, ...] = ()

    @property
    def flags(self) -> Flags:
        return self.config.flags

    @property
    def plugin(self) -> PluginFlags:
        return self.config.flags.plugin or PluginFlags()

    @property
    def device_list_strategies(self) -> tuple[str, ...]:
        return tuple(self.plugin.deviceListStrategy or ("envvar",))

    def log_json(self) -> str:
        return self.config.model_dump_json(indent=2, exclude_none=True)


def validate(settings: PluginSettings) -> None:
    """NVIDIA's startup validation, with its texts (prefixed 'unable to validate flags:')."""
    flags, plugin = settings.flags, settings.plugin
    problems: list[str] = []
    for strategy in settings.device_list_strategies:
        if strategy not in DEVICE_LIST_STRATEGIES:
            problems.append(f"invalid --device-list-strategy option: invalid strategy: {strategy}")
        elif strategy not in IMPLEMENTED_DEVICE_LIST_STRATEGIES:
            problems.append(
                f"--device-list-strategy {strategy} is not available in this kubegpu version yet; "
                f"use one of {', '.join(IMPLEMENTED_DEVICE_LIST_STRATEGIES)}"
            )
    if (plugin.deviceIDStrategy or "uuid") not in DEVICE_ID_STRATEGIES:
        problems.append(f"invalid --device-id-strategy option: {plugin.deviceIDStrategy}")
    mig = flags.migStrategy or "none"
    if mig not in MIG_STRATEGIES:
        problems.append(f"unknown MIG strategy: {mig}")
    elif mig not in IMPLEMENTED_MIG_STRATEGIES:
        problems.append(f"--mig-strategy {mig} is not available in this kubegpu version yet; use none")
    if problems:
        raise ConfigError("unable to validate flags: " + "; ".join(problems))


def resolve(flags: Mapping[str, FlagValue]) -> PluginSettings:
    """Load the config file named by the flags (if any), merge the flags, validate. Raises ConfigError."""
    config_file = str(flags["config-file"].value) if "config-file" in flags else ""
    config, warnings = load_config_file(config_file) if config_file else (Config(), [])
    merged = merge_flags(config, flags)
    kubelet = flags.get("kubelet-socket")
    settings = PluginSettings(
        config=merged,
        kubelet_socket=DEFAULT_KUBELET_SOCKET if kubelet is None else str(kubelet.value),
        config_file=config_file,
        warnings=tuple(warnings),
    )
    validate(settings)
    return settings
