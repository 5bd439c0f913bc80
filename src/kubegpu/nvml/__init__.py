"""Which NVML the plugin talks to: the real one (nvidia-ml-py) or the fake one driven by a node profile.

`load_nvml()` picks by environment:

- `KUBEGPU_FAKE_NVML=<profile name or path to a .yaml profile>` selects the fake (see `fake.py`);
  `KUBEGPU_FAKE_NVML_STATE=<dir>` shares its faults and events with `kubegpu fake-nvml inject`.
- otherwise the real `pynvml` module. Importing it never fails; without libnvidia-ml.so.1 its
  `nvmlInit()` raises `NVMLError_LibraryNotFound`, which discovery explains to the user.

Both expose the same functions, constants and `NVMLError` classes, so callers do not know which they got.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kubegpu.nvml.state import STATE_ENV

FAKE_ENV = "KUBEGPU_FAKE_NVML"
SYSFS_ENV = "KUBEGPU_SYSFS_ROOT"

# The pynvml module or a FakeNvml: the same function names, signatures, constants and errors.
NvmlApi = Any


@dataclass(frozen=True, slots=True)
class NvmlBackend:
    """The NVML to call and where to read sysfs for it."""

    nvml: NvmlApi
    sysfs_root: Path
    is_fake: bool
    description: str


def load_nvml(env: Mapping[str, str] | None = None) -> NvmlBackend:
    """The NVML selected by the environment (`os.environ` when `env` is None). Does not call nvmlInit.

    Raises `kubegpu.nvml.fake.ProfileError` when the fake's profile is unknown or invalid.
    """
    env = os.environ if env is None else env
    profile = env.get(FAKE_ENV, "").strip()
    if profile:
        from kubegpu.nvml.fake import FakeNvml

        state = env.get(STATE_ENV, "").strip()
        fake = FakeNvml.from_profile(profile, state_dir=Path(state) if state else None)
        return NvmlBackend(fake, fake.sysfs_root, is_fake=True, description=fake.description)

    import pynvml

    return NvmlBackend(
        pynvml,
        Path(env.get(SYSFS_ENV, "").strip() or "/sys"),
        is_fake=False,
        description=f"NVML (libnvidia-ml.so.1) via nvidia-ml-py {metadata.version('nvidia-ml-py')}",
    )


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
