"""GFD's flags, env vars and config keys, and their precedence: CLI > env > config file > default.

The flags and env vars are declared in `kubegpu.settings.table` (command "labels"). As with the plugin
(`kubegpu.settings.flags.merge_flags`), a flag given on the command line or through one of its env vars
overwrites the config file; otherwise the file's value stands, and the default fills only what the file
left unset. Env vars follow urfave/cli, which GFD uses: the first of a flag's env vars that is set wins even
when empty, an empty boolean env var means false, and an empty duration env var is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubegpu.labels.sharing import SharingSettings, sharing_from_config
from kubegpu.settings.choices import (
    DEFAULT_GFD_OUTPUT_FILE,
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_SLEEP_INTERVAL,
    MIG_STRATEGIES,
)
from kubegpu.settings.given import CliValue, FlagValue, read_given
from kubegpu.settings.goduration import INFINITE, format_go_duration, parse_sleep_interval
from kubegpu.settings.nvidia_config import (
    Config,
    ConfigError,
    GfdFlags,
    apply_nvidia_restrictions,
    load_config_file,
)
from kubegpu.settings.setting import LABELS
from kubegpu.settings.table import for_command

GFD_SETTINGS = for_command(LABELS)


def given_flags(
    cli: Mapping[str, CliValue], environ: Mapping[str, str] | None = None
) -> dict[str, FlagValue]:
    """Every GFD setting: the command line (`cli`: name -> raw text, None when absent), else its env vars
    (`environ`, the process's when None), else the default (not explicit). Raises SettingError."""
    return read_given(GFD_SETTINGS, cli, environ)


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
    output_file: str = DEFAULT_GFD_OUTPUT_FILE  # "" = stdout
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
    for setting in GFD_SETTINGS:
        flag = given.get(setting.name)
        if flag is not None and flag.explicit:
            values[setting.name] = flag.value
        elif in_file.get(setting.name) is not None:
            values[setting.name] = in_file[setting.name]
        else:
            values[setting.name] = setting.default
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
