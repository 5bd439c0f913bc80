"""NVIDIA's v1 config file: its schema, parsing, and the post-processing NVIDIA applies.

Unknown keys are kept and reported as warnings that say where a misplaced key belongs; the `resources`,
`sharing` and `imex` blocks live in `nvidia_sharing`.
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kubegpu.settings.nvidia_sharing import Imex, ReplicatedDevices, Resources, Sharing

# libyaml's loader when the wheel has it: ~10x faster than the pure-Python one, same results.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(ValueError):
    """A config that cannot run. The message names the field and the fix; `problems` lists each one."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems) or [message]


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
    """NVIDIA's v1 config file."""

    version: str | None = "v1"
    flags: Flags = Flags()
    resources: Resources | None = None
    sharing: Sharing | None = None
    imex: Imex | None = None


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
        raw = yaml.load(text, Loader=_YAML_LOADER) if text.strip() else {}
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
        problems = _describe(err)
        raise ConfigError(f"invalid config file {source}: {'; '.join(problems)}", problems) from err
    return config, unknown_keys(config)


def _describe(err: ValidationError) -> list[str]:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg} (got {json.dumps(e.get('input'), default=str)})")
    return parts


def _schema_paths(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every key the schema knows, by name, with the dotted paths where it belongs."""
    out: dict[str, list[str]] = {}
    for name, info in model.model_fields.items():
        out.setdefault(name, []).append(prefix + name)
        for arg in typing.get_args(info.annotation) or (info.annotation,):
            inner = typing.get_args(arg)[0] if typing.get_origin(arg) is list else arg
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                sub = prefix + name + ("[]." if typing.get_origin(arg) is list else ".")
                for key, paths in _schema_paths(inner, sub).items():
                    out.setdefault(key, []).extend(paths)
    return out


def _hint(key: str) -> str:
    known = _schema_paths(Config)
    if key in known:
        return f"it belongs at {' or '.join(known[key])}"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]} ({' or '.join(known[close[0]])})?"
    return "check its spelling and where it belongs"


def unknown_keys(config: BaseModel, prefix: str = "") -> list[str]:
    """Warnings for keys NVIDIA would silently ignore, each saying where the key probably belongs."""
    out = [
        f"unknown config key {prefix}{key!s} is ignored; {_hint(str(key))}"
        for key in (config.model_extra or {})
    ]
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            out.extend(unknown_keys(value, f"{prefix}{name}."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out.extend(unknown_keys(item, f"{prefix}{name}[{i}]."))
    return out


def apply_nvidia_restrictions(config: Config, allow_customization: bool) -> list[str]:
    """NVIDIA's post-processing: fields its plugin parses but ignores, with its warnings.

    With `allow_customization` (kubegpu's opt-in) they are honoured instead and nothing is dropped.
    """
    if allow_customization:
        return []
    warnings: list[str] = []
    if config.resources is not None and (config.resources.gpus or config.resources.mig):
        warnings.append("Customizing the 'resources' field is not yet supported in the config. Ignoring...")
        config.resources = None
    sharing = config.sharing
    blocks = (("timeSlicing", sharing.timeSlicing), ("mps", sharing.mps)) if sharing is not None else ()
    for key, block in blocks:
        if block is None:
            continue
        where = f"sharing.{key}.resources"
        for r in block.resources or ():
            if r.rename and not block.renameByDefault:
                warnings.append(
                    f"Customizing the 'rename' field in '{where}' is not yet supported in the config. "
                    "Ignoring... (kubegpu honours it with --allow-resource-customization)"
                )
                r.rename = None
            if not r.devices.all:
                warnings.append(
                    f"Customizing the 'devices' field in '{where}' is not yet supported in the config. "
                    "Ignoring... (kubegpu honours it with --allow-resource-customization)"
                )
                r.devices = ReplicatedDevices(all=True)
    return warnings


def apply_sharing_defaults(config: Config) -> None:
    """MPS rejects requests for more than one replica unless told otherwise [NVIDIA v0.20]."""
    mps = config.sharing.mps if config.sharing is not None else None
    if mps is not None and mps.failRequestsGreaterThanOne is None:
        mps.failRequestsGreaterThanOne = True
