"""docs/install.md names files, values and object names that exist: the guide cannot drift from the chart."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import CONFIG_FILES, DEFAULTS, ROOT, HelmError, by_kind, render

GUIDE = (ROOT / "docs/install.md").read_text()


def test_every_repository_path_in_the_guide_exists() -> None:
    paths = set(re.findall(r"(?<![\w/.-])((?:deployments|scripts|tests|docs)/[\w./*-]*[\w*])", GUIDE))
    assert "deployments/static/kubegpu-device-plugin.yml" in paths
    missing = sorted(p for p in paths if not list(ROOT.glob(p)))
    assert missing == []


def test_every_value_the_guide_lists_is_a_chart_value() -> None:
    section = GUIDE.split("Values that mean the same:")[1].split("Defaults that differ")[0]
    names = re.findall(r"`([a-zA-Z.*]+)`", section)
    assert len(names) > 30
    for name in names:
        node = DEFAULTS
        for part in name.split("."):
            if part == "*":
                break
            assert isinstance(node, dict) and part in node, name
            node = node[part]


def test_the_names_the_guide_gives_are_the_rendered_ones() -> None:
    objs = render({"gfd": {"enabled": True}}, set_files=CONFIG_FILES)
    daemonsets = by_kind(objs, "DaemonSet")
    for name in ("kubegpu-device-plugin", "kubegpu-labels", "kubegpu-mps-control-daemon"):
        assert name in daemonsets and name in GUIDE
    plugin = daemonsets["kubegpu-device-plugin"]["spec"]["template"]["spec"]
    names = [c["name"] for c in plugin["initContainers"] + plugin["containers"]]
    assert names == [
        "kubegpu-device-plugin-init",
        "kubegpu-device-plugin-ctr",
        "kubegpu-device-plugin-sidecar",
    ]
    assert (
        "-c kubegpu-device-plugin-sidecar" in GUIDE
        and "`kubegpu-device-plugin-ctr`, `-init`, `-sidecar`" in GUIDE
    )


def test_the_schema_error_the_guide_quotes_is_the_one_helm_prints() -> None:
    quoted = re.search(r"names it \(`([^`]+)`\)", GUIDE)
    assert quoted, "the guide should quote helm's error for a value the chart does not know"
    with pytest.raises(HelmError) as err:
        render({"migStrategey": "mixed"})
    assert " ".join(quoted.group(1).split()) in str(err.value)


def _section(title: str) -> str:
    """The text of the guide's section whose heading starts with `title`, up to the next heading."""
    start = GUIDE.index(f"\n## {title}")
    end = GUIDE.find("\n## ", start + 1)
    return GUIDE[start : end if end != -1 else None]


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with `header`."""
    lines = text[text.index(header) :].splitlines()
    rows = []
    for line in lines[2:]:  # after the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_privilege_table_is_what_the_chart_renders() -> None:
    """Each container the chart can render, with the user it runs as: the guide's table and the chart."""
    rows = _table_rows(_section("6. Privileges"), "| DaemonSet | container | user |")
    documented, daemonset = {}, ""
    for cells in rows:
        daemonset = cells[0].strip("`") or daemonset
        documented[(daemonset, cells[1].strip("`"))] = cells[2]
    objs = render(
        {"gfd": {"enabled": True}, "health": {"port": 8080}, "dra": {"enabled": True}}, set_files=CONFIG_FILES
    )
    rendered = {}
    for name, ds in by_kind(objs, "DaemonSet").items():
        spec = ds["spec"]["template"]["spec"]
        for ctr in spec.get("initContainers", []) + spec["containers"]:
            uid = (ctr.get("securityContext") or {}).get(
                "runAsUser", spec["securityContext"].get("runAsUser")
            )
            rendered[(name, ctr["name"])] = "0" if uid == 0 else f"{uid}, non-root"
    assert documented == rendered


def _served_metric_names() -> set[str]:
    """Every metric family a scrape of the plugin's /metrics shows, from the plugin's own metrics code with
    a registered resource and a PodResources API that answers."""
    import asyncio

    from kubegpu.api.podresources.v1 import api_pb2
    from kubegpu.plugin.metrics import PluginMetrics

    class Status:
        def expected_resources(self) -> list[str]:
            return ["nvidia.com/gpu"]

        def registration(self, resource: str) -> None:
            return None

        def current_kubelet(self) -> None:
            return None

    class PodResources:
        socket = "/var/lib/kubelet/pod-resources/kubelet.sock"

        async def list(self) -> api_pb2.ListPodResourcesResponse:
            return api_pb2.ListPodResourcesResponse()

    body, _ = asyncio.run(
        PluginMetrics(
            status=Status(), pod_resources=PodResources(), tasks=lambda: {"health-reports": True}
        ).render()
    )  # type: ignore[arg-type]
    names = set(re.findall(r"^# TYPE (\S+) ", body.decode(), re.MULTILINE))
    return {n for n in names if not n.endswith("_created")}  # the client library's timestamps


def test_the_guide_lists_every_series_the_endpoint_serves() -> None:
    """What /metrics tells whoever reaches it: the guide's table names every kubegpu series, no more."""
    section = _section("5. Health endpoint and metrics")
    listed = {cells[0].strip("`") for cells in _table_rows(section, "| series | labels |")}
    served = _served_metric_names()
    assert listed == {n for n in served if n.startswith("kubegpu_")}
    assert {n for n in served if not n.startswith("kubegpu_")} <= {
        "python_info",
        *(n for n in served if n.startswith("process_")),
    }
    assert "`process_*`" in section and "`python_info`" in section
    pods = [cells for cells in _table_rows(section, "| series | labels |") if "pod_device_info" in cells[0]]
    assert set(re.findall(r"`(\w+)`", pods[0][1])) == {
        "namespace",
        "pod",
        "container",
        "resource",
        "device_id",
        "uuid",
    }


def test_the_network_policy_example_lets_prometheus_reach_the_plugin_pods_only() -> None:
    import kubernetes_validate

    blocks = re.findall(r"```yaml\n(.*?)```", _section("5. Health endpoint and metrics"), re.DOTALL)
    (policy,) = [yaml.safe_load(b) for b in blocks if "kind: NetworkPolicy" in b]
    for version in ("1.25.0", "1.32.0"):
        kubernetes_validate.validate(policy, version, strict=True)
    health_values = yaml.safe_load((ROOT / "deployments/helm/examples/values-health.yaml").read_text())
    objs = render(files=[ROOT / "deployments/helm/examples/values-health.yaml"], set_files=CONFIG_FILES)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for name, ds in by_kind(objs, "DaemonSet").items():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert (selector.items() <= labels.items()) is (name == "kubegpu-device-plugin"), name
        assert ds["metadata"]["namespace"] == policy["metadata"]["namespace"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": health_values["health"]["port"]}]
    assert rule["from"] and all(
        "namespaceSelector" in peer and "podSelector" in peer for peer in rule["from"]
    )


# --- what the guide quotes is what the programs print ---------------------------------------------------


def _console_blocks(text: str) -> list[str]:
    return re.findall(r"```console\n(.*?)```", text, re.DOTALL)


def _quoted_log_lines() -> list[str]:
    """The plugin's log lines section 3 shows (`... ` stands for the timestamp)."""
    (block,) = [b for b in _console_blocks(_section("3. Verify")) if "logs ds/kubegpu-device-plugin" in b]
    return [line.removeprefix("... ") for line in block.splitlines() if line.startswith("... ")]


def test_the_plugin_log_the_guide_quotes_is_what_the_plugin_prints() -> None:
    """The plugin on a simulated DGX A100 (8 GPUs, driver 550.90.07, CUDA 12.4, as in the guide) logs each
    quoted line, with only the kubelet's directory differing."""
    from kubegpu.demo.simnode import SimulatedNode

    quoted = _quoted_log_lines()
    assert len(quoted) == 4 and any(
        q.startswith("INFO kubegpu.plugin.daemon: discovered 8 GPU(s)") for q in quoted
    )

    async def plugin_log() -> tuple[str, str]:
        async with SimulatedNode("dgx-a100") as node:
            node.start_plugin()
            await node.wait_allocatable(8)
            # polled: the plugin may log it after the simulator's last event, which wait_for re-checks on
            async with asyncio.timeout(30):
                while "opened ListAndWatch" not in node.plugin_log():  # noqa: ASYNC110 - a log file
                    await asyncio.sleep(0.05)
            return node.plugin_log(), f"{node.plugin_dir}/"

    log, plugin_dir = asyncio.run(plugin_log())
    messages = [line.split(" ", 1)[1] for line in log.splitlines() if re.match(r"\d{4}-\d\d-\d\dT", line)]
    expected = [q.replace("/var/lib/kubelet/device-plugins/", plugin_dir) for q in quoted]
    # Each quoted line is printed; their order depends on when the kubelet dials back, so it is not checked.
    assert [q for q in expected if q not in messages] == [], log


def test_the_missing_nvml_message_the_guide_quotes_is_the_plugins() -> None:
    quoted = re.search(r"without it, it logs `([^`]+)` \.\.\. and exits", " ".join(GUIDE.split()))
    assert quoted, "section 1 should quote what the plugin logs without libnvidia-ml.so.1"
    proc = subprocess.run(
        [sys.executable, "-m", "kubegpu", "plugin", "--kubelet-socket", ""],
        env={**os.environ, "KUBEGPU_FAKE_NVML": "no-library"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert quoted.group(1) in " ".join(proc.stderr.split())


def test_the_config_manager_line_the_guide_quotes_is_the_config_managers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubegpu.configmanager.manager import Settings, update_config

    (line,) = [
        ln
        for b in _console_blocks(_section("4. Sharing and MIG"))
        for ln in b.splitlines()
        if "Updating" in ln
    ]
    quoted = line.removeprefix("...")
    configs = tmp_path / "available-configs"
    configs.mkdir()
    (configs / "time-slicing").write_text("version: v1\n")
    settings = Settings(
        node_name="gpu-1",
        config_file_srcdir=str(configs),
        config_file_dst=str(tmp_path / "config.yaml"),
        send_signal=False,
    )
    caplog.set_level(logging.INFO, "kubegpu.configmanager")
    update_config("time-slicing", settings)
    assert quoted in caplog.messages


def test_no_comment_or_guide_points_at_work_still_to_land() -> None:
    """Notes like "Pending (issue 3)" or "until issue 5 lands" go stale the day the work lands."""
    stale = re.compile(r"(?i)\bissue \d+\b|\buntil .{0,40}\blands\b|\bpending \(")
    files = [
        ROOT / "docs/install.md",
        *sorted((ROOT / "deployments").rglob("*.y*ml")),
        *sorted((ROOT / "deployments/helm/kubegpu/templates").glob("*")),
    ]
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if stale.search(line)
    ]
    assert hits == []


def test_the_version_line_the_guide_quotes_is_the_commands() -> None:
    lines = [ln for b in _console_blocks(GUIDE) for ln in b.splitlines()]
    (at,) = [i for i, ln in enumerate(lines) if "kubegpu" in ln and ln.endswith(" --version")]
    quoted = lines[at + 1]
    proc = subprocess.run([sys.executable, "-m", "kubegpu", "--version"], capture_output=True, text=True)
    assert proc.stdout.strip() == quoted
