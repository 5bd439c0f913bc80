"""NVIDIA's v1 config file, its flags and env vars, and their precedence.

One table (`FLAGS`) names every flag once: its CLI spelling, aliases, env vars, default and the config key it
fills. The CLI builds its options from it and `merge_flags` applies NVIDIA's rule: a flag given on the command
line or through its env var overwrites the file; otherwise the file's value stands, and the default fills only
what the file left unset. So CLI > env > file > default.
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from kubegpu.allocation.allocate import DEVICE_ID_STRATEGIES, DEVICE_LIST_STRATEGIES
from kubegpu.allocation.cdi import DEFAULT_ANNOTATION_PREFIX, DEFAULT_CONTAINER_DRIVER_ROOT, DEFAULT_HOOK_PATH
from kubegpu.allocation.preferred import DISTRIBUTED, SHARED_ALLOCATION_POLICIES
from kubegpu.settings.nvidia_sharing import Imex, ReplicatedDevices, Resources, Sharing, SharingStrategy

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
MIG_STRATEGIES = ("none", "single", "mixed")


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


@dataclass(frozen=True, slots=True)
class FlagSpec:
    name: str  # CLI spelling without dashes
    envvars: tuple[str, ...]
    default: Any
    path: tuple[str, ...]  # config key, e.g. ("flags", "plugin", "deviceIDStrategy"); () = not in the file
    kind: Literal["str", "bool", "list", "int", "float"]
    help: str
    aliases: tuple[str, ...] = ()
    # NVIDIA's imex.* keys: the flag overwrites the file only when given, never with its default.
    explicit_only: bool = False
    # Turns the parsed flag value into the config value (e.g. strings into channel IDs); raises ConfigError.
    convert: Callable[[Any], Any] | None = None


def _channel_ids(values: Sequence[str]) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ConfigError(
            f"invalid --imex-channel-ids option: {','.join(values)}: channel IDs are integers (use 0)"
        ) from None


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
        "How the device list reaches the container runtime: envvar, volume-mounts, cdi-annotations, "
        "cdi-cri (comma list allowed).",
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
        "cdi-annotation-prefix",
        ("CDI_ANNOTATION_PREFIX",),
        DEFAULT_ANNOTATION_PREFIX,
        ("flags", "plugin", "cdiAnnotationPrefix"),
        "str",
        "Prefix of the annotation key that carries CDI device names (cdi-annotations strategy).",
    ),
    FlagSpec(
        "nvidia-cdi-hook-path",
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        DEFAULT_HOOK_PATH,
        ("flags", "plugin", "nvidiaCTKPath"),
        "str",
        "Path on the host of nvidia-cdi-hook (or nvidia-ctk) for the hooks in the generated CDI specs.",
        ("nvidia-ctk-path",),
    ),
    FlagSpec(
        "driver-root-ctr-path",
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        DEFAULT_CONTAINER_DRIVER_ROOT,
        ("flags", "plugin", "containerDriverRoot"),
        "str",
        "Where the driver root is mounted in the plugin's container (searched for the CDI specs' libraries).",
        ("container-driver-root",),
    ),
    FlagSpec(
        "gdrcopy-enabled",
        ("GDRCOPY_ENABLED",),
        False,
        ("flags", "gdrcopyEnabled"),
        "bool",
        "Give containers GDRCopy (NVIDIA_GDRCOPY=enabled; /dev/gdrdrv with CDI).",
    ),
    FlagSpec(
        "gds-enabled",
        ("GDS_ENABLED",),
        False,
        ("flags", "gdsEnabled"),
        "bool",
        "Give containers GPUDirect Storage (NVIDIA_GDS=enabled; /dev/nvidia-fs* with CDI).",
    ),
    FlagSpec(
        "mofed-enabled",
        ("MOFED_ENABLED",),
        False,
        ("flags", "mofedEnabled"),
        "bool",
        "Give containers MOFED (NVIDIA_MOFED=enabled; /dev/infiniband nodes with CDI).",
    ),
    FlagSpec(
        "imex-channel-ids",
        ("IMEX_CHANNEL_IDS",),
        (),
        ("imex", "channelIDs"),
        "list",
        "IMEX channels every container gets: none, or 0.",
        explicit_only=True,
        convert=_channel_ids,
    ),
    FlagSpec(
        "imex-required",
        ("IMEX_REQUIRED",),
        False,
        ("imex", "required"),
        "bool",
        "Fail the start when a requested IMEX channel does not exist (else it is skipped with a warning).",
        explicit_only=True,
    ),
    FlagSpec(
        "shared-devices-allocation-policy",
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        DISTRIBUTED,
        ("flags", "plugin", "sharedDevicesAllocationPolicy"),
        "str",
        "How replicas are picked: distributed (spread over GPUs) or packed (fill a GPU first).",
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
    FlagSpec(
        "mps-root",
        ("MPS_ROOT",),
        "",
        ("flags", "mpsRoot"),
        "str",
        "Host directory of the MPS control daemons' pipes and shm (required when MPS sharing is on).",
    ),
    # kubegpu's own flags (not NVIDIA's): opt-ins beyond NVIDIA's behaviour.
    FlagSpec(
        "allow-resource-customization",
        ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",),
        False,
        (),
        "bool",
        "Honour `resources` and the `rename`/`devices` of shared resources (NVIDIA ignores them).",
    ),
    FlagSpec(
        "http-port",
        ("KUBEGPU_HTTP_PORT",),
        0,
        (),
        "int",
        "Serve /healthz, /readyz and /metrics on this TCP port; 0 (the default) serves nothing.",
    ),
    FlagSpec(
        "http-address",
        ("KUBEGPU_HTTP_ADDRESS",),
        "",
        (),
        "str",
        "Address the HTTP endpoint listens on; empty means every interface.",
    ),
    FlagSpec(
        "pod-resources-socket",
        ("KUBEGPU_POD_RESOURCES_SOCKET",),
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        (),
        "str",
        'The kubelet\'s PodResources API, for the which-pod-holds-which-GPU metric; "" turns it off.',
    ),
    FlagSpec(
        "health-grace-period",
        ("KUBEGPU_HEALTH_GRACE_SECONDS",),
        60.0,
        (),
        "float",
        "Seconds a resource may stay unregistered (start, kubelet restart) before /healthz fails.",
    ),
    FlagSpec(
        "mps-client-limits",
        ("KUBEGPU_MPS_CLIENT_LIMITS",),
        True,
        (),
        "bool",
        "Give MPS containers CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.",
    ),
    FlagSpec(
        "strict-config",
        ("KUBEGPU_STRICT_CONFIG",),
        False,
        (),
        "bool",
        "Treat config warnings (unknown or misplaced keys, ignored fields) as errors.",
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
        if given.explicit or (not spec.explicit_only and _get(merged, spec.path) is None):
            value = list(given.value) if spec.kind == "list" else given.value
            _set(merged, spec.path, spec.convert(value) if spec.convert else value)
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
    allow_customization: bool = False
    mps_client_limits: bool = True
    http_port: int = 0
    http_address: str = ""
    pod_resources_socket: str = ""
    health_grace_s: float = 60.0

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
        return self.config.model_dump_json(indent=2, exclude_none=True)


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
    mig = flags.migStrategy or "none"
    if mig not in MIG_STRATEGIES:
        problems.append(f"unknown MIG strategy: {mig}")
    sharing_kind, _ = settings.sharing_strategy()
    if sharing_kind == "mps":
        if mig == "mixed":
            problems.append("using --mig-strategy=mixed is not supported with MPS")
        if not flags.mpsRoot:
            problems.append("using MPS requires --mps-root to be specified")
    if problems:
        raise ConfigError(
            "unable to validate flags: " + "; ".join(problems),
            [f"unable to validate flags: {p}" for p in problems],
        )


def _value(flags: Mapping[str, FlagValue], name: str) -> Any:
    """A flag's value, or its default when the caller did not pass it (e.g. tests, other commands)."""
    given = flags.get(name)
    return given.value if given is not None else next(s.default for s in FLAGS if s.name == name)


def flag_enabled(flags: Mapping[str, FlagValue], name: str) -> bool:
    given = flags.get(name)
    return bool(given and given.value)


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
    for key, block in (("timeSlicing", sharing and sharing.timeSlicing), ("mps", sharing and sharing.mps)):
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
    kubelet = flags.get("kubelet-socket")
    settings = PluginSettings(
        config=merged,
        kubelet_socket=DEFAULT_KUBELET_SOCKET if kubelet is None else str(kubelet.value),
        config_file=config_file,
        warnings=tuple(warnings),
        allow_customization=flag_enabled(flags, "allow-resource-customization"),
        mps_client_limits=flags["mps-client-limits"].value if "mps-client-limits" in flags else True,
        http_port=int(_value(flags, "http-port")),
        http_address=str(_value(flags, "http-address")),
        pod_resources_socket=str(_value(flags, "pod-resources-socket")),
        health_grace_s=float(_value(flags, "health-grace-period")),
    )
    validate(settings)
    return settings
