"""`kubegpu dra`: the DRA driver daemon's command."""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from kubegpu.cli.logs import setup_logging
from kubegpu.cli.params import given_values, setting_options
from kubegpu.common.unix_socket import socket_path_problem
from kubegpu.settings.dra_driver import driver_flags
from kubegpu.settings.dra_selection import parse_gpu_selection
from kubegpu.settings.given import value_of
from kubegpu.settings.kubeconfig import KubeconfigError
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import DRA
from kubegpu.settings.table import lookup

log = logging.getLogger("kubegpu")


@click.command("dra")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@setting_options(DRA)
def dra_cmd(verbose: bool, **params: Any) -> None:
    """Run the DRA driver on this node: the node's GPUs through Dynamic Resource Allocation (resource.k8s.io),
    as a drop-in for NVIDIA's DRA driver (driver gpu.nvidia.com, its flags and env vars).

    It registers with the kubelet's plugin watcher, publishes the GPUs (and static MIG devices) as
    ResourceSlices, prepares allocated claims (per-claim CDI specs, sharing from the claim's GpuConfig) and
    taints devices with a critical XID or lost, until recovery clears them.
    """
    setup_logging(verbose)
    try:
        given = given_values(params, DRA)
        settings = _settings(given)
    except (ConfigError, ValueError) as err:
        log.error("%s", err)
        sys.exit(1)

    from kubegpu.dra.daemon import DraDaemon, StartupError
    from kubegpu.dra.kubeapi import KubeClient
    from kubegpu.node.health import HealthSettings
    from kubegpu.node.nvml.backend import load_nvml
    from kubegpu.node.xids import XidCatalogError
    from kubegpu.settings.env import DaemonEnv, NvmlSelection
    from kubegpu.settings.kubeaccess import load_access

    try:
        api = KubeClient(load_access(settings.kubeconfig))
    except KubeconfigError as err:
        where = settings.kubeconfig or "the in-cluster config"
        log.error(
            "cannot load %s: %s; set --kubeconfig (KUBECONFIG) to a kubeconfig file, or run in a pod whose "
            "service account may read resourceclaims and write resourceslices",
            where,
            err,
        )
        sys.exit(1)
    try:
        env = DaemonEnv.from_given(given)
        # NVIDIA's --additional-xids-to-ignore adds to DP_DISABLE_HEALTHCHECKS's XIDs.
        skipped = env.disable_healthchecks
        ignored = replace(skipped, ids=skipped.ids | settings.driver.xids_to_ignore)
        health = HealthSettings.from_settings(replace(env, disable_healthchecks=ignored))
        nvml = load_nvml(NvmlSelection.from_given(given, DRA))
    except (XidCatalogError, ConfigError, ValueError) as err:
        log.error("%s", err)
        sys.exit(1)
    try:
        code = asyncio.run(DraDaemon(settings, nvml, health, api).run())
    except StartupError as err:
        log.error("%s", err)
        sys.exit(1)
    except OSError as err:  # a socket or directory that cannot be created (paths, permissions)
        log.error(
            "cannot start: %s (%s); check --kubelet-registrar-directory-path, "
            "--kubelet-plugins-directory-path and --cdi-root, and that the driver runs as root with the "
            "kubelet's directories mounted",
            err.strerror or err,
            err.filename or "no file",
        )
        sys.exit(1)
    sys.exit(code)


def _settings(given: dict[str, Any]) -> Any:
    from kubegpu.dra.daemon import DraSettings
    from kubegpu.dra.metrics_server import check_path, parse_endpoint

    def value(name: str) -> Any:
        return value_of(given, lookup(DRA, name))

    node_name = str(value("node-name")).strip()
    if not node_name:
        raise ConfigError(
            "--node-name (NODE_NAME) is required: set it to this node's name (the downward API's "
            "spec.nodeName)"
        )
    gpus = str(value("gpus"))
    try:
        selection = parse_gpu_selection(gpus)
    except ValueError as err:
        raise ConfigError(f"invalid --gpus (KUBEGPU_DRA_GPUS): {err}") from None
    http_endpoint = str(value("http-endpoint")).strip()
    metrics_path = str(value("metrics-path"))
    try:
        if http_endpoint:
            parse_endpoint(http_endpoint)
        check_path(metrics_path)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    driver = driver_flags(given)
    for warning in driver.warnings:
        log.warning("%s", warning)
    log.info("feature gates: %s", driver.gates.text())
    driver_name = str(value("driver-name")).strip()
    _check_sockets(
        driver_name, value("kubelet-plugins-directory-path"), value("kubelet-registrar-directory-path")
    )
    return DraSettings(
        driver=driver,
        node_name=node_name,
        driver_name=driver_name,
        selection=selection,
        cdi_root=value("cdi-root"),
        registrar_dir=value("kubelet-registrar-directory-path"),
        plugins_dir=value("kubelet-plugins-directory-path"),
        kubeconfig=str(value("kubeconfig")),
        lock_timeout=float(value("lock-timeout")),
        api_timeout=float(value("api-timeout")),
        boot_id_file=value("boot-id-file"),
        http_endpoint=http_endpoint,
        metrics_path=metrics_path,
    )


def _check_sockets(driver_name: str, plugins_dir: Path, registrar_dir: Path) -> None:
    """The driver's two sockets (service.py's names) must fit a unix socket's path, or gRPC fails on every
    attempt to bind them. Raises ConfigError, one line per directory."""
    from kubegpu.dra.service import dra_socket, registration_socket

    checks = (
        ("--kubelet-plugins-directory-path (KUBELET_PLUGINS_DIRECTORY_PATH)", plugins_dir, dra_socket),
        (
            "--kubelet-registrar-directory-path (KUBELET_REGISTRAR_DIRECTORY_PATH)",
            registrar_dir,
            registration_socket,
        ),
    )
    problems = [
        socket_path_problem(
            setting, str(directory), str(socket(directory, driver_name)), "the driver's socket in it"
        )
        for setting, directory, socket in checks
    ]
    if found := [p for p in problems if p]:
        raise ConfigError("; ".join(found), found)
