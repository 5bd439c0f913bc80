"""`kubegpu config check` as an SRE runs it before rolling out a ConfigMap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TIME_SLICED = """
version: v1
flags:
  renameByDefault: true
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    import os

    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "config", "check", *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(TIME_SLICED)
    return path


def test_resources_device_ids_and_warnings(config: Path) -> None:
    code, report = run(str(config), "--profile", "t4-pcie")
    assert code == 0 and report["errors"] == []
    (name,) = report["resources"]
    assert name == "nvidia.com/gpu.shared" and len(report["resources"][name]) == 16
    assert report["resources"][name][0].endswith("::0")
    assert any(
        "flags.renameByDefault" in w and "sharing.timeSlicing.renameByDefault" in w
        for w in report["warnings"]
    )


def test_env_applies_with_the_daemons_precedence(config: Path) -> None:
    code, report = run(str(config), "--profile", "a100-mig", env={"MIG_STRATEGY": "mixed"})
    assert code == 0
    assert "nvidia.com/mig-1g.5gb" in report["resources"]
    code, report = run(
        str(config), "--profile", "a100-mig", "--mig-strategy", "single", env={"MIG_STRATEGY": "mixed"}
    )
    assert code == 1
    assert report["errors"] == [
        "error building device map from config.resources: invalid MIG configuration: error visiting devices: "
        "error visiting device: error visiting device: error visiting MIG device: error visiting MIG device: "
        "more than one MIG device type present on node"
    ]


def test_every_error_with_its_field_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n    - {replicas: 2}\n"
    )
    code, report = run(str(bad), "--profile", "t4-pcie")
    assert code == 1 and report["resources"] == {}
    assert len(report["errors"]) == 2
    assert report["errors"][0].startswith("sharing.timeSlicing.resources.0: number of replicas must be >= 2")
    assert report["errors"][1].startswith("sharing.timeSlicing.resources.1: no resource name specified")


def test_no_gpu_here_says_how_to_check_anyway(config: Path) -> None:
    code, report = run(str(config), "--profile", "no-driver")
    assert code == 1 and "Use --profile" in report["errors"][0]


def test_shows_the_settings_outside_the_file_and_where_each_came_from(config: Path) -> None:
    code, report = run(
        str(config),
        "--profile",
        "t4-pcie",
        "--http-port",
        "8080",
        env={"KUBEGPU_HEALTH_PROBE_SECONDS": "2.5", "KUBEGPU_CDI_ROOT": ""},
    )
    assert code == 0
    settings = {s["name"]: s for s in report["settings"]}
    assert settings["health-probe-seconds"] == {
        "name": "health-probe-seconds",
        "flag": None,
        "env": ["KUBEGPU_HEALTH_PROBE_SECONDS"],
        "value": "2.5",
        "source": "env",
        "origin": "KUBEGPU_HEALTH_PROBE_SECONDS",
        "owner": "kubegpu",
    }
    assert (settings["http-port"]["value"], settings["http-port"]["source"]) == ("8080", "flag")
    assert (settings["cdi-root"]["value"], settings["cdi-root"]["source"]) == ("/var/run/cdi", "default")
    assert (settings["config-file"]["value"], settings["config-file"]["source"]) == (str(config), "flag")
    assert "mig-strategy" not in settings  # in the config file: its merged value is the config's
    assert {"discovery-retry-seconds", "mps-retry-seconds", "disable-healthchecks", "fake-nvml"} <= set(
        settings
    )


def test_human_output_lists_the_settings(config: Path) -> None:
    import os

    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "config", "check", str(config), "--profile", "t4-pcie"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBEGPU_DISCOVERY_RETRY_SECONDS": "12", "COLUMNS": "200"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "settings outside the config file" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "KUBEGPU_DISCOVERY_RETRY_SECONDS" in line)
    assert row.split() == ["│", "KUBEGPU_DISCOVERY_RETRY_SECONDS", "│", "12", "│", "env", "│"]
    row = next(line for line in out.stdout.splitlines() if "KUBEGPU_HEALTH_PROBE_SECONDS" in line)
    assert row.split() == ["│", "KUBEGPU_HEALTH_PROBE_SECONDS", "│", "5", "│", "default", "│"]


def test_a_bad_setting_is_an_error_as_it_would_be_at_the_daemons_start(config: Path) -> None:
    code, report = run(
        str(config), "--profile", "t4-pcie", env={"KUBEGPU_HEALTH_PROBE_SECONDS": "nan", "SIGNAL": "x"}
    )
    assert code == 1 and report["resources"] == {} and report["settings"] == []
    assert report["errors"] == [
        "KUBEGPU_HEALTH_PROBE_SECONDS='nan' is not a valid number of seconds: use a finite number greater "
        "than 0, e.g. 5 (the default)"
    ]  # SIGNAL is the config-manager's, not the plugin's
