"""The plugin's flags and env vars (NVIDIA's and kubegpu's) and NVIDIA's precedence.

One table (`FLAGS`) names every flag once: its CLI spelling, aliases, env vars, default and the config key it
fills. The CLI builds its options from it and `merge_flags` applies NVIDIA's rule: a flag given on the command
line or through its env var overwrites the file; otherwise the file's value stands, and the default fills only
what the file left unset. So CLI > env > file > default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.settings.choices import (
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_CONTAINER_DRIVER_ROOT,
    DEFAULT_HOOK_PATH,
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_POD_RESOURCES_SOCKET,
    DISTRIBUTED,
)
from kubegpu.settings.nvidia_config import Config, ConfigError


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
        DEFAULT_POD_RESOURCES_SOCKET,
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
