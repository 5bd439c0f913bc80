"""What NVIDIA's driver flags change in `kubegpu dra`: the CDI specs' roots and hook, the time slicer, the MPS
control daemons."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubegpu.allocation.cdi import CdiOptions
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.mps_daemon import MpsDaemons
from kubegpu.dra.mps_deployment import DeploymentOptions
from kubegpu.dra.nvidia_smi import NvidiaSmi
from kubegpu.dra.timeslicing import TimeSlicer
from kubegpu.node.driverfiles import join
from kubegpu.settings.dra_driver import DriverFlags


def cdi_options(driver: DriverFlags, mig_minors: Mapping[str, int]) -> CdiOptions:
    return CdiOptions(
        driver_root=driver.driver_root,
        dev_root=driver.driver_root,
        container_driver_root=driver.container_driver_root,
        hook_path=driver.hook_path,
        mig_minors=mig_minors,
    )


def time_slicer(driver: DriverFlags) -> TimeSlicer | None:
    """The time slicer when TimeSlicingSettings is on (time-sliced claims are refused otherwise)."""
    return TimeSlicer(driver.container_driver_root) if driver.gates["TimeSlicingSettings"] else None


def mps_daemons(
    driver: DriverFlags, api: KubeClient, node_name: str, plugin_dir: Path, simulated: bool
) -> MpsDaemons | None:
    """The MPS control daemons when MPSSupport is on (MPS claims are refused otherwise). The daemon chroots
    into the driver root when it has a shell, as NVIDIA's does."""
    if driver.mps is None:
        return None
    shell = join(driver.container_driver_root, "bin/sh")
    options = DeploymentOptions(
        namespace=driver.mps.namespace,
        image=driver.mps.image,
        node_name=node_name,
        driver_root=driver.driver_root,
        feature_gates=driver.gates.text(),
        pull_secrets=driver.mps.pull_secrets,
        pull_policy=driver.mps.pull_policy,
        service_account=driver.mps.service_account,
        chroot=os.path.isfile(shell) and os.access(shell, os.X_OK),
    )
    smi = NvidiaSmi(driver.container_driver_root)
    return MpsDaemons(api, plugin_dir=plugin_dir, options=options, smi=smi, simulated=simulated)
