"""The typed values of the settings that have no place in NVIDIA's config file, as the lower layers use them.

The node, the allocation core and the daemon receive these instead of reading the environment: NVML backend
selection (`NvmlSelection`), and the daemon's intervals, paths and health rules (`DaemonEnv`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubegpu.settings.choices import DEFAULT_SYSFS_ROOT
from kubegpu.settings.given import FlagValue, read_given, value_of
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command, lookup
from kubegpu.settings.values import XidList


@dataclass(frozen=True, slots=True)
class NvmlSelection:
    """Which NVML to load: the driver's (`fake_profile` empty) or the fake one with a node profile."""

    fake_profile: str = ""
    fake_state: Path | None = None  # the fake's state directory (`kubegpu fake-nvml inject` writes there)
    sysfs_root: Path = Path(DEFAULT_SYSFS_ROOT)  # with the real NVML

    @classmethod
    def fake(cls, profile: str, state: Path | None = None) -> NvmlSelection:
        return cls(fake_profile=profile, fake_state=state)

    @classmethod
    def from_given(cls, given: Mapping[str, FlagValue], command: str = PLUGIN) -> NvmlSelection:
        def value(name: str) -> object:
            return value_of(given, lookup(command, name))

        profile, state, sysfs = value("fake-nvml"), value("fake-nvml-state"), value("sysfs-root")
        assert isinstance(profile, str) and isinstance(sysfs, Path)
        assert state is None or isinstance(state, Path)
        return cls(profile.strip(), state, sysfs)


@dataclass(frozen=True, slots=True)
class DaemonEnv:
    """The plugin daemon's settings beyond NVIDIA's config: env vars only, validated at start.

    No defaults here: they are the table's (`DaemonEnv.default()`).
    """

    nvml: NvmlSelection
    discovery_retry_s: float
    mps_retry_s: float
    mps_container_root: Path
    cdi_root: Path
    health_recovery: bool
    recovery_quiet_s: float
    health_probe_s: float
    xid_actions: Path | None
    disable_healthchecks: XidList
    enable_healthchecks: XidList

    @classmethod
    def default(cls) -> DaemonEnv:
        return cls.from_given({})

    @classmethod
    def from_given(cls, given: Mapping[str, FlagValue]) -> DaemonEnv:
        """From the plugin's given settings; defaults for those left out (e.g. by the MPS daemon)."""

        def value(name: str) -> object:
            return value_of(given, lookup(PLUGIN, name))

        disable, enable = value("disable-healthchecks"), value("enable-healthchecks")
        return cls(
            nvml=NvmlSelection.from_given(given),
            discovery_retry_s=_float(value("discovery-retry-seconds")),
            mps_retry_s=_float(value("mps-retry-seconds")),
            mps_container_root=_path(value("mps-container-root")),
            cdi_root=_path(value("cdi-root")),
            health_recovery=bool(value("health-recovery")),
            recovery_quiet_s=_float(value("recovery-quiet-seconds")),
            health_probe_s=_float(value("health-probe-seconds")),
            xid_actions=_optional_path(value("xid-actions")),
            disable_healthchecks=disable if isinstance(disable, XidList) else XidList(),
            enable_healthchecks=enable if isinstance(enable, XidList) else XidList(),
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DaemonEnv:
        """From env vars alone (no flags), validated; raises SettingError. For tools and tests."""
        env_only = [s for s in for_command(PLUGIN) if not s.flag]
        return cls.from_given(read_given(env_only, {}, environ))


def _float(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


def _path(value: object) -> Path:
    assert isinstance(value, Path)
    return value


def _optional_path(value: object) -> Path | None:
    return None if value is None else _path(value)
