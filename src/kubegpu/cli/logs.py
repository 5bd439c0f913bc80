"""Logging set-up shared by kubegpu's long-running commands."""

from __future__ import annotations

import logging
import sys


def setup_logging(verbose: bool = False) -> None:
    """One line per record: time, level, component, message (NVIDIA's plugin logs the same way, via klog)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
