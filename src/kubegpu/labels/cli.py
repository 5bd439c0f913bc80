"""`kubegpu labels`: NVIDIA GPU Feature Discovery's labels, with GFD's flags and env vars."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import given_values, setting_options
from kubegpu.labels.loop import SignalWaiter, serve
from kubegpu.labels.settings import LabelSettings, resolve_settings
from kubegpu.node.nvml.backend import NvmlBackend, load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.settings.given import FlagValue
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import LABELS

log = logging.getLogger("kubegpu.labels")


@click.command("labels", context_settings={"max_content_width": 110})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@setting_options(LABELS)
def labels(verbose: bool, **params: Any) -> None:
    """Label this node as NVIDIA's GPU Feature Discovery does (nvidia.com/gpu.product, gpu.count, ...).

    Publishes the labels as this node's NodeFeature object (nfd.k8s-sigs.io/v1alpha1
    nvidia-features-for-<node> in --namespace, needing NODE_NAME), which Node Feature Discovery turns into
    node labels; with --use-node-feature-api=false, writes NFD's features.d file (or stdout) instead and
    removes it on exit. Once (--oneshot) or every --sleep-interval; SIGHUP reloads the config file. Flags,
    env vars and the config file are GFD's (k8s-device-plugin v0.20): a flag beats its env var, which beats
    the config file, which beats the default.
    """
    setup_logging(verbose)
    try:
        given: dict[str, FlagValue] = given_values(params, LABELS)
    except ConfigError as err:
        log.error("%s", err)
        sys.exit(1)
    selection = NvmlSelection.from_given(given, LABELS)

    def load_settings() -> LabelSettings:
        return resolve_settings(given)

    def load_backend() -> NvmlBackend:
        return load_nvml(selection)

    waiter = SignalWaiter().install()
    try:
        code = serve(load_settings, waiter, load_backend=load_backend)
    finally:
        waiter.restore()
    log.info("Exiting")
    sys.exit(code)
