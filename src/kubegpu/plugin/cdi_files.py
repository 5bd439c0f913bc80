"""The CDI spec files on disk: written atomically when they change, removed when no longer served.

A refresh is all or nothing: when one spec cannot be written (a read-only or full CDI root), the specs it
already replaced are written back as they were and nothing is removed, so the runtime keeps finding every
name the servers still hand out.

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
        self._written: dict[str, bytes] = {}  # class -> the content we last wrote

    def path(self, device_class: str) -> Path:
        return self.root / spec_file_name(device_class)

    def refresh(self, specs: Mapping[str, Spec]) -> None:
        """Write `specs` (class -> spec); remove the files of classes no longer present.

        Raises OSError when a spec cannot be written, after putting back what this call had changed."""
        if specs:
            ensure_dir(self.root, CDI_ROOT_MODE)
        contents = {c: (json.dumps(spec, indent=2) + "\n").encode() for c, spec in specs.items()}
        replaced: list[str] = []
        try:
            for device_class, data in contents.items():
                if write_atomic(self.path(device_class), data, skip_unchanged=True):
                    replaced.append(device_class)
                    size = len(specs[device_class]["devices"])
                    log.info("wrote CDI spec %s (%d devices)", self.path(device_class), size)
        except OSError:
            self._restore(replaced)
            raise
        for device_class in sorted(self._written.keys() - contents.keys()):
            self._remove(device_class)
        self._written.update(contents)

    def _restore(self, replaced: list[str]) -> None:
        """Undo a refresh that failed part-way: old content back, files of new classes removed."""
        for device_class in replaced:
            path, before = self.path(device_class), self._written.get(device_class)
            try:
                if before is None:
                    path.unlink(missing_ok=True)
                else:
                    write_atomic(path, before)
            except OSError as err:
                log.error("cannot restore CDI spec %s after a failed refresh: %s", path, err)

    def remove(self) -> None:
        for device_class in sorted(self._written):
            self._remove(device_class)

    def _remove(self, device_class: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(device_class).unlink()
            log.info("removed CDI spec %s", self.path(device_class))
        self._written.pop(device_class, None)
