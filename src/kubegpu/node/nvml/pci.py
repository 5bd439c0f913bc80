"""PCI addresses, NVML handle identity and event scope: the small facts real and fake NVML share."""

from __future__ import annotations

import ctypes
import re
from typing import Any

# The GPU/compute instance id NVML puts in an event (nvmlEventData_t.gpuInstanceId, .computeInstanceId)
# that concerns the whole GPU rather than one MIG instance.
WHOLE_GPU = 0xFFFFFFFF

_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$"
)


def parse_pci_bus_id(bus_id: str) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) of a PCI address in NVML ("00000000:3B:00.0") or sysfs form."""
    m = _BUS_ID.match(bus_id.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r} (expected e.g. 00000000:3B:00.0)")
    return (int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["device"], 16), int(m["function"]))


def sysfs_bus_id(bus_id: str) -> str:
    """The sysfs directory name of a PCI device: "00000000:3B:00.0" -> "0000:3b:00.0".

    NVIDIA's plugin strips a leading "0000" from NVML's 8-digit domain and lower-cases; parsing the
    domain gives the same name and also handles domains wider than 16 bits (e.g. VMD's 10000).
    """
    domain, bus, device, function = parse_pci_bus_id(bus_id)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def device_handle_id(handle: Any) -> int:
    """A stable number for an NVML device handle (its pointer value), equal for every copy of it.

    ctypes handles do not compare equal to each other, so use this to recognise the device an event
    (`eventData.device`) belongs to, even when the GPU is lost and its UUID can no longer be read.
    """
    value = ctypes.cast(handle, ctypes.c_void_p).value
    if value is None:
        raise ValueError("null NVML device handle")
    return value
