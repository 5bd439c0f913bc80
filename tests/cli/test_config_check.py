"""`kubegpu config check` as an SRE runs it before rolling out a ConfigMap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    # piped: one plain line per setting, no table
    assert "setting KUBEGPU_DISCOVERY_RETRY_SECONDS=12 (env)" in out.stdout.splitlines()
    assert "setting KUBEGPU_HEALTH_PROBE_SECONDS=5 (default)" in out.stdout.splitlines()
    assert "│" not in out.stdout


def test_a_bad_setting_is_an_error_as_it_would_be_at_the_daemons_start(config: Path) -> None:
    code, report = run(
        str(config), "--profile", "t4-pcie", env={"KUBEGPU_HEALTH_PROBE_SECONDS": "nan", "SIGNAL": "x"}
    )
    assert code == 1 and report["resources"] == {} and report["settings"] == []
    assert report["errors"] == [
        "KUBEGPU_HEALTH_PROBE_SECONDS='nan' is not a valid number of seconds: use a finite number greater "
        "than 0, e.g. 5 (the default)"
    ]  # SIGNAL is the config-manager's, not the plugin's


# --- ConfigMaps, multi-document files and Helm values: each config under its key ------------------------

BAD_REPLICAS = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    '    - name: nvidia.com/gpu\n      replicas: "two"\n'
)
# What `kubectl create configmap cfgs --from-file=ts=ts.yaml --from-file=good=good.yaml -o yaml` writes.
CONFIGMAP = """apiVersion: v1
data:
  good: |
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
  ts: |
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: "two"
kind: ConfigMap
metadata:
  name: cfgs
"""
GO_TYPE_ERROR = (
    "sharing.timeSlicing.resources.0.replicas: json: cannot unmarshal string into Go struct field "
    'Sharing.sharing.timeSlicing of type int (got "two")'
)


def check_cli(*args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "config", "check", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=60,
    )


def test_a_configmap_is_checked_key_by_key(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(CONFIGMAP)
    code, report = run(str(path), "--profile", "t4-pcie")
    assert code == 1
    assert report["source"] == "ConfigMap" and report["errors"] == []
    assert [c["key"] for c in report["configs"]] == ["good", "ts"]
    good, bad = report["configs"]
    assert good["errors"] == [] and good["warnings"] == []
    assert len(good["resources"]["nvidia.com/gpu"]) == 16  # 4 T4s x 4 replicas
    assert good["config_file"] == f"{path}[good]"
    assert bad["errors"] == [GO_TYPE_ERROR] and bad["resources"] == {}
    # no warnings about apiVersion, data, kind, metadata: the ConfigMap itself is never read as a config
    assert all("unknown config key" not in w for c in report["configs"] for w in c["warnings"])


def test_human_output_names_the_failing_key(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(CONFIGMAP)
    out = check_cli(str(path), "--profile", "t4-pcie")
    assert out.returncode == 1 and out.stderr == ""
    assert f"config {path}[ts] on t4-pcie" in out.stdout.splitlines()
    assert f"error: {GO_TYPE_ERROR}" in out.stdout.splitlines()
    assert out.stdout.splitlines()[-1] == "FAILED: 1 of 2 configs: ts"


def test_key_picks_one_config_and_an_unknown_key_is_config_managers_error(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(CONFIGMAP)
    code, report = run(str(path), "--profile", "t4-pcie", "--key", "good")
    assert code == 0 and [c["key"] for c in report["configs"]] == ["good"]
    out = check_cli(str(path), "--profile", "t4-pcie", "--key", "time-slicing")
    assert (out.returncode, out.stdout) == (2, "")
    assert (
        out.stderr == f"error: specified config time-slicing does not exist in {path} (its keys: good, ts)\n"
    )


def test_key_on_a_plain_config_is_bad_usage(config: Path) -> None:
    out = check_cli(str(config), "--key", "x", "--profile", "t4-pcie")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"error: --key x: {config} is a plain config, not a ConfigMap or Helm values file; drop --key\n"
    )


def test_a_multi_document_file_and_a_kubectl_list(tmp_path: Path) -> None:
    daemonset = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: plugin\nspec: {}\n"
    other = CONFIGMAP.replace("name: cfgs", "name: more")
    stream = tmp_path / "all.yaml"
    stream.write_text(f"# helm template output\n---\n{daemonset}---\n{CONFIGMAP}---\n{other}")
    code, report = run(str(stream), "--profile", "t4-pcie", "--key", "good")
    assert code == 0  # with several ConfigMaps each key is named after its ConfigMap
    assert [c["key"] for c in report["configs"]] == ["cfgs/good", "more/good"]
    items = yaml.safe_load(CONFIGMAP)
    listing = tmp_path / "list.yaml"
    listing.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [items]}))
    code, report = run(str(listing), "--profile", "t4-pcie")
    assert code == 1 and [c["key"] for c in report["configs"]] == ["good", "ts"]
    only_daemonset = tmp_path / "ds.yaml"
    only_daemonset.write_text(daemonset)
    out = check_cli(str(only_daemonset))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"error: {only_daemonset} holds Kubernetes objects (DaemonSet) but no ConfigMap: give the ConfigMap "
        "that holds the configs, or the config file itself\n"
    )


def test_what_the_api_server_would_refuse_in_a_configmap(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
        "data:\n  inline: {version: v1}\n  "
        "a-very-long-name-that-no-label-value-can-hold-because-it-is-over-63: ''\n"
    )
    code, report = run(str(path), "--profile", "t4-pcie")
    assert code == 1
    assert report["errors"] == [
        "ConfigMap c: data.inline is a map, not a string: the API server refuses it; write the config as a "
        "block scalar (`inline: |` and the file indented below)"
    ]
    assert report["warnings"] == [
        "a-very-long-name-that-no-label-value-can-hold-because-it-is-over-63: no node can select this "
        "config: "
        "the label "
        "nvidia.com/device-plugin.config=a-very-long-name-that-no-label-value-can-hold-because-it-is-"
        "over-63 is not a valid label value (at most 63 characters, starting and ending with a letter or "
        "digit)"
    ]


def test_helm_values_config_map_with_the_charts_mps_root(tmp_path: Path) -> None:
    mps = "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"config": {"map": {"mps": mps, "bad": BAD_REPLICAS}, "default": "mps"}})
    )
    code, report = run(str(values), "--profile", "t4-pcie")
    assert code == 1 and report["source"] == "Helm values" and report["unlabelled"] == "mps"
    by_key = {c["key"]: c for c in report["configs"]}
    # MPS needs --mps-root: the chart's MPS_ROOT (mps.root, default /run/nvidia/mps) applies
    assert by_key["mps"]["errors"] == [] and len(by_key["mps"]["resources"]["nvidia.com/gpu"]) == 8
    assert by_key["bad"]["errors"] == [GO_TYPE_ERROR]


def test_values_whose_unlabelled_nodes_get_nothing(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"config": {"map": {"a": "version: v1\n", "b": "version: v1\n"}, "fallbackStrategies": ["named"]}}
        )
    )
    code, report = run(str(values), "--profile", "t4-pcie")
    assert code == 1 and report["unlabelled"] is None
    assert report["errors"] == [
        "nodes without the nvidia.com/device-plugin.config label: no config was set, no default was "
        "provided, "
        "and all fallbacks failed"
    ]


def test_values_without_configs_say_where_they_are(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("config:\n  name: kubegpu-configs\n")
    out = check_cli(str(values))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"error: {values} is a Helm values file with an empty config.map: config.name=kubegpu-configs names "
        "a "
        "ConfigMap made beforehand: check it with `kubectl get configmap kubegpu-configs -n NAMESPACE -o "
        "yaml "
        "> cm.yaml && kubegpu config check cm.yaml`\n"
    )


def test_a_plain_mps_config_says_the_chart_sets_the_mps_root(tmp_path: Path) -> None:
    path = tmp_path / "mps.yaml"
    path.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    )
    code, report = run(str(path), "--profile", "t4-pcie")
    assert code == 1
    assert report["errors"] == [
        "unable to validate flags: using MPS requires --mps-root to be specified (the Helm chart sets it "
        "from "
        "mps.root, /run/nvidia/mps by default: check with --mps-root /run/nvidia/mps or give the values file)"
    ]


def test_the_readme_lists_the_mps_root_hint_as_a_difference() -> None:
    # NVIDIA's text is the plugin's; what config check appends to it is a difference, so the README says so.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## Where kubegpu differs from NVIDIA's plugin") :]
    table = table[: table.index("\n## ")]
    rows = [line for line in table.splitlines() if line.startswith("| `config check`") and "MPS root" in line]
    assert len(rows) == 1
    assert "`using MPS requires --mps-root to be specified`" in rows[0]
    assert "(the Helm chart sets it from mps.root, /run/nvidia/mps by default" in rows[0]


def test_keys_the_api_server_refuses_are_reported_and_errors_name_the_key_not_a_scratch_file(
    tmp_path: Path,
) -> None:
    data = {".": "version: v1\n", "../a": "version: v1\n", "k" * 254: "version: v1\n"}
    data["bad"] = "version: v1\nflags:\n  migStrategy: [\n"
    path = tmp_path / "cm.yaml"
    path.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
    )
    code, report = run(str(path), "--profile", "t4-pcie")
    assert code == 1
    refused = "not a valid ConfigMap key (the API server refuses it): use letters, digits, '-', '_', '.'"
    assert report["errors"] == [f".: {refused}", f"../a: {refused}", f"{'k' * 254}: {refused}"]
    (bad,) = report["configs"]  # the refused keys are not checked as configs
    assert bad["key"] == "bad"
    (error,) = bad["errors"]
    assert error.startswith("unable to parse config file: ")
    assert f"(at line 4, column 1 of {path}[bad]; " in error
    assert "kubegpu-config-check-" not in json.dumps(report)
