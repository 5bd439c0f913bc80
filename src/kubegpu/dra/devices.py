"""The node's GPUs as DRA devices, named and described as NVIDIA's DRA driver (gpu.nvidia.com) publishes them.

A full GPU is `gpu-<minor>`; a GPU in MIG mode publishes its static MIG devices instead, each named
`gpu-<parent minor>-mig-<profile without dots, RFC 1123>-<GPU instance profile ID>-<placement start>`.
Attribute names and types are NVIDIA's, so CEL selectors written for NVIDIA's driver carry over: `type`,
`uuid`, `productName`, `brand`, `architecture` (strings), `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion` (semantic versions), `resource.kubernetes.io/pciBusID` and `pcieRoot`; a MIG device adds
`parentUUID` and `profile`. `index` and `minor` are not published (NVIDIA dropped them: neither is stable).
Capacities are BinarySI quantities as apimachinery prints them. An unhealthy GPU carries NVIDIA's taint
(`<driver>/xid` with the XID as value, `<driver>/gpu-lost`) on itself and on its MIG devices.

The output is v1 `Device` JSON (no v1beta1 `basic` wrapper); the slice publisher converts for older servers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kubegpu.common.log_throttle import LogThrottle
from kubegpu.common.quantity import canonical
from kubegpu.node.inventory import Gpu, Health, Inventory, MigDevice, MigEngines
from kubegpu.settings.dra_selection import GpuSelection

log = logging.getLogger(__name__)
# The device table is built at every publish and health report; a GPU's state it warns about stays until
# the GPU changes, so once per GPU every 10 minutes says it without burying the log.
_gpu_warnings = LogThrottle(log, interval_s=600.0)

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

_SEMVER = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One published device and what Prepare needs of it: the GPU it lives on and, for MIG, the MIG device."""

    name: str
    gpu: Gpu
    mig: MigDevice | None = None
    # A DynamicMIG partition (`dra.partitions`): a MIG device Prepare creates; `mig` is set once it exists.
    dynamic: bool = False

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid

    @property
    def kind(self) -> str:
        return "mig" if self.mig or self.dynamic else "gpu"

    @property
    def health(self) -> Health:
        return self.mig.health if self.mig else self.gpu.health


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}"


def mig_device_name(gpu: Gpu, mig: MigDevice) -> str | None:
    """NVIDIA's canonical MIG name; None when NVML did not tell the GPU instance's profile ID or placement."""
    if mig.gi_profile_id is None or mig.placement_start is None:
        return None
    profile = _rfc1123(mig.profile.replace(".", ""))
    return f"gpu-{gpu.minor}-mig-{profile}-{mig.gi_profile_id}-{mig.placement_start}"


def _rfc1123(name: str) -> str:
    name = re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-")
    return name.removesuffix(".")[:253]


def device_table(
    inventory: Inventory, selection: GpuSelection, partitioned: Collection[str] = ()
) -> dict[str, DraDevice]:
    """The devices this node publishes, by name, in slice order (GPUs by minor, MIG devices by name).

    `partitioned`: the UUIDs of the GPUs DynamicMIG publishes as partitions instead (`DynamicMig.table`),
    left out here: a partitioned GPU without MIG devices is not one of which nothing is published."""
    out: dict[str, DraDevice] = {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.minor):
        if not selection.includes(gpu) or gpu.minor < 0 or gpu.uuid in partitioned:
            continue
        if not gpu.mig_enabled:
            out[gpu_device_name(gpu)] = DraDevice(gpu_device_name(gpu), gpu)
            continue
        named = []
        for mig in gpu.mig_devices:
            name = mig_device_name(gpu, mig)
            if name is None:
                log.warning(
                    "leaving MIG device %s out of DRA: NVML did not tell its profile or placement", mig.uuid
                )
                continue
            named.append(DraDevice(name, gpu, mig))
        if not named:
            _gpu_warnings.log(
                logging.WARNING,
                gpu.uuid,
                "GPU %s is in MIG mode without MIG devices: nothing of it is published",
                gpu_device_name(gpu),
            )
        for device in sorted(named, key=lambda d: d.name):
            out.setdefault(device.name, device)  # two CIs of one GI share a name: the GI is the unit
    return out


def device_entries(
    inventory: Inventory, selection: GpuSelection, *, driver_name: str = DEFAULT_DRIVER_NAME
) -> list[dict[str, Any]]:
    """v1 `Device` dicts for the ResourceSlice, with taints on unhealthy devices."""
    return [device_entry(d, inventory, driver_name) for d in device_table(inventory, selection).values()]


def device_entry(
    device: DraDevice, inventory: Inventory, driver_name: str = DEFAULT_DRIVER_NAME
) -> dict[str, Any]:
    attributes = gpu_attributes(device.gpu, inventory)
    if device.mig is None:
        attributes = {"type": {"string": "gpu"}, "uuid": {"string": device.gpu.uuid}, **attributes}
        capacity = {"memory": _quantity(device.gpu.memory_bytes)}
    else:
        attributes = {
            "type": {"string": "mig"},
            "uuid": {"string": device.mig.uuid},
            "parentUUID": {"string": device.gpu.uuid},
            "profile": {"string": device.mig.profile},
            **attributes,
        }
        capacity = _mig_capacity(device.mig)
    entry: dict[str, Any] = {"name": device.name, "attributes": attributes, "capacity": capacity}
    taint = health_taint(device.health, driver_name)
    if taint is not None:
        entry["taints"] = [taint]
    return entry


def health_taint(health: Health, driver_name: str = DEFAULT_DRIVER_NAME) -> dict[str, str] | None:
    """NVIDIA's device taint for an unhealthy device: `<driver>/xid` (value: the XID) for a critical XID,
    else `<driver>/gpu-lost`; both NoSchedule. None when healthy."""
    if health.healthy:
        return None
    if health.xid is not None:
        return {"key": f"{driver_name}/xid", "value": str(health.xid), "effect": "NoSchedule"}
    return {"key": f"{driver_name}/gpu-lost", "effect": "NoSchedule"}


def gpu_attributes(gpu: Gpu, inventory: Inventory) -> dict[str, dict[str, Any]]:
    """The attributes a MIG device shares with its parent GPU, in NVIDIA's order."""
    attrs: dict[str, dict[str, Any]] = {
        "productName": {"string": gpu.name},
        "brand": {"string": gpu.brand or "Unknown"},
        "architecture": {"string": gpu.architecture or "Unknown"},
    }
    versions = {
        "cudaComputeCapability": "{}.{}".format(*gpu.compute_capability),
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
    }
    for name, text in versions.items():
        version = semver(text)
        if version is not None:
            attrs[name] = {"version": version}
    if gpu.pci_bus_id:
        attrs[PCI_BUS_ID] = {"string": pci_bus_id(gpu.pci_bus_id)}
    if gpu.pcie_root:
        attrs[PCIE_ROOT] = {"string": gpu.pcie_root}
    return attrs


def semver(text: str) -> str | None:
    """A dotted version as Masterminds/semver prints it (missing parts 0, leading zeros dropped):
    "8.0" -> "8.0.0", "550.90.07" -> "550.90.7". None for anything else (the attribute is left out)."""
    match = _SEMVER.match(text.strip())
    if match is None:
        return None
    return ".".join(str(int(part or 0)) for part in match.groups())


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" as go-nvlib and the PCI attribute write it: "0000:3b:00.0"."""
    text = nvml_bus_id.lower()
    return text[4:] if len(text) > 12 and text.startswith("0000") else text


def engine_capacities(engines: MigEngines) -> dict[str, int]:
    """A MIG device's engines under NVIDIA's capacity names."""
    return {
        "multiprocessors": engines.multiprocessors,
        "copyEngines": engines.copy_engines,
        "decoders": engines.decoders,
        "encoders": engines.encoders,
        "jpegEngines": engines.jpegs,
        "ofaEngines": engines.ofas,
    }


def _mig_capacity(mig: MigDevice) -> dict[str, dict[str, str]]:
    engines = mig.engines
    capacity: dict[str, dict[str, str]] = {}
    if engines is not None:
        capacity = {name: _quantity(value) for name, value in engine_capacities(engines).items()}
    capacity["memory"] = _quantity(mig.memory_bytes)
    start = mig.placement_start or 0
    for index in range(start, start + mig.placement_size):
        capacity[f"memorySlice{index}"] = _quantity(1)
    return capacity


def _quantity(amount: int) -> dict[str, str]:
    """{"value": <a BinarySI quantity as apimachinery prints it>}: 42949672960 -> "40Gi", 14 -> "14"."""
    return {"value": binary_si(amount)}


def binary_si(amount: int) -> str:
    """`resource.NewQuantity(amount, BinarySI).String()`: below 1024 printed as decimal SI ("1k" for 1000)."""
    if abs(amount) < 1024:
        return canonical(str(amount))
    suffixes = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    shift = 0
    while abs(amount) >= 1024 and amount % 1024 == 0 and shift < len(suffixes) - 1:
        amount, shift = amount // 1024, shift + 1
    return f"{amount}{suffixes[shift]}"
