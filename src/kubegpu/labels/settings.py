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
    AUTO_DISCOVERY,
    DEFAULT_CONTAINER_DRIVER_ROOT,
    DEFAULT_GFD_NAMESPACE,
    DEFAULT_GFD_OUTPUT_FILE,
    DEFAULT_KUBE_API_BURST,
    DEFAULT_KUBE_API_QPS,
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_SLEEP_INTERVAL,
    GFD_DEVICE_DISCOVERY_STRATEGIES,
    MIG_STRATEGIES,
    discovery_strategy_note,
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
        "device-discovery-strategy": flags.deviceDiscoveryStrategy,
        "driver-root-ctr-path": flags.plugin.containerDriverRoot if flags.plugin else None,
    }


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """Where and how the NodeFeature object is written: GFD's node and Kubernetes client flags."""

    node_name: str = ""
    namespace: str = DEFAULT_GFD_NAMESPACE
    pod_name: str = ""  # "": no owner references
    kubeconfig: str = ""  # "": the in-cluster config
    qps: float = DEFAULT_KUBE_API_QPS
    burst: int = DEFAULT_KUBE_API_BURST


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
    use_node_feature_api: bool = True  # GFD's default since v0.19
    device_discovery_strategy: str = AUTO_DISCOVERY
    driver_root_ctr_path: str = DEFAULT_CONTAINER_DRIVER_ROOT
    api: ApiSettings = field(default_factory=ApiSettings)
    sharing: SharingSettings = field(default_factory=SharingSettings)
    warnings: tuple[str, ...] = ()

    @property
    def infinite(self) -> bool:
        return self.sleep_interval == INFINITE

    @property
    def removes_output_on_exit(self) -> bool:
        """GFD deletes its file when it stops, so no stale labels outlive it; not in oneshot/infinite mode,
        and there is no file with the NodeFeature API (the object stays: its owner references and NFD's
        garbage collector remove it with the DaemonSet or the node)."""
        return (
            not self.use_node_feature_api
            and not self.oneshot
            and not self.infinite
            and self.output_file != ""
        )

    def describe(self) -> str:
        """The settings as GFD logs its merged config ("Running with config:")."""
        return json.dumps(
            {
                "flags": {
                    "migStrategy": self.mig_strategy,
                    "failOnInitError": self.fail_on_init_error,
                    "useNodeFeatureAPI": self.use_node_feature_api,
                    "deviceDiscoveryStrategy": self.device_discovery_strategy,
                    "plugin": {"containerDriverRoot": self.driver_root_ctr_path},
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
    strategy = values["device-discovery-strategy"]
    if strategy not in GFD_DEVICE_DISCOVERY_STRATEGIES:
        problems.append(f"invalid --device-discovery-strategy option {strategy}")  # NVIDIA's text
    elif note := discovery_strategy_note(strategy):
        warnings.append(note)
    if values["mig-strategy"] not in MIG_STRATEGIES:
        problems.append(f"unknown MIG strategy: {values['mig-strategy']} (use none, single or mixed)")
    if values["sleep-interval"] <= 0:
        # GFD would relabel without pause, rewriting the file as fast as it can
        problems.append(
            f"--sleep-interval {format_go_duration(values['sleep-interval'])} is not positive; "
            "use a duration such as 60s, or infinite"
        )
    if problems:
        raise ConfigError("unable to validate flags: " + "; ".join(problems))
    output_file = values["output-file"]
    explicit_output = given.get("output-file")
    if values["use-node-feature-api"] and (
        (explicit_output is not None and explicit_output.explicit) or in_file["output-file"] is not None
    ):
        warnings.append(
            f"the labels go to this node's NodeFeature object (--use-node-feature-api, GFD's default), so "
            f"the output file {output_file or '(stdout)'} is not written; set --use-node-feature-api=false "
            "(USE_NODE_FEATURE_API=false) to write it"
        )
    return LabelSettings(
        mig_strategy=values["mig-strategy"],
        fail_on_init_error=values["fail-on-init-error"],
        oneshot=values["oneshot"],
        no_timestamp=values["no-timestamp"],
        sleep_interval=values["sleep-interval"],
        output_file="" if output_file == "-" else output_file,
        machine_type_file=values["machine-type-file"],
        config_file=config_file,
        use_node_feature_api=values["use-node-feature-api"],
        device_discovery_strategy=strategy,
        driver_root_ctr_path=values["driver-root-ctr-path"],
        api=ApiSettings(
            node_name=values["node-name"],
            namespace=values["namespace"],
            pod_name=values["pod-name"],
            kubeconfig=values["kubeconfig"],
            qps=float(values["kube-api-qps"]),
            burst=int(values["kube-api-burst"]),
        ),
        sharing=sharing_from_config(config),
        warnings=tuple(warnings),
    )
