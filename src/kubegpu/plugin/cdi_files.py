"""The CDI spec files on disk: written atomically when they change, removed when no longer served.

The CDI root, when we create it, is 0755 whatever the umask: the container runtime reads the specs (as
it reads /etc/cdi); the files themselves are 0644 (`write_atomic` sets their mode).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from kubegpu.allocation.cdi import Spec, spec_file_name
from kubegpu.common.dirs import ensure_dir
from kubegpu.common.files import write_atomic

log = logging.getLogger(__name__)

CDI_ROOT_MODE = 0o755


class CdiSpecWriter:
    """Keeps our spec files in the CDI root in line with the latest specs; removes only files it wrote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._written: set[str] = set()

    def path(self, device_class: str) -> Path:
        return self.root / spec_file_name(device_class)

    def refresh(self, specs: Mapping[str, Spec]) -> None:
        """Write `specs` (class -> spec); remove the files of classes no longer present."""
        if specs:
            ensure_dir(self.root, CDI_ROOT_MODE)
        for device_class, spec in specs.items():
            data = (json.dumps(spec, indent=2) + "\n").encode()
            if write_atomic(self.path(device_class), data, skip_unchanged=True):
                log.info("wrote CDI spec %s (%d devices)", self.path(device_class), len(spec["devices"]))
            self._written.add(device_class)
        for device_class in sorted(self._written - set(specs)):
            self._remove(device_class)

    def remove(self) -> None:
        for device_class in sorted(self._written):
            self._remove(device_class)

    def _remove(self, device_class: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(device_class).unlink()
            log.info("removed CDI spec %s", self.path(device_class))
        self._written.discard(device_class)
