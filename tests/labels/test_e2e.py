"""`kubegpu labels` as a process on a fake NVML node: oneshot to a file, interval mode until SIGTERM."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubegpu.apisim import ApiServerSim
from kubegpu.cli.main import main
from kubegpu.settings.table import FAKE_NVML_ENV as FAKE_ENV


def command() -> list[str]:
    """`python -m kubegpu labels`; `python -m kubegpu.labels` until the subcommand is registered."""
    if "labels" in main.lazy_commands:
        return [sys.executable, "-m", "kubegpu", "labels"]
    return [sys.executable, "-m", "kubegpu.labels"]


# GFD's env vars without the GFD_ prefix, which a developer's shell may hold for other reasons
UNPREFIXED = (
    "CONFIG_FILE",
    "MIG_STRATEGY",
    "USE_NODE_FEATURE_API",
    "DEVICE_DISCOVERY_STRATEGY",
    "NODE_NAME",
    "NAMESPACE",
    "POD_NAME",
)


def environment(profile: str, **extra: str) -> dict[str, str]:
    """The fake NVML node, writing the features.d file (--use-node-feature-api=false) unless `extra` says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GFD_", "KUBEGPU_"))}
    for name in (*UNPREFIXED, "KUBECONFIG"):
        env.pop(name, None)
    return {**env, FAKE_ENV: profile, "GFD_USE_NODE_FEATURE_API": "false", **extra}


@pytest.fixture
def machine_file(tmp_path: Path) -> Path:
    path = tmp_path / "product_name"
    path.write_text("PowerEdge R750xa\n")
    return path


def read_labels(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_oneshot_writes_the_features_file(tmp_path: Path, machine_file: Path) -> None:
    out = tmp_path / "features.d" / "gfd"
    started = int(time.time())
    result = subprocess.run(
        [*command(), "--oneshot", "-o", str(out), "--machine-type-file", str(machine_file)],
        env=environment("t4-pcie", GFD_MIG_STRATEGY="single"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    labels = read_labels(out)
    assert started <= int(labels.pop("nvidia.com/gfd.timestamp")) <= time.time()
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.machine"] == "PowerEdge-R750xa"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert len(labels) == 26
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_stdout_and_nvml_failure(tmp_path: Path, machine_file: Path) -> None:
    printed = subprocess.run(
        [*command(), "--oneshot", "--no-timestamp", "-o", "-", "--machine-type-file", str(machine_file)],
        env=environment("dgx1-volta"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert printed.returncode == 0, printed.stderr
    assert "nvidia.com/gpu.product=Tesla-V100-SXM2-16GB\n" in printed.stdout
    assert "gfd.timestamp" not in printed.stdout

    failed = subprocess.run(
        [*command(), "--oneshot", "-o", str(tmp_path / "gfd")],
        env=environment("no-driver"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert failed.returncode == 1
    assert "failed to initialize NVML: The NVIDIA kernel driver isn't loaded" in failed.stderr
    assert not (tmp_path / "gfd").exists()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_interval_mode_reloads_on_sighup_and_removes_the_file_on_sigterm(
    tmp_path: Path, machine_file: Path
) -> None:
    out = tmp_path / "features.d" / "gfd"
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: none\n")
    process = subprocess.Popen(
        [*command(), "-o", str(out), "--sleep-interval", "50ms", "--machine-type-file", str(machine_file)],
        env=environment("a100-mig", GFD_CONFIG_FILE=str(config)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(out.exists)
        first = out.stat().st_ino
        wait_for(lambda: out.exists() and out.stat().st_ino != first)  # relabelled on the interval
        assert "nvidia.com/mig.strategy" not in read_labels(out)

        config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: read_labels(out).get("nvidia.com/mig.strategy") == "mixed")
        assert read_labels(out)["nvidia.com/mig-3g.20gb.count"] == "3"

        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "Received SIGHUP, reloading the config." in stderr
    assert "Received signal SIGTERM, shutting down." in stderr
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # gfd-tmp went too


# ------------------------------------------------------------- the NodeFeature API (GFD's default output)


def node_feature_env(kubeconfig: Path, **extra: str) -> dict[str, str]:
    """What the chart gives the labels container: the node and namespace from the downward API."""
    env = environment("t4-pcie", KUBECONFIG=str(kubeconfig), NODE_NAME="gpu-node-7", NAMESPACE="kube-system")
    del env["GFD_USE_NODE_FEATURE_API"]  # the default: true
    return {**env, **extra}


def test_oneshot_publishes_the_node_feature_object(tmp_path: Path, machine_file: Path) -> None:
    with ApiServerSim() as api:
        result = subprocess.run(
            [*command(), "--oneshot", "--no-timestamp", "--machine-type-file", str(machine_file)],
            env=node_feature_env(api.write_kubeconfig(tmp_path / "kubeconfig")),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        obj = api.get("nodefeatures", "nvidia-features-for-gpu-node-7", namespace="kube-system")
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "gpu-node-7"}
    labels = obj["spec"]["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == ("Tesla-T4", "4")
    assert len(labels) == 25  # the file's 26 without the timestamp
    assert not (tmp_path / "features.d").exists()


def test_interval_mode_keeps_the_object_after_sigterm(tmp_path: Path, machine_file: Path) -> None:
    with ApiServerSim() as api:
        process = subprocess.Popen(
            [*command(), "--sleep-interval", "50ms", "--machine-type-file", str(machine_file)],
            env=node_feature_env(api.write_kubeconfig(tmp_path / "kubeconfig")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            api.wait_for(lambda: len([c for c in api.calls if "/nodefeatures/" in c.path]) >= 4, timeout=20)
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=10)
        finally:
            process.kill()
        writes = [c.method for c in api.calls if "/nodefeatures" in c.path and c.method != "GET"]
        kept = api.get("nodefeatures", "nvidia-features-for-gpu-node-7", namespace="kube-system")
    assert process.returncode == 0, stderr
    assert writes == ["POST"]  # the labels did not change between passes: written once
    assert kept["spec"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert "Received signal SIGTERM, shutting down." in stderr


def test_no_crd_exits_1_with_one_line(tmp_path: Path) -> None:
    with ApiServerSim(node_feature_crd=False) as api:
        result = subprocess.run(
            [*command(), "--oneshot"],
            env=node_feature_env(api.write_kubeconfig(tmp_path / "kubeconfig")),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert line.endswith(
        "does not serve nodefeatures.nfd.k8s-sigs.io/v1alpha1 (404 Not Found: the server could not find "
        "the requested resource): NFD's NodeFeature CRD is not installed; install Node Feature Discovery "
        "v0.14 or later (its CRDs), or set --use-node-feature-api=false (USE_NODE_FEATURE_API=false) to "
        "write NFD's features.d file"
    )


def test_an_unknown_discovery_strategy_stops_the_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [*command(), "--oneshot", "-o", str(tmp_path / "gfd")],
        env=environment("t4-pcie", DEVICE_DISCOVERY_STRATEGY="magic"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert (
        "unable to load config: unable to validate flags: invalid --device-discovery-strategy option magic\n"
        in result.stderr
    )
    assert not (tmp_path / "gfd").exists()
