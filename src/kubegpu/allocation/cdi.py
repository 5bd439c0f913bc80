"""CDI: the spec files a container runtime reads to inject our devices, and the names Allocate hands out.

With a `cdi-annotations` or `cdi-cri` device-list strategy, Allocate names devices as CDI qualified names
(`k8s.device-plugin.nvidia.com/gpu=<uuid or index>`) and the runtime (containerd >= 1.7, CRI-O >= 1.24)
looks them up in the spec files we write here, as NVIDIA's plugin does:

  <cdi root>/k8s.device-plugin.nvidia.com-gpu.json           always (one device per GPU and MIG device,
                                                              named by --device-id-strategy, plus `all`)
  <cdi root>/k8s.device-plugin.nvidia.com-imex-channel.json  when IMEX channels are configured
  <cdi root>/k8s.device-plugin.nvidia.com-<mode>.json        gdrcopy / gds / mofed when enabled and their
                                                              device nodes exist (an empty one is skipped)

The CDI root is /var/run/cdi, or `KUBEGPU_CDI_ROOT` (for tests and unusual runtimes; the daemon gets it typed
from `kubegpu.settings.env.DaemonEnv`). Files are written
atomically (temporary file, fsync, rename) and only when their content changes, rewritten when the
inventory changes (discovery, reload), and removed on shutdown. The gpu spec's common edits give every
container the control device nodes, the driver's user-space libraries, binaries and firmware found under
the driver root (read-only bind mounts at their host paths), the env below, and two hooks
(`--nvidia-cdi-hook-path`): create-symlinks for libcuda.so and update-ldcache for the library folders, so
the CUDA runtime finds the driver through the container's ld cache without touching its LD_LIBRARY_PATH.
`--cdi-disable-hooks` leaves either out by name, or both with `all`, as NVIDIA's CDI library does.

The tests validate every generated spec against the CDI project's published JSON schema (tests/fixtures/cdi)
and an overlay with the stricter rules of the specification's prose (tests/cdi_schema.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubegpu.allocation.resources import gpu_device, mig_device
from kubegpu.node.driverfiles import (
    CONTROL_DEVICES,
    MODE_DEVICES,
    MODES,
    DriverFiles,
    existing,
    find_driver_files,
    imex_channel_path,
    join,
    looking_root,
)
from kubegpu.node.inventory import Inventory
from kubegpu.settings.choices import ALL_HOOKS, DEFAULT_CONTAINER_DRIVER_ROOT, DEFAULT_HOOK_PATH
from kubegpu.settings.plugin import PluginSettings

log = logging.getLogger(__name__)

VENDOR = "k8s.device-plugin.nvidia.com"
GPU_CLASS = "gpu"
IMEX_CLASS = "imex-channel"
# 0.5.0 is the first version with deviceNodes[].hostPath, which we need for a driver root other than /.
CDI_VERSION = "0.5.0"
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]
# Tells the NVIDIA runtime hook that CDI already injected the devices, so it adds nothing on top.
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"

Spec = dict[str, Any]


def qualified_name(device_class: str, name: str) -> str:
    return f"{VENDOR}/{device_class}={name}"


def spec_file_name(device_class: str) -> str:
    return f"{VENDOR}-{device_class}.json"


@dataclass(frozen=True, slots=True)
class CdiOptions:
    device_id_strategy: str = "uuid"
    driver_root: str = "/"  # host view
    dev_root: str = "/"  # host view
    container_driver_root: str = DEFAULT_CONTAINER_DRIVER_ROOT  # where the plugin sees the driver root
    hook_path: str = DEFAULT_HOOK_PATH
    modes: tuple[str, ...] = ()  # enabled: gdrcopy, gds, mofed
    imex_channels: tuple[str, ...] = ()
    disabled_hooks: frozenset[str] = frozenset()  # --cdi-disable-hooks: hook names, or "all"
    # MIG capability minors ("gpu0/gi1/access" -> 21): a MIG device's nodes are its parent's plus two caps.
    mig_minors: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls,
        settings: PluginSettings,
        imex_channels: Sequence[str] = (),
        mig_minors: Mapping[str, int] | None = None,
    ) -> CdiOptions:
        flags, plugin = settings.flags, settings.plugin
        driver_root = flags.nvidiaDriverRoot or "/"
        return cls(
            device_id_strategy=plugin.deviceIDStrategy or "uuid",
            driver_root=driver_root,
            dev_root=flags.nvidiaDevRoot or driver_root,
            container_driver_root=plugin.containerDriverRoot or DEFAULT_CONTAINER_DRIVER_ROOT,
            hook_path=plugin.nvidiaCTKPath or DEFAULT_HOOK_PATH,
            modes=enabled_modes(settings),
            imex_channels=tuple(imex_channels),
            disabled_hooks=frozenset(settings.cdi_disable_hooks),
            mig_minors=dict(mig_minors or {}),
        )

    @property
    def driver_lookup_root(self) -> str:
        return looking_root(self.driver_root, self.container_driver_root)

    @property
    def dev_lookup_root(self) -> str:
        # The dev root is inside the mounted driver root when the two are the same (the usual case).
        if self.dev_root.rstrip("/") == self.driver_root.rstrip("/"):
            return self.driver_lookup_root
        return self.dev_root


def specs_for(
    inventory: Inventory,
    settings: PluginSettings,
    imex_channels: Sequence[str],
    mig_minors: Mapping[str, int],
) -> dict[str, Spec]:
    """The specs to keep in the CDI root: none unless a CDI device-list strategy is selected."""
    if not any(s.startswith("cdi-") for s in settings.device_list_strategies):
        return {}
    return build_specs(inventory, CdiOptions.from_settings(settings, imex_channels, mig_minors))


def enabled_modes(settings: PluginSettings) -> tuple[str, ...]:
    flags = settings.flags
    switched = {"gdrcopy": flags.gdrcopyEnabled, "gds": flags.gdsEnabled, "mofed": flags.mofedEnabled}
    return tuple(mode for mode in MODES if switched[mode])


def mode_device_nodes(mode: str, options: CdiOptions) -> list[str]:
    return existing(options.dev_lookup_root, MODE_DEVICES[mode])


def nonempty_modes(options: CdiOptions) -> tuple[str, ...]:
    """The enabled modes whose spec has device nodes; NVIDIA drops the others ("Ignoring empty CDI specs")."""
    return tuple(mode for mode in options.modes if mode_device_nodes(mode, options))


# -- spec building ------------------------------------------------------------------------------------


def build_specs(inventory: Inventory, options: CdiOptions) -> dict[str, Spec]:
    """Every spec to write, by device class."""
    specs = {GPU_CLASS: gpu_spec(inventory, options)}
    if options.imex_channels:
        specs[IMEX_CLASS] = _spec(
            IMEX_CLASS, [_device(c, _nodes([imex_channel_path(c)], options)) for c in options.imex_channels]
        )
    for mode in nonempty_modes(options):
        specs[mode] = _spec(mode, [_device("all", _nodes(mode_device_nodes(mode, options), options))])
    return specs


def gpu_spec(inventory: Inventory, options: CdiOptions) -> Spec:
    devices = _gpu_devices(inventory, options)
    every = list(dict.fromkeys(p for _, paths in devices for p in paths))
    files = find_driver_files(options.driver_lookup_root, inventory.driver_version)
    if not files.libraries:
        log.warning(
            "CDI spec lists no driver libraries: none found under %s (driver %s); "
            "check --driver-root / --driver-root-ctr-path",
            options.driver_lookup_root,
            inventory.driver_version or "version unknown",
        )
    spec = _spec(
        GPU_CLASS,
        [_device(name, _nodes(paths, options)) for name, paths in devices]
        + [_device("all", _nodes(every, options))],
    )
    spec["containerEdits"] = _common_edits(files, options)
    return spec


def _gpu_devices(inventory: Inventory, options: CdiOptions) -> list[tuple[str, list[str]]]:
    """(name, device nodes) for every GPU and MIG device, named as the device-ID strategy says.

    The nodes are those of the resources' devices, so a CDI device and --pass-device-specs always agree.
    """
    by_index = options.device_id_strategy == "index"
    out: list[tuple[str, list[str]]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        devices = [gpu_device(gpu), *(mig_device(gpu, m, options.mig_minors) for m in gpu.mig_devices)]
        out.extend((d.index if by_index else d.uuid, list(d.paths)) for d in devices)
    return out


def common_edits(inventory: Inventory, options: CdiOptions) -> dict[str, Any]:
    """The edits every GPU container gets (control devices, driver libraries and binaries, hooks); the DRA
    driver's per-claim specs carry the same."""
    return _common_edits(find_driver_files(options.driver_lookup_root, inventory.driver_version), options)


def _common_edits(files: DriverFiles, options: CdiOptions) -> dict[str, Any]:
    env = [VISIBLE_DEVICES_VOID]
    libcuda = files.library("libcuda.so")
    if libcuda is not None:
        env.append(f"NVIDIA_CTK_LIBCUDA_DIR={os.path.dirname(libcuda)}")
    edits: dict[str, Any] = {
        "env": env,
        "deviceNodes": _nodes(existing(options.dev_lookup_root, CONTROL_DEVICES), options),
        "mounts": [
            {"hostPath": join(options.driver_root, p), "containerPath": p, "options": list(MOUNT_OPTIONS)}
            for p in (*files.libraries, *files.binaries, *files.firmware)
        ],
    }
    hooks = _hooks(files, options.hook_path, options.disabled_hooks)
    if hooks:
        edits["hooks"] = hooks
    return edits


def _hooks(files: DriverFiles, hook_path: str, disabled: frozenset[str]) -> list[dict[str, Any]]:
    if not files.libraries or ALL_HOOKS in disabled:
        return []
    name = os.path.basename(hook_path)
    # nvidia-ctk takes hooks as a subcommand ("nvidia-ctk hook update-ldcache"); nvidia-cdi-hook directly.
    base = [name, "hook"] if name == "nvidia-ctk" else [name]
    hooks = []
    libcuda = files.library("libcuda.so")
    if libcuda is not None and "create-symlinks" not in disabled:
        folder = os.path.dirname(libcuda)
        link = ["--link", f"libcuda.so.1::{folder}/libcuda.so"]
        hooks.append(_hook(hook_path, [*base, "create-symlinks", *link]))
    if "update-ldcache" not in disabled:
        folders = [arg for d in files.library_dirs for arg in ("--folder", d)]
        hooks.append(_hook(hook_path, [*base, "update-ldcache", *folders]))
    return hooks


def _hook(path: str, args: list[str]) -> dict[str, Any]:
    return {"hookName": "createContainer", "path": path, "args": args}


def _nodes(paths: Sequence[str], options: CdiOptions) -> list[dict[str, str]]:
    return [{"path": p, "hostPath": join(options.dev_root, p)} for p in paths]


def _device(name: str, nodes: list[dict[str, str]]) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": nodes}}


def _spec(device_class: str, devices: list[dict[str, Any]]) -> Spec:
    return {"cdiVersion": CDI_VERSION, "kind": f"{VENDOR}/{device_class}", "devices": devices}
