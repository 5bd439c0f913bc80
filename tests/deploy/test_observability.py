"""The chart's observability against a real Prometheus: scraping the plugin, the alerts, the dashboard.

A plugin on the fake NVML (its own process, against the kubelet simulator) holds an idle GPU for one pod
and shares a time-sliced GPU between two others; Debian's Prometheus (scripts/install_prometheus.sh, run by
the Makefile's venv target) scrapes it every second. The tests query through Prometheus' HTTP API, run
`promtool check rules` and `promtool test rules` on the PrometheusRule the chart renders (each alert firing
and not firing), and run every query of the chart's Grafana dashboard. Started once for the module.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import Container, Pod
from tests.contract.conftest import profile_inventory

from .conftest import HelmError, by_kind, render

T4 = profile_inventory("t4-pcie")
GIB = 1024**3
INSTALL = "scripts/install_prometheus.sh"
OBSERVABILITY = {
    "health": {"port": 8080},
    "observability": {
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"Debian's prometheus package ({name}) is not installed: run {INSTALL} as root")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_cgroup(proc: Path, pid: int, pod_uid: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/besteffort/pod{pod_uid}/{'ab' * 32}\n")


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    objs = render(OBSERVABILITY)
    return {
        "rule": by_kind(objs, "PrometheusRule")["kubegpu-alerts"],
        "monitor": by_kind(objs, "PodMonitor")["kubegpu-device-plugin"],
        "dashboard": by_kind(objs, "ConfigMap")["kubegpu-grafana-dashboard"],
    }


@pytest.fixture(scope="module")
def rules_file(rendered: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "kubegpu-rules.yaml"
    path.write_text(yaml.safe_dump(rendered["rule"]["spec"]))
    return path


class Node:
    """The simulated node on its own event loop in a thread, so the module's tests share it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready: Future[dict[str, str]] = Future()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        try:
            await self._run()
        except BaseException as err:
            if not self.ready.done():
                self.ready.set_exception(err)
            raise

    async def _run(self) -> None:
        config = self.tmp / "ts.yaml"
        config.write_text(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 2\n"
        )
        proc = self.tmp / "proc"
        env = {"KUBEGPU_PROC_ROOT": str(proc), "KUBEGPU_NODE_NAME": "gpu-node-1"}
        async with SimulatedNode("t4-pcie", env=env) as node:
            node.plugin_args = [
                *("--http-port", str(self.port), "--http-address", "127.0.0.1"),
                *("--pod-resources-socket", str(node.sim.pod_resources_socket), "--metrics-interval", "0.5"),
                *("--config-file", str(config), "--shared-devices-allocation-policy", "packed"),
            ]
            node.start_plugin()
            await node.wait_allocatable(8)
            held: dict[str, str] = {}
            for name in ("train", "serve", "notebook"):
                pod = Pod(name, namespace="ml", containers=[Container("main", {GPU_RESOURCE: 1})])
                allocation = await node.sim.admit(pod)
                held[name] = allocation.containers["main"].run_options.envs["NVIDIA_VISIBLE_DEVICES"]
                write_cgroup(proc, {"train": 4242, "serve": 4343, "notebook": 4444}[name], pod.uid)
            shared = next(g for g in T4.gpus if g.uuid == held["train"])
            assert held["serve"] == shared.uuid and held["notebook"] != shared.uuid, held
            await asyncio.to_thread(
                node.inject,
                *("--gpu", str(shared.index), "--utilization", "80"),
                *("--process", "4242:6144:55", "--process", "4343:2048:20"),
            )
            self.ready.set_result(held)
            await self.stop.wait()

    def __enter__(self) -> dict[str, str]:
        self.thread.start()
        return self.ready.result(timeout=60)

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)


class Prometheus:
    def __init__(self, tmp: Path, target_port: int, rules: Path) -> None:
        self.port = free_port()
        self.config = tmp / "prometheus.yml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        {
                            "job_name": "kubegpu-device-plugin",
                            "static_configs": [
                                {"targets": [f"127.0.0.1:{target_port}"], "labels": {"node": "gpu-node-1"}}
                            ],
                        }
                    ],
                }
            )
        )
        self.args = [
            tool("prometheus"),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.log = tmp / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def query(self, expr: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    def vector(self, expr: str) -> list[tuple[dict[str, str], float]]:
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        return [(s["metric"], float(s["value"][1])) for s in answer["data"]["result"]]

    def until(self, expr: str, timeout: float = 30.0) -> list[tuple[dict[str, str], float]]:
        deadline = time.monotonic() + timeout
        while not (found := self.vector(expr)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr} stayed empty; Prometheus log:\n{self.log.read_text()}")
            time.sleep(0.25)
        return found


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, rules_file: Path
) -> Iterator[tuple[Prometheus, dict[str, str]]]:
    tool("prometheus")
    tmp = tmp_path_factory.mktemp("observability")
    node = Node(tmp)
    with node as held, Prometheus(tmp, node.port, rules_file) as prometheus:
        yield prometheus, held


# ------------------------------------------------------------------------------------------ scraping


def test_prometheus_scrapes_dcgm_utilisation_per_container_memory_and_idle_time(
    cluster: tuple[Prometheus, dict[str, str]],
) -> None:
    prometheus, held = cluster
    shared = held["train"]
    util = prometheus.until(f'count by (UUID) (DCGM_FI_DEV_GPU_UTIL{{UUID="{shared}", pod!=""}} == 80) == 2')
    util = prometheus.vector(f'DCGM_FI_DEV_GPU_UTIL{{UUID="{shared}"}}')
    assert sorted(labels["pod"] for labels, _ in util) == ["serve", "train"]
    assert all(labels["Hostname"] == "gpu-node-1" and labels["modelName"] == "Tesla T4" for labels, _ in util)

    memory = prometheus.until(f'kubegpu_container_gpu_memory_used_bytes{{UUID="{shared}", pod!=""}}')
    assert {m["pod"]: v for m, v in memory} == {"train": 6 * GIB, "serve": 2 * GIB}
    share = prometheus.vector(f'kubegpu_container_gpu_utilization_ratio{{UUID="{shared}"}}')
    assert {m["pod"]: v for m, v in share} == {"train": 0.55, "serve": 0.2}

    # The notebook holds a GPU nobody uses: its idle time grows; the shared GPU is busy.
    idle = prometheus.until(f'kubegpu_device_idle_seconds{{pod="notebook", UUID="{held["notebook"]}"}} > 1')
    assert len(idle) == 1 and idle[0][0]["namespace"] == "ml"
    busy = prometheus.vector(f'kubegpu_device_idle_seconds{{UUID="{shared}"}}')
    assert len(busy) == 2 and all(v < 1.5 for _, v in busy)


def test_every_dashboard_query_runs_against_the_server(
    cluster: tuple[Prometheus, dict[str, str]], rendered: dict[str, Any]
) -> None:
    prometheus, _ = cluster
    prometheus.until("kubegpu_device_idle_seconds")
    prometheus.until("rate(kubegpu_allocations_total[5m])")  # a rate needs two scrapes
    dashboard = json.loads(rendered["dashboard"]["data"]["kubegpu.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    empty = []
    for expr in exprs:
        answer = prometheus.query(expr)
        assert answer["status"] == "success", (expr, answer)
        if not answer["data"]["result"]:
            empty.append(expr)
    # Only the XID table is empty: no XID was injected.
    assert empty == ["max by (Hostname, gpu, namespace, pod) (DCGM_FI_DEV_XID_ERRORS) > 0"]


def test_kubegpu_top_reads_prometheus(cluster: tuple[Prometheus, dict[str, str]], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kubegpu.toolkit.top.cli import top

    prometheus, held = cluster
    prometheus.until('kubegpu_device_idle_seconds{pod="notebook"} > 1')
    url = f"http://127.0.0.1:{prometheus.port}"
    no_cluster = str(tmp_path / "no-kubeconfig")  # pending pods need the API: left out without one
    result = CliRunner().invoke(top, ["--prometheus", url, "--kubeconfig", no_cluster, "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["uuid"], r["holder"]): r for r in json.loads(result.output)["gpus"]}
    assert {r["node"] for r in rows.values()} == {"gpu-node-1"} and len(T4.gpus) == 4
    shared = held["train"]
    assert rows[(shared, "ml/train/main")]["utilizationPercent"] == 80.0
    assert rows[(shared, "ml/serve/main")]["memoryUsedMiB"] == 8192.0  # 6 GiB + 2 GiB of processes
    assert rows[(held["notebook"], "ml/notebook/main")]["idleSeconds"] > 1
    result = CliRunner().invoke(
        top, ["--prometheus", url, "--kubeconfig", no_cluster, "--idle", "1s", "--json"]
    )
    assert [r["holder"] for r in json.loads(result.output)["gpus"]] == ["ml/notebook/main"]


def test_the_dashboard_is_a_configmap_the_grafana_sidecar_loads(rendered: dict[str, Any]) -> None:
    dashboard = rendered["dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "kubegpu"
    body = json.loads(dashboard["data"]["kubegpu.json"])
    assert body["uid"] == "kubegpu-gpu-use" and body["templating"]["list"][0]["type"] == "datasource"


def test_the_pod_monitor_scrapes_the_plugins_health_port(rendered: dict[str, Any]) -> None:
    spec = rendered["monitor"]["spec"]
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "device-plugin"
    assert spec["podMetricsEndpoints"][0]["port"] == "health"
    assert spec["podMetricsEndpoints"][0]["path"] == "/metrics"


def test_observability_is_off_by_default_and_needs_the_http_port() -> None:
    kinds = {o["kind"] for o in render({})}
    assert not kinds & {"PodMonitor", "PrometheusRule"}
    assert "kubegpu-grafana-dashboard" not in by_kind(render({}), "ConfigMap")
    with pytest.raises(HelmError, match=r"observability\.podMonitor\.enabled needs health\.port"):
        render({"observability": {"podMonitor": {"enabled": True}}})


# ------------------------------------------------------------------------------------------ the alerts

ALERTS = {
    "KubegpuXidOnAllocatedGpu",
    "KubegpuDevicesUnhealthy",
    "KubegpuGpuHeldIdle",
    "KubegpuPluginNotRegistered",
    "KubegpuConfigReloadFailed",
}
HELD = 'gpu="0",UUID="GPU-a",Hostname="n1",container="main",namespace="ml"'
HOLDER = {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1", "namespace": "ml", "container": "main"}
DESCRIPTIONS = {
    "KubegpuXidOnAllocatedGpu": (
        "The GPU reported an XID error while a pod holds it; the pod's work on it may be lost. "
        "See the XID catalog (kubegpu explain, docs/troubleshooting.md) for what the code means "
        "and whether the GPU needs a reset."
    ),
    "KubegpuDevicesUnhealthy": (
        "The plugin reports the device Unhealthy to the kubelet, so no new pod gets it. "
        "kubegpu doctor on the node says why (XID, lost GPU, pending row remap)."
    ),
    "KubegpuGpuHeldIdle": (
        "The GPU's utilisation has not risen above the plugin's --idle-threshold since the pod "
        "took it or for longer than 14400 s. Another workload could use it."
    ),
    "KubegpuPluginNotRegistered": (
        "The kubelet does not know the plugin's resource, so no pod can get these GPUs on that node. "
        "The plugin's /readyz and log say why (kubelet restarting, registration failing)."
    ),
    "KubegpuConfigReloadFailed": (
        "The last config reload failed and the plugin keeps serving the previous config; "
        "kubegpu_config_reload_failures_total says why and the plugin's log names the problem."
    ),
}


def firing(alert: str, at: str, labels: dict[str, str], summary: str) -> dict[str, Any]:
    annotations = {"summary": summary, "description": DESCRIPTIONS[alert]}
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
    }


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


# Each alert firing and, just before (or on the series next to it), not firing.
RULE_TESTS = {
    "rule_files": ["kubegpu-rules.yaml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": f'DCGM_FI_DEV_XID_ERRORS{{{HELD},pod="train"}}', "values": "0 0 79x5"},
                {
                    "series": 'DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-b",Hostname="n1",pod=""}',
                    "values": "48x5",
                },
                {
                    "series": 'kubegpu_device_healthy{resource="nvidia.com/gpu",uuid="GPU-a"}',
                    "values": "0x15",
                },
                {
                    "series": 'kubegpu_device_healthy{resource="nvidia.com/gpu",uuid="GPU-b"}',
                    "values": "1 0x5 1x9",
                },
                {"series": f'kubegpu_device_idle_seconds{{{HELD},pod="nb"}}', "values": "14000+60x10"},
                {"series": f'kubegpu_device_idle_seconds{{{HELD},pod="busy"}}', "values": "0x10"},
                {"series": 'kubegpu_registered{node="n1",resource="nvidia.com/gpu"}', "values": "1 0x10"},
                {"series": 'kubegpu_registered{node="n2",resource="nvidia.com/gpu"}', "values": "1 0 0 1x8"},
                {"series": 'kubegpu_config_last_reload_successful{node="n1"}', "values": "1 1 0 0"},
                {"series": 'kubegpu_config_last_reload_successful{node="n2"}', "values": "1 1 1 1"},
            ],
            "alert_rule_test": [
                silent("KubegpuXidOnAllocatedGpu", "1m"),  # the free GPU's XID 48 never fires
                firing(
                    "KubegpuXidOnAllocatedGpu",
                    "3m",
                    {"severity": "critical", **HOLDER, "pod": "train"},
                    "XID 79 on GPU 0 of n1, held by ml/train",
                ),
                silent("KubegpuDevicesUnhealthy", "9m"),  # GPU-b was unhealthy for 5 minutes only
                firing(
                    "KubegpuDevicesUnhealthy",
                    "10m",
                    {"severity": "warning", "resource": "nvidia.com/gpu", "uuid": "GPU-a"},
                    "GPU GPU-a (nvidia.com/gpu) has been unhealthy for 10m",
                ),
                silent("KubegpuGpuHeldIdle", "6m"),  # 14360 s: under 4 h
                firing(
                    "KubegpuGpuHeldIdle",
                    "7m",
                    {"severity": "info", **HOLDER, "pod": "nb"},
                    "ml/nb has held GPU 0 without using it for 4h 0m 20s",
                ),
                silent("KubegpuPluginNotRegistered", "5m"),  # n2 came back after 2 minutes
                firing(
                    "KubegpuPluginNotRegistered",
                    "6m",
                    {"severity": "critical", "node": "n1", "resource": "nvidia.com/gpu"},
                    "The device plugin on n1 is not registered for nvidia.com/gpu",
                ),
                silent("KubegpuConfigReloadFailed", "1m"),
                firing(
                    "KubegpuConfigReloadFailed",
                    "2m",
                    {"severity": "warning", "node": "n1"},
                    "The device plugin on n1 failed to apply a new config",
                ),
            ],
        }
    ],
}


def test_promtool_checks_the_rules(rules_file: Path, rendered: dict[str, Any]) -> None:
    done = subprocess.run(
        [tool("promtool"), "check", "rules", str(rules_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout
    names = {r["alert"] for g in rendered["rule"]["spec"]["groups"] for r in g["rules"]}
    assert names == ALERTS


def test_promtool_tests_every_alert_firing_and_not_firing(rules_file: Path) -> None:
    tested = {t["alertname"] for t in RULE_TESTS["tests"][0]["alert_rule_test"]}
    assert tested == ALERTS
    for case in RULE_TESTS["tests"][0]["alert_rule_test"]:
        assert any(
            t["alertname"] == case["alertname"] and not t["exp_alerts"]
            for t in RULE_TESTS["tests"][0]["alert_rule_test"]
        ), f"{case['alertname']} is never checked not firing"
    tests = rules_file.parent / "kubegpu-rules.test.yaml"
    tests.write_text(yaml.safe_dump(RULE_TESTS))
    done = subprocess.run(
        [tool("promtool"), "test", "rules", str(tests)], capture_output=True, text=True, cwd=rules_file.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_helm_lint_strict_passes_with_everything_on(tmp_path: Path) -> None:
    from .test_chart import lint

    values = tmp_path / "observability.yaml"
    values.write_text(
        yaml.safe_dump(
            {**OBSERVABILITY, "observability": {**OBSERVABILITY["observability"], "hostProc": True}}
        )
    )
    out = lint((values,))
    assert "1 chart(s) linted, 0 chart(s) failed" in out and "[WARNING]" not in out
