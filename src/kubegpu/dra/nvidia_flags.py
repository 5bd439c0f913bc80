"""What NVIDIA's driver flags change in `kubegpu dra`: the CDI specs' roots and hook, the time slicer."""

from __future__ import annotations

from collections.abc import Mapping

from kubegpu.allocation.cdi import CdiOptions
from kubegpu.dra.timeslicing import TimeSlicer
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
