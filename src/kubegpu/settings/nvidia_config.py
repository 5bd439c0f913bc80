"""NVIDIA's v1 config file: its schema, parsing, and the post-processing NVIDIA applies.

The file is read as NVIDIA reads it: at most CONFIG_FILE_LIMIT bytes, YAML as go-yaml v2 decodes it
(`goyaml`), typed as Go's encoding/json types it into NVIDIA's structs (`nvidia_decode`), then checked by
this model with NVIDIA's texts. Unknown keys are reported as warnings that say where a misplaced key
belongs; the `resources`, `sharing` and `imex` blocks live in `nvidia_sharing`.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kubegpu.common.files import MIB, FileProblem, read_text_file
from kubegpu.settings.goduration import format_go_duration
from kubegpu.settings.gotext import preview
from kubegpu.settings.nvidia_decode import CONFIG, Decoded, decode_config
from kubegpu.settings.nvidia_sharing import Imex, ReplicatedDevices, Resources, Sharing
from kubegpu.settings.schema import Problem, build, checked, field_paths, nested

if TYPE_CHECKING:
    from kubegpu.settings.goyaml import GoYamlError

# A ConfigMap holds at most 1 MiB (Kubernetes' MaxSecretSize, which ConfigMap validation also applies), and
# the config reaches the plugin through one: anything larger is not the config.
CONFIG_FILE_LIMIT = MIB
# Unknown keys listed one by one in the warnings; the rest are counted (a flood of keys is one line more).
MAX_KEY_WARNINGS = 20


class ConfigError(ValueError):
    """A config that cannot run. The message names the field and the fix; `problems` lists each one."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems) or [message]


def _positive_interval(value: int | None) -> int | None:
    # NVIDIA parses a negative or zero interval and GFD then relabels without pause, rewriting its file
    # as fast as it can; kubegpu refuses it here, so the plugin, GFD and `config check` agree.
    if value is not None and value <= 0:
        raise ValueError(
            f"sleepInterval {format_go_duration(value)} is not positive: GFD would relabel without "
            "pause; use a duration such as 60s, or infinite"
        )
    return value


# Unknown keys never get here: nvidia_decode drops them (as NVIDIA ignores them) and lists them; it has
# also typed every value (deviceListStrategy is a list of strings), so the classes only hold them.
@dataclass
class PluginFlags:
    passDeviceSpecs: bool | None = None
    deviceListStrategy: list[str] | None = None
    deviceIDStrategy: str | None = None
    cdiAnnotationPrefix: str | None = None
    nvidiaCTKPath: str | None = None
    containerDriverRoot: str | None = None
    sharedDevicesAllocationPolicy: str | None = None


@dataclass
class GfdFlags:
    oneshot: bool | None = None
    noTimestamp: bool | None = None
    sleepInterval: int | None = field(
        default=None, metadata=checked(_positive_interval)
    )  # nanoseconds; INFINITE for "infinite"
    outputFile: str | None = None
    machineTypeFile: str | None = None


@dataclass
class Flags:
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
    plugin: PluginFlags | None = field(default=None, metadata=nested(PluginFlags))
    gfd: GfdFlags | None = field(default=None, metadata=nested(GfdFlags))


@dataclass
class Config:
    """NVIDIA's v1 config file."""

    version: str | None = "v1"
    flags: Flags = field(default_factory=Flags, metadata=nested(Flags))
    resources: Resources | None = field(default=None, metadata=nested(Resources))
    sharing: Sharing | None = field(default=None, metadata=nested(Sharing))
    imex: Imex | None = field(default=None, metadata=nested(Imex))


def load_config_file(path: str | Path) -> tuple[Config, list[str]]:
    """Parse a v1 config file; returns the config and warnings (unknown keys). Raises ConfigError."""
    try:
        text = read_text_file(path, limit=CONFIG_FILE_LIMIT, what="config file")
    except FileProblem as err:
        fix = "check --config-file / CONFIG_FILE"
        if "UTF-8" in err.problem:
            fix = f"{err.fix}; {fix}"
        elif "limit" in err.problem:
            fix = f"a config fits in a ConfigMap (1 MiB); {fix} names the config, not another file"
        raise ConfigError(f"unable to read config file {path}: {err.problem}; {fix}") from err
    return parse_config_text(text, str(path))


def parse_config_text(text: str, source: str = "<config>") -> tuple[Config, list[str]]:
    """NVIDIA's parse of the config text (see the module docstring). Raises ConfigError."""
    # Here, not at the top: a daemon without a config file never loads the YAML reader (about 2 MB).
    from kubegpu.settings.goyaml import GoYamlError
    from kubegpu.settings.goyaml import load as load_yaml

    try:
        document = load_yaml(text)
    except GoYamlError as err:
        raise ConfigError(_yaml_problem(err, source)) from err
    decoded = decode_config(document, CONFIG)
    if decoded.problems:
        problems = decoded.problems
        if document.value is not None and not isinstance(document.value, dict):
            got = "a list" if isinstance(document.value, list) else preview(document.value, 40)
            raise ConfigError(
                f"unable to parse config file {source}: error parsing config file: "
                f"{problems[0].split(' (got ')[0]} (expected a mapping with 'version' and 'flags', got {got})"
            )
        raise ConfigError(f"invalid config file {source}: {'; '.join(problems)}", problems)
    raw = decoded.value
    version = raw.get("version")
    if version not in (None, "", "v1"):
        raise ConfigError(
            f"unable to parse config file: error parsing config file: unknown version: {version}"
        )
    raw = {**raw, "version": "v1"}
    failures: list[Problem] = []
    config = build(Config, raw, failures)
    if config is None:
        problems = [_describe(p) for p in failures]
        raise ConfigError(f"invalid config file {source}: {'; '.join(problems)}", problems)
    return config, key_warnings(decoded)


# NVIDIA's wrapping of go-yaml's errors: its config loader, parseConfigFrom, then sigs.k8s.io/yaml.
YAML_ERROR_PREFIX = (
    "unable to parse config file: error parsing config file: unmarshal error: error converting YAML to JSON: "
)


def _yaml_problem(err: GoYamlError, source: str) -> str:
    """NVIDIA's text byte for byte, then where (go-yaml's line is often one off) and what to do."""
    from kubegpu.settings.goyaml import TooManyNodes

    where = f"at line {err.line}, column {err.column} of {source}" if err.line else f"in {source}"
    if isinstance(err, TooManyNodes):
        fix = "a device plugin config has a few hundred; check that this is the config file"
    elif "alias" in str(err) or "anchor" in str(err):
        fix = "write the values out instead of nesting anchors and aliases"
    else:
        fix = "fix the YAML there (indentation, a missing ':' or an unclosed quote or bracket)"
    return f"{YAML_ERROR_PREFIX}{err} ({where}; {fix})"


def _describe(problem: Problem) -> str:
    where = ".".join(str(p) for p in problem.loc)
    return f"{where}: {problem.message} (got {preview(problem.value)})"


def key_warnings(decoded: Decoded) -> list[str]:
    """Warnings for keys NVIDIA reads differently from how they are written, or ignores."""
    out = [
        f"config key {written} is read as {meant} (NVIDIA matches these keys ignoring case); "
        f"write it as {meant.rsplit('.', 1)[-1]}"
        for written, meant in decoded.folded[:MAX_KEY_WARNINGS]
    ]
    unknown = decoded.unknown
    out.extend(
        f"unknown config key {path} is ignored; {_hint(path.rsplit('.', 1)[-1])}"
        for path in unknown[:MAX_KEY_WARNINGS]
    )
    if len(unknown) > MAX_KEY_WARNINGS:
        out.append(f"{len(unknown) - MAX_KEY_WARNINGS} more unknown config keys are ignored (not listed)")
    return out


@functools.cache
def _known_paths() -> dict[str, list[str]]:
    return field_paths(Config)


@functools.lru_cache(maxsize=1024)  # bounded: keys come from files, reload after reload
def _hint(key: str) -> str:
    known = _known_paths()
    if key in known:
        return f"it belongs at {' or '.join(known[key])}"
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]} ({' or '.join(known[close[0]])})?"
    return "check its spelling and where it belongs"


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
