"""Pointing the plugin's config file (a symlink) at the selected config, atomically."""

from __future__ import annotations

import contextlib
import os
import secrets

from kubegpu.configmanager.errors import ConfigManagerError, go_os_error
from kubegpu.configmanager.selection import EMPTY_CONFIG

DEV_NULL = "/dev/null"


def link_target(config: str, srcdir: str) -> str:
    """What the destination points at: the file in `srcdir`, or /dev/null for the empty config.

    The link names `srcdir/<config>` rather than its resolved path so that when the ConfigMap's content
    changes (the kubelet swaps its `..data` link), the plugin reads the new content through the same link.
    """
    return DEV_NULL if config == EMPTY_CONFIG else os.path.join(srcdir, config)


def update_symlink(config: str, srcdir: str, dst: str) -> bool:
    """Make `dst` a symlink to the selected config; False when it already leads there (nothing done).

    "Already leads there" compares fully resolved paths, as NVIDIA does, so a destination that reaches
    the same file through other links counts as configured. Works with a dangling destination or target.
    """
    target = link_target(config, srcdir)
    if os.path.lexists(dst) and os.path.realpath(target) == os.path.realpath(dst):
        return False

    # NVIDIA removes the old link, then creates the new one; a plugin reloading in between (on its own
    # file watch, or a signal from an earlier change) would find no config. A temporary link renamed over
    # the destination replaces it in one step: readers see the old file or the new one, never none.
    # The temporary lives next to `dst` because rename(2) is atomic only within one file system.
    tmp = os.path.join(
        os.path.dirname(dst) or ".", f".{os.path.basename(dst)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    )
    try:
        os.symlink(target, tmp)
    except OSError as err:
        raise ConfigManagerError(f"error creating symlink: {go_os_error('symlink', err)}") from err
    try:
        os.replace(tmp, dst)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ConfigManagerError(f"error creating symlink: {go_os_error('rename', err)}") from err
    return True
