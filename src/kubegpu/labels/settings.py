"""GFD's flags, env vars and config keys, and their precedence: CLI > env > config file > default.

As with the plugin (`kubegpu.config.merge_flags`), a flag given on the command line or through one of its
env vars overwrites the config file; otherwise the file's value stands, and the default fills only what
the file left unset. Env vars follow urfave/cli, which GFD uses: the first of a flag's env vars that is set
wins even when empty, an empty boolean env var means false, and an empty duration env var is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubegpu.labels.sharing import SharingSettings, sharing_from_config
from kubegpu.settings.choices import MIG_STRATEGIES
from kubegpu.settings.flags import FlagValue
from kubegpu.settings.goduration import INFINITE, format_go_duration, parse_sleep_interval
from kubegpu.settings.goparse import parse_bool
from kubegpu.settings.nvidia_config import (
    Config,
    ConfigError,
    GfdFlags,
    apply_nvidia_restrictions,
    load_config_file,
)

DEFAULT_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_SLEEP_INTERVAL = 60 * 1_000_000_000

FlagKind = Literal["str", "bool", "duration"]


@dataclass(frozen=True, slots=True)
class GfdFlag:
    name: str  # CLI spelling without dashes
    envvars: tuple[str, ...]
    default: Any
    kind: FlagKind
    help: str
    aliases: tuple[str, ...] = ()  # further CLI spellings, with their dashes


GFD_FLAGS: tuple[GfdFlag, ...] = (
    GfdFlag(
        "mig-strategy",
        ("GFD_MIG_STRATEGY", "MIG_STRATEGY"),
        "none",
        "str",
        "How MIG devices are labelled: none, single or mixed.",
    ),
    GfdFlag(
        "fail-on-init-error",
        ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"),
        True,
        "bool",
        "Exit when NVML cannot start (true), or label without GPU labels (false).",
    ),
    GfdFlag("oneshot", ("GFD_ONESHOT",), False, "bool", "Label once and exit (the file is kept)."),
    GfdFlag("no-timestamp", ("GFD_NO_TIMESTAMP",), False, "bool", "Leave out nvidia.com/gfd.timestamp."),
    GfdFlag(
        "sleep-interval",
        ("GFD_SLEEP_INTERVAL",),
        DEFAULT_SLEEP_INTERVAL,
        "duration",
        "Time between labelling passes: a Go duration (60s, 1m30s) or infinite (label once, keep running).",
    ),
    GfdFlag(
        "output-file",
        ("GFD_OUTPUT_FILE",),
        DEFAULT_OUTPUT_FILE,
        "str",
        'The NFD features.d file to write; "" or - prints the labels on stdout.',
        ("--output", "-o"),
    ),
    GfdFlag(
        "machine-type-file",
        ("GFD_MACHINE_TYPE_FILE",),
        DEFAULT_MACHINE_TYPE_FILE,
        "str",
        "File holding the node's DMI product name (for nvidia.com/gpu.machine).",
    ),
    GfdFlag(
        "use-node-feature-api",
        ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"),
        False,
        "bool",
        "Publish through NFD's NodeFeature API (GFD's default since v0.19); not available in kubegpu yet.",
    ),
    # kubegpu's own (not GFD's), the plugin's opt-in under the same name and env var, so that the labels
    # describe the resources the plugin serves
    GfdFlag(
        "allow-resource-customization",
        ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",),
        False,
        "bool",
        "Honour an explicit `rename` of a shared resource, as the plugin does with this opt-in.",
    ),
    GfdFlag(
        "config-file",
        ("GFD_CONFIG_FILE", "CONFIG_FILE"),
        "",
        "str",
        "An NVIDIA v1 config file (YAML or JSON); its flags.gfd and flags sections fill unset flags.",
    ),
)


def _parse(flag: GfdFlag, text: str, source: str) -> Any:
    try:
        if flag.kind == "bool":
            return parse_bool(text)
        if flag.kind == "duration":
            return parse_sleep_interval(text)
    except ValueError as err:
        kind = "bool" if flag.kind == "bool" else "duration"
        raise ConfigError(
            f"could not parse {text!r} as {kind} value from {source} for flag {flag.name}: {err}"
        ) from err
    return text


def given_flags(cli: Mapping[str, str | None], environ: Mapping[str, str]) -> dict[str, FlagValue]:
    """The flags given on the command line (`cli`: name -> raw text, None when absent) or by env var."""
    out: dict[str, FlagValue] = {}
    for flag in GFD_FLAGS:
        raw = cli.get(flag.name)
        if raw is not None:
            out[flag.name] = FlagValue(_parse(flag, raw, "the command line"), explicit=True)
            continue
        env = next((e for e in flag.envvars if e in environ), None)
        if env is None:
            continue
        text = environ[env]
        if text == "" and flag.kind == "duration":
            continue  # urfave/cli ignores an empty duration env var
        if text == "" and flag.kind == "bool":
            value: Any = False  # urfave/cli: a bool env var set to "" means false
        else:
            value = _parse(flag, text, f"environment variable {env!r}")
        out[flag.name] = FlagValue(value, explicit=True)
    return out


def _config_duration(raw: Any) -> int | None:
    """flags.gfd.sleepInterval as NVIDIA reads it: a number is nanoseconds, a string a Go duration."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ConfigError(
            f"unable to parse config file: error parsing config file: invalid duration: {raw!r}"
        )
    if isinstance(raw, str):
        try:
            return parse_sleep_interval(raw)
        except ValueError as err:
            raise ConfigError(f"unable to parse config file: error parsing config file: {err}") from err
    try:
        return int(raw)  # Go converts the float64 with truncation
    except (ValueError, OverflowError):  # .nan / .inf in YAML
        raise ConfigError(
            f"unable to parse config file: error parsing config file: invalid duration: {raw!r}"
        ) from None


def _from_file(config: Config) -> dict[str, Any]:
    flags = config.flags
    gfd = flags.gfd or GfdFlags()
    return {
        "mig-strategy": flags.migStrategy,
        "fail-on-init-error": flags.failOnInitError,
        "oneshot": gfd.oneshot,
        "no-timestamp": gfd.noTimestamp,
        "sleep-interval": _config_duration(gfd.sleepInterval),
        "output-file": gfd.outputFile,
        "machine-type-file": gfd.machineTypeFile,
        "use-node-feature-api": flags.useNodeFeatureAPI,
    }


@dataclass(frozen=True, slots=True)
class LabelSettings:
    """The merged, validated settings one labelling run uses."""

    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    oneshot: bool = False
    no_timestamp: bool = False
    sleep_interval: int = DEFAULT_SLEEP_INTERVAL  # nanoseconds; INFINITE for "infinite"
    output_file: str = DEFAULT_OUTPUT_FILE  # "" = stdout
    machine_type_file: str = DEFAULT_MACHINE_TYPE_FILE
    config_file: str = ""
    sharing: SharingSettings = field(default_factory=SharingSettings)
    warnings: tuple[str, ...] = ()

    @property
    def infinite(self) -> bool:
        return self.sleep_interval == INFINITE

    @property
    def removes_output_on_exit(self) -> bool:
        """GFD deletes its file when it stops, so no stale labels outlive it; not in oneshot/infinite mode."""
        return not self.oneshot and not self.infinite and self.output_file != ""

    def describe(self) -> str:
        """The settings as GFD logs its merged config ("Running with config:")."""
        return json.dumps(
            {
                "flags": {
                    "migStrategy": self.mig_strategy,
                    "failOnInitError": self.fail_on_init_error,
                    "gfd": {
                        "oneshot": self.oneshot,
                        "noTimestamp": self.no_timestamp,
                        "sleepInterval": format_go_duration(self.sleep_interval),
                        "outputFile": self.output_file,
                        "machineTypeFile": self.machine_type_file,
                    },
                },
                "sharing": {
                    "strategy": self.sharing.strategy,
                    "resources": [
                        {"name": r.name, "replicas": r.replicas, "renamed": r.renamed}
                        for r in self.sharing.resources
                    ],
                },
            },
            indent=2,
        )


def resolve_settings(given: Mapping[str, FlagValue]) -> LabelSettings:
    """Load the config file the flags name (if any), apply the precedence, validate. Raises ConfigError."""
    config_file = str(given["config-file"].value) if "config-file" in given else ""
    config, warnings = load_config_file(config_file) if config_file else (Config(), [])
    in_file = _from_file(config)
    values: dict[str, Any] = {}
    for flag in GFD_FLAGS:
        if flag.name in given:
            values[flag.name] = given[flag.name].value
        elif in_file.get(flag.name) is not None:
            values[flag.name] = in_file[flag.name]
        else:
            values[flag.name] = flag.default
    warnings = warnings + apply_nvidia_restrictions(config, values["allow-resource-customization"])
    problems = []
    if values["mig-strategy"] not in MIG_STRATEGIES:
        problems.append(f"unknown MIG strategy: {values['mig-strategy']} (use none, single or mixed)")
    if values["sleep-interval"] <= 0:
        # GFD would relabel without pause, rewriting the file as fast as it can
        problems.append(
            f"--sleep-interval {format_go_duration(values['sleep-interval'])} is not positive; "
            "use a duration such as 60s, or infinite"
        )
    if values["use-node-feature-api"]:
        problems.append(
            "publishing labels through NFD's NodeFeature API (--use-node-feature-api, USE_NODE_FEATURE_API, "
            "flags.useNodeFeatureAPI) is not available in kubegpu yet; set it to false to write the "
            "features.d file, which NFD's worker reads"
        )
    if problems:
        raise ConfigError("unable to validate flags: " + "; ".join(problems))
    output_file = values["output-file"]
    return LabelSettings(
        mig_strategy=values["mig-strategy"],
        fail_on_init_error=values["fail-on-init-error"],
        oneshot=values["oneshot"],
        no_timestamp=values["no-timestamp"],
        sleep_interval=values["sleep-interval"],
        output_file="" if output_file == "-" else output_file,
        machine_type_file=values["machine-type-file"],
        config_file=config_file,
        sharing=sharing_from_config(config),
        warnings=tuple(warnings),
    )
