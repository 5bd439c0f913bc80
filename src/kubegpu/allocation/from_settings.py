"""From the settings to the options the allocation core runs with.

Shared by the plugin daemon, `kubegpu config check` and the MPS daemon manager, so each builds exactly the
resources and Allocate responses the daemon would. Reads the few node files the options depend on (the
driver's control devices, IMEX channels, MIG capability minors); everything downstream is pure.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubegpu.allocation.allocate import AllocateOptions
from kubegpu.allocation.cdi import CdiOptions, nonempty_modes
from kubegpu.allocation.resources import ResourceOptions, parse_mig_minors
from kubegpu.node.driverfiles import CONTROL_DEVICES, ImexChannelError, imex_channels
from kubegpu.settings.choices import DEFAULT_ANNOTATION_PREFIX
from kubegpu.settings.plugin import PluginSettings


def imex_problem(settings: PluginSettings) -> str | None:
    """Why the daemon would refuse to start over its IMEX channels (a required one missing or not a
    character device), or None. The daemon checks them whether or not it finds GPUs."""
    try:
        allocate_options(settings)
    except ImexChannelError as err:
        return str(err)
    return None


def allocate_options(settings: PluginSettings) -> AllocateOptions:
    """Allocate's options; raises ImexChannelError when a required IMEX channel is missing."""
    dev_root = settings.flags.nvidiaDevRoot or settings.flags.nvidiaDriverRoot or "/"
    cdi = CdiOptions.from_settings(settings)
    imex = settings.config.imex
    # Looked up where the plugin sees the host's /dev (as NVIDIA does), not at the host path.
    channels = imex_channels(
        (imex.channelIDs or []) if imex else [], cdi.dev_lookup_root, bool(imex and imex.required)
    )
    any_cdi = any(s.startswith("cdi-") for s in settings.device_list_strategies)
    return AllocateOptions(
        device_list_strategies=settings.device_list_strategies,
        device_id_strategy=settings.plugin.deviceIDStrategy or "uuid",
        pass_device_specs=bool(settings.plugin.passDeviceSpecs),
        dev_root=dev_root,
        control_devices=tuple(p for p in CONTROL_DEVICES if os.path.exists(dev_root.rstrip("/") + p)),
        cdi_annotation_prefix=settings.plugin.cdiAnnotationPrefix or DEFAULT_ANNOTATION_PREFIX,
        enabled_modes=cdi.modes,
        cdi_modes=nonempty_modes(cdi) if any_cdi else (),
        imex_channels=channels,
        mps_root=settings.flags.mpsRoot or "",
        mps_client_limits=settings.mps_client_limits,
        shared_allocation_policy=settings.plugin.sharedDevicesAllocationPolicy or "distributed",
    )


def resource_options(settings: PluginSettings) -> ResourceOptions:
    kind, block = settings.sharing_strategy()
    minors_file = Path(settings.flags.nvidiaDriverRoot or "/") / "proc/driver/nvidia-caps/mig-minors"
    try:
        minors = parse_mig_minors(minors_file.read_text())
    except (OSError, ValueError):  # missing, or not the driver's text
        minors = {}  # no MIG capability nodes: MIG devices get their parent's device node only
    return ResourceOptions(
        mig_strategy=settings.flags.migStrategy or "none",
        sharing_kind=kind,
        sharing=block,
        custom_names=settings.config.resources if settings.allow_customization else None,
        mig_minors=minors,
    )
