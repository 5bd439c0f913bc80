"""The host's files as the node doctor reads them: under --host-root, named as the host sees them."""

from __future__ import annotations

from pathlib import Path


def under(root: Path, rel: str) -> Path:
    """`rel` (a host path, with or without its leading slash) under the host root."""
    return root / rel.lstrip("/") if rel else root


def shown(path: Path, root: Path) -> str:
    """The path as it is on the host, whatever root it was read under."""
    try:
        return "/" + str(path.relative_to(root)).lstrip("./")
    except ValueError:
        return str(path)
