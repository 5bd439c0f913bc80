"""Which NVML the plugin talks to: the real one (nvidia-ml-py) or the fake one driven by a node profile.

`load_nvml()` picks by environment:

- `KUBEGPU_FAKE_NVML=<profile name or path to a .yaml profile>` selects the fake (see `fake.py`);
  `KUBEGPU_FAKE_NVML_STATE=<dir>` shares its faults and events with `kubegpu fake-nvml inject`.
- otherwise the real `pynvml` module. Importing it never fails; without libnvidia-ml.so.1 its
  `nvmlInit()` raises `NVMLError_LibraryNotFound`, which discovery explains to the user.

Both expose the same functions, constants and `NVMLError` classes, so callers do not know which they got.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kubegpu.node.nvml.fake_state import STATE_ENV

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

    Raises `kubegpu.node.nvml.fake_profile.ProfileError` when the fake's profile is unknown or invalid.
    """
    env = os.environ if env is None else env
    profile = env.get(FAKE_ENV, "").strip()
    if profile:
        from kubegpu.node.nvml.fake import FakeNvml

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
