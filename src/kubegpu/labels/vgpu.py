"""vGPU detection from PCI config space, as GFD does it: the `nvidia.com/vgpu.*` labels.

A vGPU guest sees NVIDIA PCI functions whose vendor-specific capability starts with the signature "VF";
its records carry the hypervisor's host driver version and branch.

Where GFD aborts labelling (a PCI device whose vendor or config cannot be read, a config space cut short
because the pod is not privileged, a vGPU capability without the driver record) this module logs a
warning and skips that device instead: one unreadable PCI function should not cost the node its labels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NVIDIA_VENDOR = "0x10de"
_STATUS = 0x06
_STATUS_CAPABILITY_LIST = 0x10
_CAPABILITY_POINTER = 0x34
_VENDOR_SPECIFIC = 0x09
_CHAIN_BROKEN = 0xFF
_FULL_CONFIG = 256  # an unprivileged read of sysfs `config` returns only the first 64 bytes
_VGPU_SIGNATURE = b"VF"
_RECORDS_START = 5  # first record of the vGPU capability
_HOST_DRIVER_RECORD = 0
_VERSION_LEN = 10
_BRANCH_LEN = 10


@dataclass(frozen=True, slots=True)
class VgpuInfo:
    address: str  # PCI address, e.g. "0000:00:05.0"
    host_driver_version: str  # e.g. "460.16"
    host_driver_branch: str  # e.g. "r460_00"


def vendor_capability(config: bytes) -> bytes | None:
    """The PCI vendor-specific capability in a config space, None when there is none."""
    if not config[_STATUS] & _STATUS_CAPABILITY_LIST:
        return None
    visited: set[int] = set()
    pos = config[_CAPABILITY_POINTER]
    while pos != 0 and pos + 2 < len(config):
        cap_id, next_pos, length = config[pos], config[pos + 1], config[pos + 2]
        if pos in visited or cap_id == _CHAIN_BROKEN:
            break  # a looped or broken chain
        if cap_id == _VENDOR_SPECIFIC:
            return config[pos : pos + length]
        visited.add(pos)
        pos = next_pos
    return None


def is_vgpu(capability: bytes) -> bool:
    return len(capability) >= _RECORDS_START and capability[3:5] == _VGPU_SIGNATURE


def host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) from the host driver record of a vGPU capability; None when it has none."""
    pos = _RECORDS_START
    while pos < len(capability) and capability[pos] != _HOST_DRIVER_RECORD:
        # each record: id, length (of the whole record), data; a zero length would never advance
        length = capability[pos + 1] if pos + 1 < len(capability) else 0
        if length == 0:
            return None
        pos += length
    start = pos + 2
    end = start + _VERSION_LEN + _BRANCH_LEN
    if end > len(capability):
        return None

    def text(raw: bytes) -> str:
        return raw.decode("latin-1").strip("\x00")  # Go's string(byte) per byte, trimmed of NULs

    return text(capability[start : start + _VERSION_LEN]), text(capability[start + _VERSION_LEN : end])


def _read_device(device: Path) -> VgpuInfo | None:
    try:
        vendor = (device / "vendor").read_text().strip()
    except (OSError, ValueError):
        return None  # not a PCI function we can identify; certainly not one of ours
    if vendor != NVIDIA_VENDOR:
        return None
    try:
        config = (device / "config").read_bytes()
    except OSError as err:
        log.warning("skipping PCI device %s for vGPU detection: cannot read its config: %s", device.name, err)
        return None
    if len(config) < _FULL_CONFIG:
        log.warning(
            "skipping PCI device %s for vGPU detection: only %d bytes of its PCI config are readable; "
            "run privileged to read all %d",
            device.name,
            len(config),
            _FULL_CONFIG,
        )
        return None
    capability = vendor_capability(config)
    if capability is None or not is_vgpu(capability):
        return None
    driver = host_driver(capability)
    if driver is None:
        log.warning("vGPU %s: no host driver version record in its vendor capability", device.name)
        return VgpuInfo(device.name, "", "")
    return VgpuInfo(device.name, *driver)


def find_vgpus(sysfs_root: Path) -> tuple[VgpuInfo, ...]:
    """vGPU functions under <sysfs_root>/bus/pci/devices, in address order."""
    root = sysfs_root / "bus" / "pci" / "devices"
    try:
        devices = sorted(root.iterdir())
    except OSError as err:
        log.debug("no PCI devices to check for vGPUs under %s: %s", root, err)
        return ()
    return tuple(info for info in map(_read_device, devices) if info is not None)
