"""TimeSlicingSettings: a claim's GpuConfig time-slice interval set on its GPUs as NVIDIA's driver sets it.

For each full GPU of the claim: `nvidia-smi -i <uuid> -c DEFAULT` (time-slicing needs the DEFAULT compute
mode), then `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>` with NVIDIA's values (Default 0,
Short 1, Medium 2, Long 3); at Unprepare the GPUs go back to Default. nvidia-smi is the one under the
container driver root (`--container-driver-root`), as NVIDIA's driver finds it. MIG devices have no time
slice: nothing is run for them (NVIDIA's behaviour).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kubegpu.common.quoting import plain_id
from kubegpu.dra.devices import DraDevice
from kubegpu.dra.gpuconfig import TIME_SLICING, ConfigError, Sharing
from kubegpu.dra.nvidia_smi import NvidiaSmi, NvidiaSmiError, Runner, run_nvidia_smi

log = logging.getLogger(__name__)

INTERVALS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DEFAULT_INTERVAL = "Default"  # also what a config without an interval means


class TimeSliceError(ConfigError):
    """nvidia-smi failed; the claim fails with this text (a metric label: `timeslice`)."""

    kind = "timeslice"


class TimeSlicer:
    def __init__(self, container_driver_root: str, run: Runner = run_nvidia_smi) -> None:
        self.smi = NvidiaSmi(container_driver_root, run)

    def apply(
        self,
        claim_uid: str,
        requests: Sequence[str],
        devices: Sequence[DraDevice],
        sharing: dict[str, Sharing | None],
    ) -> None:
        """Set each time-sliced full GPU's interval; TimeSliceError (NVIDIA's text) when nvidia-smi fails."""
        for device in devices:
            config = sharing.get(device.name)
            if device.mig is not None or config is None or config.strategy != TIME_SLICING:
                continue
            interval = config.interval or DEFAULT_INTERVAL
            try:
                self._set(device.gpu.uuid, interval)
            except TimeSliceError as err:
                raise TimeSliceError(
                    f"error setting timeslice config for requests '[{' '.join(requests)}]' in claim "
                    f"'{plain_id(claim_uid)}': {err}"
                ) from None
            log.info("claim %s: time slice of %s set to %s", claim_uid, device.gpu.uuid, interval)

    def reset(self, claim_uid: str, uuids: Sequence[str]) -> None:
        """Back to Default at Unprepare; TimeSliceError when nvidia-smi fails (the kubelet retries).

        Every GPU of a claim is its own today; with ConsumableShares, NVIDIA skips the GPUs another prepared
        claim still uses, and so must the caller then."""
        for uuid in uuids:
            try:
                self._set(uuid, DEFAULT_INTERVAL)
            except TimeSliceError as err:
                raise TimeSliceError(
                    f"error resetting timeslice config in claim '{plain_id(claim_uid)}': {err}"
                ) from None
            log.info("claim %s: time slice of %s reset to Default", claim_uid, uuid)

    def _set(self, uuid: str, interval: str) -> None:
        try:
            self.smi.compute_mode(uuid, "DEFAULT")
            self.smi("compute-policy", "-i", uuid, "--set-timeslice", str(INTERVALS[interval]))
        except NvidiaSmiError as err:
            raise TimeSliceError(str(err)) from None


def time_sliced_uuids(sharing: dict[str, object], devices: dict[str, DraDevice]) -> list[str]:
    """The full GPUs a prepared claim's checkpoint summary says were time-sliced (device name -> summary)."""
    out = []
    for name, summary in sharing.items():
        device = devices.get(name)
        sliced = isinstance(summary, dict) and summary.get("strategy") == TIME_SLICING
        if sliced and device is not None and device.mig is None:
            out.append(device.gpu.uuid)
    return out
