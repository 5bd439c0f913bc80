"""Which NVML the plugin talks to: the real one (nvidia-ml-py) or the fake one driven by a node profile.

`load_nvml(selection)` picks by the settings (`kubegpu.settings.env.NvmlSelection`, which the commands read
from the environment at start):

- a fake profile (`KUBEGPU_FAKE_NVML=<profile name or path to a .yaml profile>`) selects the fake (see
  `fake.py`); its state directory (`KUBEGPU_FAKE_NVML_STATE=<dir>`) shares its faults and events with
  `kubegpu fake-nvml inject`.
- otherwise the real `pynvml` module. Importing it never fails; without libnvidia-ml.so.1 its
  `nvmlInit()` raises `NVMLError_LibraryNotFound`, which discovery explains to the user.

Both expose the same functions, constants and `NVMLError` classes, so callers do not know which they got.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubegpu.settings.env import NvmlSelection

# The pynvml module or a FakeNvml: the same function names, signatures, constants and errors. Left
# untyped for callers; typings/pynvml.pyi declares that surface and tests/node/test_pynvml_stub.py checks
# it against pynvml, the fake against it, and that the code uses nothing it does not declare.
NvmlApi = Any


@dataclass(frozen=True, slots=True)
class NvmlBackend:
    """The NVML to call and where to read sysfs for it."""

    nvml: NvmlApi
    sysfs_root: Path
    is_fake: bool
    description: str


def load_nvml(selection: NvmlSelection | None = None) -> NvmlBackend:
    """The selected NVML (the real one when `selection` is None). Does not call nvmlInit.

    Raises `kubegpu.node.nvml.fake_profile.ProfileError` when the fake's profile is unknown or invalid.
    """
    selection = selection or NvmlSelection()
    if selection.fake_profile:
        from kubegpu.node.nvml.fake import FakeNvml

        fake = FakeNvml.from_profile(selection.fake_profile, state_dir=selection.fake_state)
        return NvmlBackend(fake, fake.sysfs_root, is_fake=True, description=fake.description)

    import pynvml

    return NvmlBackend(
        pynvml,
        selection.sysfs_root,
        is_fake=False,
        description=f"NVML (libnvidia-ml.so.1) via nvidia-ml-py {_binding_version(pynvml.__file__)}",
    )


def _binding_version(module_file: str | None) -> str:
    """nvidia-ml-py's version from its dist-info folder next to the module. importlib.metadata would say
    the same but pulls email, zipfile and csv into the daemon (about 1 MB resident) for this one string."""
    if module_file:
        for info in sorted(Path(module_file).parent.glob("nvidia_ml_py-*.dist-info")):
            return info.name.removeprefix("nvidia_ml_py-").removesuffix(".dist-info")
    return "(version unknown)"
