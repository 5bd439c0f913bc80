"""The settings the daemon runs with: the config file merged with the flags, validated as NVIDIA does."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.common.quoting import VALUE_LIMIT, quote_id
from kubegpu.settings.choices import (
    AUTO_DISCOVERY,
    DEVICE_DISCOVERY_STRATEGIES,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    DISTRIBUTED,
    MIG_STRATEGIES,
    SHARED_ALLOCATION_POLICIES,
    cdi_flag_notes,
    discovery_strategy_note,
)
from kubegpu.settings.dra_selection import NO_GPUS, GpuSelection
from kubegpu.settings.env import DaemonEnv
from kubegpu.settings.flags import PLUGIN_SETTINGS, merge_flags
from kubegpu.settings.given import FlagValue, value_of
from kubegpu.settings.nvidia_config import (
    Config,
    ConfigError,
    Flags,
    PluginFlags,
    apply_nvidia_restrictions,
    apply_sharing_defaults,
    load_config_file,
)
from kubegpu.settings.nvidia_sharing import SharingStrategy
from kubegpu.settings.report import Effective, effective, render_block
from kubegpu.settings.schema import dump
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import lookup

# NVIDIA's text for MPS sharing without an MPS root (`config check` adds where the chart sets it).
MPS_ROOT_MISSING = "using MPS requires --mps-root to be specified"


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The merged, validated settings the daemon runs with."""

    config: Config
    kubelet_socket: str
    config_file: str
    warnings: tuple[str, ...] = ()
    allow_customization: bool = False
    mps_client_limits: bool = True
    http_port: int = 0
    http_address: str = ""
    pod_resources_socket: str = ""
    health_grace_s: float = 60.0
    metrics_interval_s: float = 10.0  # 0: no GPU telemetry
    idle_threshold_percent: int = 5
    proc_root: Path = Path("/proc")
    node_name: str = ""
    dra_gpus: GpuSelection = NO_GPUS  # left to `kubegpu dra`: never served by the plugin
    # NVIDIA's --cdi-disable-hooks and --cdi-feature-flags (no config key, as in NVIDIA's).
    cdi_disable_hooks: tuple[str, ...] = ()
    cdi_feature_flags: tuple[str, ...] = ()
    env: DaemonEnv = field(default_factory=DaemonEnv.default)
    # Every setting outside the config file with its value and source, for the start-up log.
    effective: tuple[Effective, ...] = ()

    @property
    def flags(self) -> Flags:
        return self.config.flags

    @property
    def plugin(self) -> PluginFlags:
        return self.config.flags.plugin or PluginFlags()

    @property
    def device_list_strategies(self) -> tuple[str, ...]:
        return tuple(self.plugin.deviceListStrategy or ("envvar",))

    def sharing_strategy(self) -> tuple[str, SharingStrategy | None]:
        """("mps" | "time-slicing" | "none", its block): NVIDIA's resolution, MPS first."""
        if self.config.sharing is None:
            return "none", None
        return self.config.sharing.strategy()

    def log_json(self) -> str:
        return json.dumps(dump(self.config), indent=2, ensure_ascii=False)

    def log_settings(self) -> str:
        return render_block(self.effective)


def validate(settings: PluginSettings) -> None:
    """NVIDIA's startup validation, with its texts (prefixed 'unable to validate flags:')."""
    flags, plugin = settings.flags, settings.plugin
    problems: list[str] = []
    for strategy in settings.device_list_strategies:
        if strategy not in DEVICE_LIST_STRATEGIES:
            problems.append(f"invalid --device-list-strategy option: invalid strategy: {strategy}")
    if (plugin.deviceIDStrategy or "uuid") not in DEVICE_ID_STRATEGIES:
        problems.append(f"invalid --device-id-strategy option: {plugin.deviceIDStrategy}")
    policy = plugin.sharedDevicesAllocationPolicy or DISTRIBUTED
    if policy not in SHARED_ALLOCATION_POLICIES:
        problems.append(f"invalid --shared-devices-allocation-policy option: {policy}")
    channel_ids = settings.config.imex.channelIDs if settings.config.imex else None
    if channel_ids not in (None, [], [0]):
        # The file's value is checked when it is parsed; this catches --imex-channel-ids / IMEX_CHANNEL_IDS.
        found = " ".join(str(i) for i in channel_ids or [])
        problems.append(
            f"invalid IMEX channel IDs: invalid IMEX config: channelIDs must be [] or [0]; found [{found}]"
        )
    discovery = flags.deviceDiscoveryStrategy or AUTO_DISCOVERY
    if discovery not in DEVICE_DISCOVERY_STRATEGIES:
        problems.append(f"invalid --device-discovery-strategy option {discovery}")
    mig = flags.migStrategy or "none"
    if mig not in MIG_STRATEGIES:
        problems.append(f"unknown MIG strategy: {mig}")
    sharing_kind, _ = settings.sharing_strategy()
    if sharing_kind == "mps":
        if mig == "mixed":
            problems.append("using --mig-strategy=mixed is not supported with MPS")
        if not flags.mpsRoot:
            problems.append(MPS_ROOT_MISSING)
    if problems:
        raise ConfigError(
            "unable to validate flags: " + "; ".join(problems),
            [f"unable to validate flags: {p}" for p in problems],
        )


def _value(flags: Mapping[str, FlagValue], name: str) -> Any:
    """A flag's value, or its default when the caller did not pass it (e.g. tests, other commands)."""
    return value_of(flags, lookup(PLUGIN, name))


def flag_enabled(flags: Mapping[str, FlagValue], name: str) -> bool:
    given = flags.get(name)
    return bool(given and given.value)


def resolve(flags: Mapping[str, FlagValue]) -> PluginSettings:
    """Load the config file named by the flags (if any), merge the flags, validate. Raises ConfigError."""
    config_file = str(flags["config-file"].value) if "config-file" in flags else ""
    config, warnings = load_config_file(config_file) if config_file else (Config(), [])
    merged = merge_flags(config, flags)
    warnings = warnings + apply_nvidia_restrictions(
        merged, flag_enabled(flags, "allow-resource-customization")
    )
    apply_sharing_defaults(merged)
    if warnings and flag_enabled(flags, "strict-config"):
        raise ConfigError("strict config: " + "; ".join(warnings), [f"strict config: {w}" for w in warnings])
    # Notes on NVIDIA's values kubegpu accepts but does otherwise: said once, never a strict-config error.
    hooks = tuple(_value(flags, "cdi-disable-hooks"))
    features = tuple(_value(flags, "cdi-feature-flags"))
    notes = cdi_flag_notes(hooks, features)
    strategy = merged.flags.deviceDiscoveryStrategy or AUTO_DISCOVERY
    if note := discovery_strategy_note(strategy, "are not advertised"):
        notes.insert(0, note)
    settings = PluginSettings(
        config=merged,
        kubelet_socket=str(_value(flags, "kubelet-socket")),
        config_file=config_file,
        warnings=(*warnings, *notes),
        allow_customization=flag_enabled(flags, "allow-resource-customization"),
        mps_client_limits=bool(_value(flags, "mps-client-limits")),
        http_port=int(_value(flags, "http-port")),
        http_address=str(_value(flags, "http-address")),
        pod_resources_socket=str(_value(flags, "pod-resources-socket")),
        health_grace_s=float(_value(flags, "health-grace-period")),
        metrics_interval_s=float(_value(flags, "metrics-interval")),
        idle_threshold_percent=int(_value(flags, "idle-threshold")),
        proc_root=Path(_value(flags, "proc-root")),
        node_name=str(_value(flags, "node-name")),
        dra_gpus=_value(flags, "dra-gpus"),
        cdi_disable_hooks=hooks,
        cdi_feature_flags=features,
        env=DaemonEnv.from_given(flags),
        effective=effective(PLUGIN_SETTINGS, flags),
    )
    validate(settings)
    check_http_address(settings.http_address)
    return settings


def http_address_problem(address: str) -> str | None:
    """Why `address` cannot be listened on as a host (the resolver's own limits), or None.

    A DNS name of labels of 1 to 63 characters, 253 at most in all (RFC 1035): a longer one made the
    resolver fail with "label too long" deep in the HTTP endpoint's start. An IP address (IPv4, IPv6 bare or
    in brackets, with a zone) passes these checks as it is: no spaces, one label per dot, short labels.
    """
    if not address:
        return None
    if not address.isprintable() or any(c.isspace() for c in address):
        return "it holds spaces or control characters"
    name = address.removesuffix(".")
    if len(name) > 253:
        return f"it is {len(name)} characters, over the 253 of a DNS name"
    for label in name.split("."):
        if not label:
            return "it has an empty label (two dots in a row)"
        if len(label) > 63:
            return f"a label of it is {len(label)} characters, over the 63 of a DNS label"
    try:
        address.encode("idna")
    except UnicodeError as err:
        return f"it is not a valid host name ({err})"
    return None


def check_http_address(address: str) -> None:
    problem = http_address_problem(address)
    if problem:
        raise ConfigError(
            f"invalid --http-address (KUBEGPU_HTTP_ADDRESS) {quote_id(address, VALUE_LIMIT)}: {problem}; "
            'give an IP address or host name of this node, or "" to listen on every interface'
        )
