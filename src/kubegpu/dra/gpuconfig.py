"""Opaque device configuration in NVIDIA's shape (resource.nvidia.com/v1beta1 `GpuConfig`, `MigDeviceConfig`).

    config:
    - requests: ["gpu"]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: MPS            # or TimeSlicing
            mpsConfig:
              defaultActiveThreadPercentage: 50
              defaultPinnedDeviceMemoryLimit: 10Gi
              defaultPerDevicePinnedMemoryLimit: {"0": 5Gi}   # by device index in the claim, or UUID
            # timeSlicingConfig: {interval: Default | Short | Medium | Long}

Decoded strictly, as NVIDIA's driver decodes it (unknown fields are errors); validated with NVIDIA's rules
and texts. Which config applies to which result follows the scheduler's allocation: class configs first,
then the claim's, a later one for the same request winning; a config without requests applies to all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.common.quantity import QuantityError, value

if TYPE_CHECKING:
    from kubegpu.dra.claims import AllocatedClaim
    from kubegpu.dra.devices import DraDevice

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_CONFIG = "MigDeviceConfig"
TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = ("Default", "Short", "Medium", "Long")
MIB = 1024 * 1024


class ConfigError(ValueError):
    """A config the claim cannot be prepared with; the text names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Sharing:
    strategy: str  # TIME_SLICING or MPS
    interval: str | None = None  # TimeSlicing
    thread_percentage: int | None = None  # MPS
    pinned_default: int | None = None  # MPS, bytes
    pinned_per_device: tuple[tuple[str, int], ...] = ()  # MPS: (index or UUID, bytes)
    multi_user: bool = False  # MPS: the daemon serves clients of every user (`-M`)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": self.strategy}
        if self.interval is not None:
            out["interval"] = self.interval
        if self.thread_percentage is not None:
            out["defaultActiveThreadPercentage"] = self.thread_percentage
        if self.pinned_default is not None:
            out["defaultPinnedDeviceMemoryLimit"] = self.pinned_default
        if self.pinned_per_device:
            out["defaultPerDevicePinnedMemoryLimit"] = dict(self.pinned_per_device)
        if self.multi_user:
            out["multiUser"] = True
        return out

    def pinned_limits(self, uuids: Sequence[str]) -> dict[str, int]:
        """The pinned device memory limit of each of `uuids` that has one, in bytes: the default, then the
        per-device ones (a key is a UUID, or an index into `uuids`). ConfigError for a bad key."""
        limits = {u: self.pinned_default for u in uuids if self.pinned_default is not None}
        for key, amount in self.pinned_per_device:
            uuid = key if key in uuids else _by_index(key, uuids)
            limits[uuid] = amount
        return limits

    def env(self, uuids: Sequence[str]) -> list[str]:
        """The MPS client limits for the claim's devices (CUDA's MPS env vars, "<uuid>=<n>M" limits)."""
        if self.strategy != MPS:
            return []
        env = []
        if self.thread_percentage is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={self.thread_percentage}")
        limits = self.pinned_limits(uuids)
        if limits:
            env.append(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + ",".join(f"{u}={b // MIB}M" for u, b in limits.items())
            )
        return env


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    kind: str  # GPU_CONFIG or MIG_CONFIG
    sharing: Sharing | None = None


def _by_index(key: str, uuids: Sequence[str]) -> str:
    try:
        index = int(key)
    except ValueError:
        raise ConfigError(f"invalid device: unable to parse key as an integer: {key}") from None
    if 0 <= index < len(uuids):
        return uuids[index]
    raise ConfigError(f"invalid device: invalid device index: {index}")


def parse(parameters: Any) -> DeviceConfig:
    """An opaque config's parameters; ConfigError with one line naming what is wrong."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(
            f"opaque parameters must be an object with apiVersion and kind, got {_kind(parameters)}"
        )
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION or kind not in (GPU_CONFIG, MIG_CONFIG):
        raise ConfigError(
            f"unknown opaque config {api_version}/{kind}: use apiVersion {API_VERSION} with kind "
            f"{GPU_CONFIG} or {MIG_CONFIG}"
        )
    _known(parameters, ("apiVersion", "kind", "sharing"), kind)
    raw = parameters.get("sharing")
    sharing = None if raw is None else _sharing(raw, kind)
    return DeviceConfig(kind, sharing)


def _sharing(raw: Any, kind: str) -> Sharing:
    where = f"{kind}.sharing"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be an object, got {_kind(raw)}")
    _known(raw, ("strategy", "timeSlicingConfig", "mpsConfig"), where)
    strategy = raw.get("strategy")
    if strategy == "Fabric":
        raise ConfigError("fabric GPU sharing strategy is not enabled")
    if strategy not in (TIME_SLICING, MPS) or (kind == MIG_CONFIG and strategy == TIME_SLICING):
        allowed = "MPS" if kind == MIG_CONFIG else "TimeSlicing or MPS"
        raise ConfigError(f"unknown GPU sharing strategy: {strategy}; use {allowed}")
    if strategy == TIME_SLICING:
        if raw.get("mpsConfig") is not None:
            raise ConfigError(f"cannot use MpsConfig with the '{TIME_SLICING}' strategy")
        config = raw.get("timeSlicingConfig") or {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}.timeSlicingConfig must be an object, got {_kind(config)}")
        _known(config, ("interval",), f"{where}.timeSlicingConfig")
        interval = config.get("interval", "Default")
        if interval not in INTERVALS:
            raise ConfigError(f"unknown time-slice interval: {interval}; use one of {', '.join(INTERVALS)}")
        return Sharing(TIME_SLICING, interval=interval)
    if raw.get("timeSlicingConfig") is not None:
        raise ConfigError(f"cannot use TimeSlicingConfig with the '{MPS}' strategy")
    config = raw.get("mpsConfig") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}.mpsConfig must be an object, got {_kind(config)}")
    _known(
        config,
        (
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "multiUser",
        ),
        f"{where}.mpsConfig",
    )
    multi_user = config.get("multiUser", False)
    if not isinstance(multi_user, bool):
        raise ConfigError(f"multiUser must be a boolean, got {_kind(multi_user)}")
    percentage = config.get("defaultActiveThreadPercentage")
    if percentage is not None:
        if isinstance(percentage, bool) or not isinstance(percentage, int):
            raise ConfigError(f"defaultActiveThreadPercentage must be an integer, got {_kind(percentage)}")
        if percentage < 0:
            raise ConfigError("active thread percentage must not be negative")
        if percentage > 100:
            raise ConfigError("active thread percentage must not be greater than 100")
    default = config.get("defaultPinnedDeviceMemoryLimit")
    pinned = None if default is None else _limit(default, "default value set too low")
    per_device = config.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_device, Mapping):
        raise ConfigError(f"defaultPerDevicePinnedMemoryLimit must be an object, got {_kind(per_device)}")
    limits = tuple((str(k), _limit(v, f"value set too low: {k}")) for k, v in per_device.items())
    return Sharing(
        MPS,
        thread_percentage=percentage,
        pinned_default=pinned,
        pinned_per_device=limits,
        multi_user=multi_user,
    )


def _limit(raw: Any, too_low: str) -> int:
    try:
        amount = value(raw)
    except (QuantityError, TypeError) as err:
        raise ConfigError(f"invalid pinned memory limit {raw!r}: {err}") from None
    if amount // MIB <= 0:
        raise ConfigError(f"invalid limit: {too_low}: {raw}; use at least 1Mi")
    return amount


def _known(raw: Mapping[str, Any], fields: Iterable[str], where: str) -> None:
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f'{where}: unknown field "{unknown[0]}"; known fields: {", ".join(fields)}')


def _kind(raw: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(raw), type(raw).__name__
    )


def configs_for_results(
    allocation_configs: Sequence[Mapping[str, Any]], driver: str, requests: Sequence[str]
) -> dict[str, DeviceConfig]:
    """The config that applies to each request (by request name), from the allocation's configs.

    Class configs first, then the claim's; within each, later entries win. Requests without a config are
    left out (the device is prepared without sharing)."""
    ordered = sorted(
        (c for c in allocation_configs if (c.get("opaque") or {}).get("driver") == driver),
        key=lambda c: 0 if c.get("source") == "FromClass" else 1,
    )
    out: dict[str, DeviceConfig] = {}
    for config in ordered:
        parsed = parse(config["opaque"].get("parameters"))
        targets = config.get("requests") or requests
        for request in targets:
            # A subrequest ("req/sub") config applies to results of that subrequest only.
            out[request] = parsed
    return out


def sharing_of(
    claim: AllocatedClaim, picked: Sequence[DraDevice], driver_name: str
) -> dict[str, Sharing | None]:
    """The sharing config of each device picked for `claim`'s results (by device name); ConfigError for a
    config that does not fit the device it applies to."""
    configs = configs_for_results(claim.configs, driver_name, [r.request for r in claim.results])
    out: dict[str, Sharing | None] = {}
    for result, device in zip(claim.results, picked, strict=True):
        config: DeviceConfig | None = configs.get(result.request) or configs.get(result.request_name)
        if config is None:
            out.setdefault(device.name, None)
            continue
        wanted = MIG_CONFIG if device.mig else GPU_CONFIG
        if config.kind != wanted:
            raise ConfigError(
                f"claim {claim.namespace}/{claim.name}: a {config.kind} cannot configure "
                f"{device.kind.upper()} device {device.name} (request {result.request}): use {wanted}"
            )
        out[device.name] = config.sharing
    return out
