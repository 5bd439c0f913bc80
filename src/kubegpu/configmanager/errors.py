"""The one error type of the config-manager, and Go-style renderings of OS errors for NVIDIA's texts."""

from __future__ import annotations


class ConfigManagerError(Exception):
    """A failure that ends the config-manager with exit code 1, as NVIDIA's does.

    The message is NVIDIA's text. Exiting is deliberate: the sidecar restarts (and is visible as
    restarting) while the plugin keeps running with the config it had.
    """


def go_os_error(op: str, err: OSError) -> str:
    """`op path: reason` the way Go's *PathError and *LinkError print, e.g.
    `open /x: no such file or directory` or `rename /a /b: is a directory`.

    NVIDIA's messages embed Go errors; rendering ours the same way keeps log searches and alerts that
    match on them working.
    """
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    if not paths:
        return go_errno(err)
    return f"{op} {' '.join(paths)}: {go_errno(err)}"


def go_errno(err: OSError) -> str:
    """Just the reason, lower-case like Go's syscall.Errno (`no such process`)."""
    reason = err.strerror or str(err)
    return reason[:1].lower() + reason[1:]
