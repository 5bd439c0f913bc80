"""Settings and the config-manager's loop: label value → selected file → symlink → signal.

Log lines and their order are NVIDIA's config-manager's, so its users' log searches keep working.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kubegpu.configmanager.errors import ConfigManagerError
from kubegpu.configmanager.procsignal import signal_name, signal_process
from kubegpu.configmanager.selection import EMPTY_CONFIG, available_configs, select_config
from kubegpu.configmanager.symlink import update_symlink
from kubegpu.settings.choices import DEFAULT_NODE_LABEL, DEFAULT_PROCESS_TO_SIGNAL

log = logging.getLogger("kubegpu.configmanager")


@dataclass(frozen=True)
class Settings:
    """NVIDIA's flags (cmd/config-manager), plus where /proc is (tests use a fake one)."""

    node_name: str
    config_file_srcdir: str
    config_file_dst: str
    node_label: str = DEFAULT_NODE_LABEL
    default_config: str = ""
    fallback_strategies: tuple[str, ...] = ()
    oneshot: bool = False
    send_signal: bool = True
    signal: int = int(signal.SIGHUP)
    process_to_signal: str = DEFAULT_PROCESS_TO_SIGNAL
    proc_root: str = "/proc"

    def validate(self) -> None:
        """NVIDIA's checks and texts, in its order."""
        for flag, value in (
            ("node-name", self.node_name),
            ("node-label", self.node_label),
            ("config-file-srcdir", self.config_file_srcdir),
            ("config-file-dst", self.config_file_dst),
        ):
            if not value:
                raise ConfigManagerError(f"invalid <{flag}>: must not be empty string")


def update_config(label: str, settings: Settings) -> bool:
    """Apply one label value; True when the destination changed. Raises ConfigManagerError.

    A failure leaves the destination as it was, so the plugin keeps the config it runs with.
    """
    config = select_config(
        label,
        available_configs(settings.config_file_srcdir),
        settings.default_config,
        settings.fallback_strategies,
    )
    if config == EMPTY_CONFIG:
        log.info("Updating to empty config")
    else:
        log.info("Updating to config: %s", config)

    if not update_symlink(config, settings.config_file_srcdir, settings.config_file_dst):
        # Same file as before: the plugin already runs with it, a signal would only restart it for nothing.
        log.info("Already configured. Skipping update...")
        return False

    if config == EMPTY_CONFIG:
        log.info("Successfully updated to empty config")
    else:
        log.info("Successfully updated to config: %s", config)

    if settings.send_signal:
        log.info("Sending signal '%s' to '%s'", signal_name(settings.signal), settings.process_to_signal)
        signal_process(
            settings.process_to_signal,
            settings.signal,
            proc_root=settings.proc_root,
            exclude=(os.getpid(),),
        )
        log.info("Successfully sent signal")
    return True


def run(settings: Settings, labels: Iterable[str]) -> None:
    """Apply each label value as it comes; return after the first in oneshot mode or when `labels` ends.

    Raises ConfigManagerError on the first failure: like NVIDIA's, the sidecar then exits and is
    restarted by the kubelet, visibly, and retries from a fresh look at the label.
    """
    stream = iter(labels)
    try:
        for label in _announced(settings, stream):
            log.info("Label change detected: %s=%s", settings.node_label, label)
            update_config(label, settings)
            if settings.oneshot:
                return
    finally:
        # Closing the stream (a generator over an open watch) releases its HTTP connection now rather
        # than whenever garbage collection gets to it.
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _announced(settings: Settings, labels: Iterator[str]) -> Iterator[str]:
    """`labels`, logging NVIDIA's "Waiting for change" line before waiting for each."""
    while True:
        log.info("Waiting for change to '%s' label", settings.node_label)
        try:
            yield next(labels)
        except StopIteration:
            return
