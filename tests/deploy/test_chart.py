"""The Helm chart: its values schema, NVIDIA's value names and rules, and what it renders for them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    CHART,
    CONFIG_FILES,
    DEFAULTS,
    NAMESPACE,
    ROOT,
    HelmError,
    by_kind,
    containers,
    env,
    example_values_files,
    helm,
    prerender,
    render,
    render_each,
    value_args,
)

PLUGIN_DS = "kubegpu-device-plugin"
NVIDIA_TOLERATIONS = [
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]


def plugin(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return containers(by_kind(objs, "DaemonSet")[PLUGIN_DS])["kubegpu-device-plugin-ctr"]


# ------------------------------------------------------------------------------------------ the schema


def lint(files: tuple[Path, ...] = (), set_files: dict[str, Path] | None = None) -> str:
    """`helm lint --strict` (warnings are errors) for these values; HelmError when the chart fails it."""
    options = value_args(files, tuple((set_files or {}).items()))
    return helm("lint", "--strict", CHART, "-n", NAMESPACE, *options, stdin="{}")


def test_helm_lint_strict_passes_the_defaults_and_every_example() -> None:
    cases: list[tuple[tuple[Path, ...], dict[str, Path] | None]] = [((), None), ((), CONFIG_FILES)]
    cases += [((path,), None) for path in example_values_files()]
    cases += [((path,), CONFIG_FILES) for path in example_values_files()]
    assert len(cases) == 12

    def outcome(case: tuple[tuple[Path, ...], dict[str, Path] | None]) -> str:
        try:
            return lint(*case)
        except HelmError as err:
            return f"FAILED: {err}"

    with ThreadPoolExecutor() as pool:  # twelve helm processes: side by side
        outputs = list(pool.map(outcome, cases))
    for (files, set_files), out in zip(cases, outputs, strict=True):
        what = ([f.name for f in files], bool(set_files))
        assert "1 chart(s) linted, 0 chart(s) failed" in out, (what, out)
        assert "[WARNING]" not in out and "[ERROR]" not in out, (what, out)


def test_helm_lint_is_really_looking(tmp_path: Path) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("migStrategy: both\n")
    with pytest.raises(HelmError) as err:
        lint((bad,))
    assert "[ERROR] values.yaml: - at '/migStrategy': value must be one of" in err.value.stdout
    assert str(err.value) == "Error: 1 chart(s) linted, 1 chart(s) failed"


SCHEMA_ERROR = "values don't meet the specifications of the schema(s) in the following chart(s):\nkubegpu:\n"


SCHEMA_REFUSALS = [
    ({"migStrategey": "mixed"}, "- at '': additional properties 'migStrategey' not allowed"),  # a typo
    ({"nfd": {"enabled": False}}, "additional properties 'nfd' not allowed"),  # NVIDIA's, not ours
    ({"gdsEnabled": True}, "additional properties 'gdsEnabled' not allowed"),
    ({"migStrategy": "both"}, "at '/migStrategy': value must be one of 'none', 'single', 'mixed'"),
    ({"deviceIDStrategy": "serial"}, "at '/deviceIDStrategy': value must be one of 'uuid', 'index'"),
    (
        {"deviceListStrategy": "envvar,cdi"},
        "at '/deviceListStrategy': 'envvar,cdi' does not match pattern",
    ),
    ({"failOnInitError": "false"}, "at '/failOnInitError': got string, want null or boolean"),
    (
        {"config": {"fallbackStrategies": ["first"]}},
        "at '/config/fallbackStrategies/0': value must be one of 'named', 'single', 'empty'",
    ),
    ({"config": {"map": {"a": {"version": "v1"}}}}, "at '/config/map/a': got object, want string"),
    ({"health": {"port": "8080"}}, "at '/health/port': got string, want null or integer"),
    (
        {"image": {"pullPolicy": "Sometimes"}},
        "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    (
        {"nvidiaDriverRoot": "run/nvidia/driver"},
        "at '/nvidiaDriverRoot': 'run/nvidia/driver' does not match pattern '^/'",
    ),
]


@pytest.mark.parametrize(("values", "complaint"), SCHEMA_REFUSALS)
def test_helm_template_refuses_values_the_schema_forbids(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(HelmError) as err:
        render(values)
    assert str(err.value).startswith("Error: " + SCHEMA_ERROR), err.value
    assert complaint in str(err.value)


def test_nvidia_value_names_and_defaults() -> None:
    v = DEFAULTS
    # NVIDIA's null defaults: the env var is left out and the plugin's own default applies.
    for key in ("compatWithCPUManager", "migStrategy", "failOnInitError", "deviceListStrategy"):
        assert key in v and v[key] is None, key
    for key in ("deviceIDStrategy", "nvidiaDriverRoot", "nvidiaDevRoot", "runtimeClassName"):
        assert key in v and v[key] is None, key
    assert v["config"] == {"name": "", "map": {}, "default": "", "fallbackStrategies": ["named", "single"]}
    assert v["nodeSelector"] == {} and v["tolerations"] == NVIDIA_TOLERATIONS
    terms = v["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [t["matchExpressions"][0]["key"] for t in terms] == [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "nvidia.com/gpu.present",
    ]
    assert v["priorityClassName"] == "system-node-critical"
    assert v["updateStrategy"] == {"type": "RollingUpdate"}
    assert v["gfd"]["enabled"] is False and v["devicePlugin"]["enabled"] is True
    assert v["mps"]["root"] == "/run/nvidia/mps" and v["mps"]["enableHostPID"] is True
    assert v["allowDefaultNamespace"] is False


# ------------------------------------------------------------------------------ NVIDIA's refusals


NVIDIA_REFUSALS = [
    (
        {"config": {"name": "x", "map": {"a": "version: v1"}}},
        "gpu",
        "Only one of 'config.name' or 'config.map'",
    ),
    ({"config": {"map": {"a": "", "b": ""}}}, "gpu", "A default config must be provided"),
    (
        {"config": {"map": {"a": "", "b": ""}, "default": "c"}},
        "gpu",
        '"c", which is not a key of config.map',
    ),
    ({}, "default", "Running in the 'default' namespace is not recommended"),
]


@pytest.mark.parametrize(("values", "namespace", "message"), NVIDIA_REFUSALS)
def test_refused_like_nvidia(values: dict[str, Any], namespace: str, message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render(values, namespace=namespace)


DEFAULT_CONFIG_FOUND = [
    {"config": {"map": {"a": "", "b": ""}, "fallbackStrategies": ["empty"]}},
    {"config": {"map": {"a": "", "default": ""}}},  # named
    {"config": {"map": {"only": ""}}},  # single
    {"config": {"map": {"a": "", "b": ""}, "default": "b"}},
]


@pytest.mark.parametrize("values", DEFAULT_CONFIG_FOUND)
def test_a_default_config_is_found(values: dict[str, Any]) -> None:
    assert by_kind(render(values), "ConfigMap")


def test_default_namespace_allowed_on_request() -> None:
    assert render({"allowDefaultNamespace": True}, namespace="default")


# --------------------------------------------------------------------------- what the values become


def test_defaults_render_the_plugin_alone_on_gpu_nodes() -> None:
    objs = render()
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [("DaemonSet", PLUGIN_DS)]
    ds = objs[0]
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == NVIDIA_TOLERATIONS
    assert spec["affinity"] == DEFAULTS["affinity"]
    assert spec["automountServiceAccountToken"] is False  # nothing in it calls the API server
    assert [v["name"] for v in spec["volumes"]] == ["kubelet-device-plugins-dir"]
    assert spec["volumes"][0]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    ctr = plugin(objs)
    assert ctr["command"] == ["kubegpu", "plugin"]
    assert env(ctr) == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    assert ctr["resources"]["limits"] and ctr["resources"]["requests"]
    assert ctr["livenessProbe"]["exec"] and ctr["readinessProbe"]["exec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )


ENV_VARS = [
    ({"migStrategy": "none"}, {"MIG_STRATEGY": "none"}),
    ({"migStrategy": "mixed"}, {"MIG_STRATEGY": "mixed", "NVIDIA_MIG_MONITOR_DEVICES": "all"}),
    ({"failOnInitError": False}, {"FAIL_ON_INIT_ERROR": "false"}),
    ({"compatWithCPUManager": True}, {"PASS_DEVICE_SPECS": "true"}),
    ({"compatWithCPUManager": False}, {"PASS_DEVICE_SPECS": "false"}),
    ({"deviceListStrategy": "volume-mounts"}, {"DEVICE_LIST_STRATEGY": "volume-mounts"}),
    ({"deviceIDStrategy": "index"}, {"DEVICE_ID_STRATEGY": "index"}),
    ({"nvidiaDriverRoot": "/run/nvidia/driver"}, {"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}),
    ({"nvidiaDevRoot": "/"}, {"NVIDIA_DEV_ROOT": "/"}),
    (
        {"health": {"port": 8080}},
        {
            "KUBEGPU_HTTP_PORT": "8080",
            "KUBEGPU_HTTP_ADDRESS": {"fieldRef": {"fieldPath": "status.podIP"}},
            "KUBEGPU_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        },
    ),
    (
        {"health": {"port": 8080, "address": "127.0.0.1"}},
        {
            "KUBEGPU_HTTP_PORT": "8080",
            "KUBEGPU_HTTP_ADDRESS": "127.0.0.1",
            "KUBEGPU_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        },
    ),
    (
        {
            "health": {"port": 8080},
            "observability": {"metricsInterval": 5, "idleThreshold": 0, "hostProc": True},
        },
        {
            "KUBEGPU_HTTP_PORT": "8080",
            "KUBEGPU_HTTP_ADDRESS": {"fieldRef": {"fieldPath": "status.podIP"}},
            "KUBEGPU_NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
            "KUBEGPU_METRICS_INTERVAL_SECONDS": "5",
            "KUBEGPU_IDLE_THRESHOLD": "0",
            "KUBEGPU_PROC_ROOT": "/host/proc",
        },
    ),
    (
        {"deviceListStrategy": "cdi-cri"},
        {"DEVICE_LIST_STRATEGY": "cdi-cri", "KUBEGPU_CDI_ROOT": "/var/run/cdi"},
    ),
]


@pytest.mark.parametrize(("values", "expected"), ENV_VARS)
def test_values_become_the_plugins_env_vars(values: dict[str, Any], expected: dict[str, str]) -> None:
    got = env(plugin(render(values)))
    got.pop("NVIDIA_VISIBLE_DEVICES")
    got.pop("NVIDIA_DRIVER_CAPABILITIES")
    assert got == expected


EVERYTHING = {
    "migStrategy": "mixed",
    "failOnInitError": True,
    "compatWithCPUManager": True,
    "deviceListStrategy": "envvar,cdi-annotations",
    "deviceIDStrategy": "uuid",
    "nvidiaDriverRoot": "/run/nvidia/driver",
    "nvidiaDevRoot": "/",
    "health": {"port": 8080},
    "observability": {"metricsInterval": 5, "idleThreshold": 10, "hostProc": True},
}


def test_every_env_var_of_the_plugin_means_something_to_it() -> None:
    from kubegpu.settings.flags import PLUGIN_SETTINGS

    known = {e for spec in PLUGIN_SETTINGS for e in spec.envvars}
    # Read by the NVIDIA container runtime, not the plugin.
    known |= {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_MONITOR_DEVICES"}
    used = set(env(plugin(render(EVERYTHING, set_files=CONFIG_FILES))))
    assert used - known == set()


def test_driver_root_is_mounted_read_only() -> None:
    objs = render({"nvidiaDriverRoot": "/run/nvidia/driver"})
    ctr = plugin(objs)
    assert {"name": "driver-root", "mountPath": "/driver-root", "readOnly": True} in ctr["volumeMounts"]
    volumes = by_kind(objs, "DaemonSet")[PLUGIN_DS]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "driver-root", "hostPath": {"path": "/run/nvidia/driver", "type": "Directory"}} in volumes


LOCKED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}


SECURITY_CONTEXTS = [
    ({}, {**LOCKED, "capabilities": {"drop": ["ALL"]}}),
    ({"compatWithCPUManager": True}, {"privileged": True}),
    ({"migStrategy": "single"}, {**LOCKED, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
    ({"migStrategy": "none"}, {**LOCKED, "capabilities": {"drop": ["ALL"]}}),
    (
        {"deviceListStrategy": "envvar,volume-mounts"},
        {**LOCKED, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
    ),
    ({"config": {"name": "cm"}}, {**LOCKED, "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
    (
        {"config": {"name": "cm"}, "migStrategy": "none", "deviceListStrategy": "envvar"},
        {**LOCKED, "capabilities": {"drop": ["ALL"]}},
    ),
    ({"securityContext": {"runAsNonRoot": False}}, {"runAsNonRoot": False}),  # verbatim wins
]


def test_compat_with_cpu_manager_makes_only_the_plugin_privileged() -> None:
    """NVIDIA's rule is for the plugin, which passes every device node's spec; the labels daemon passes
    none (NVIDIA's GFD is privileged for vGPU host data, which kubegpu does not read)."""
    objs = render({"compatWithCPUManager": True, "gfd": {"enabled": True}})
    assert plugin(objs)["securityContext"] == {"privileged": True}
    labels = containers(by_kind(objs, "DaemonSet")["kubegpu-labels"])["kubegpu-labels-ctr"]
    assert labels["securityContext"] == {**LOCKED, "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize(("values", "expected"), SECURITY_CONTEXTS)
def test_security_context_follows_nvidias_rules(values: dict[str, Any], expected: dict[str, Any]) -> None:
    assert plugin(render(values))["securityContext"] == expected


def test_a_config_map_brings_config_manager_rbac_and_the_mps_daemon() -> None:
    objs = render({"gfd": {"enabled": True}}, set_files=CONFIG_FILES)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == [
        ("ClusterRole", "kubegpu-role"),
        ("ClusterRoleBinding", "kubegpu-labels"),  # the labels pods' config-manager reads Nodes too
        ("ClusterRoleBinding", "kubegpu-role-binding"),
        ("ConfigMap", "kubegpu-configs"),
        ("DaemonSet", "kubegpu-device-plugin"),
        ("DaemonSet", "kubegpu-labels"),
        ("DaemonSet", "kubegpu-mps-control-daemon"),
        ("Role", "kubegpu-labels"),  # NodeFeatures (gfd.useNodeFeatureAPI)
        ("RoleBinding", "kubegpu-labels"),
        ("ServiceAccount", "kubegpu-labels"),
        ("ServiceAccount", "kubegpu-service-account"),
    ]
    subjects = by_kind(objs, "ClusterRoleBinding")["kubegpu-labels"]["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "name": "kubegpu-labels", "namespace": "kubegpu"}]
    assert by_kind(objs, "ClusterRoleBinding")["kubegpu-labels"]["roleRef"]["name"] == "kubegpu-role"
    configmap = by_kind(objs, "ConfigMap")["kubegpu-configs"]
    assert configmap["data"] == {
        name.removeprefix("config.map."): p.read_text() for name, p in CONFIG_FILES.items()
    }
    for name, ds in by_kind(objs, "DaemonSet").items():
        spec = ds["spec"]["template"]["spec"]
        own = "kubegpu-labels" if name == "kubegpu-labels" else "kubegpu-service-account"
        assert spec["serviceAccountName"] == own, name
        init = [c for c in spec["initContainers"] if c["command"][1:] == ["config-manager"]]
        sidecars = [c for c in spec["containers"] if c["command"][1:] == ["config-manager"]]
        assert len(init) == len(sidecars) == 1, name
        assert env(init[0])["ONESHOT"] == "true" and env(init[0])["SEND_SIGNAL"] == "false"
        assert env(sidecars[0])["ONESHOT"] == "false" and env(sidecars[0])["SIGNAL"] == "1"
        assert env(sidecars[0])["NODE_LABEL"] == "nvidia.com/device-plugin.config"
        assert env(sidecars[0])["FALLBACK_STRATEGIES"] == "named,single"
        assert {"name": "available-configs", "configMap": {"name": "kubegpu-configs"}} in spec["volumes"]
        # The chart's configs roll the pods when they change.
        assert len(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]) == 64
    mps = by_kind(objs, "DaemonSet")["kubegpu-mps-control-daemon"]["spec"]["template"]["spec"]
    assert mps["nodeSelector"] == {"nvidia.com/mps.capable": "true"}
    assert mps["hostPID"] is True and "shareProcessNamespace" not in mps
    assert env(plugin(objs))["CONFIG_FILE"] == "/config/config.yaml"


def test_an_external_config_map_is_referenced_not_created() -> None:
    objs = render({"config": {"name": "kubegpu-configs", "default": "default"}})
    assert not by_kind(objs, "ConfigMap")
    volumes = by_kind(objs, "DaemonSet")[PLUGIN_DS]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "available-configs", "configMap": {"name": "kubegpu-configs"}} in volumes
    assert "annotations" not in by_kind(objs, "DaemonSet")[PLUGIN_DS]["spec"]["template"]["metadata"]


def test_health_port_switches_the_probes_to_http() -> None:
    ctr = plugin(render({"health": {"port": 8080}}))
    assert ctr["ports"] == [{"name": "health", "containerPort": 8080}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True} in ctr[
        "volumeMounts"
    ]


def test_runtime_class_is_created_on_request_and_kept_on_uninstall() -> None:
    assert not by_kind(render(), "RuntimeClass")
    rc = by_kind(render({"runtimeClass": {"create": True}}), "RuntimeClass")["nvidia"]
    assert rc["handler"] == "nvidia"
    assert rc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_names_follow_the_release() -> None:
    objs = render({"fullnameOverride": "gpu"})
    assert set(by_kind(objs, "DaemonSet")) == {"gpu-device-plugin"}
    other = render(release="prod", namespace="gpu")
    assert other[0]["metadata"]["name"] == "prod-kubegpu-device-plugin"
    assert other[0]["metadata"]["namespace"] == "gpu"


# ------------------------------------------------------------------------------------ node selection


def _term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for expr in term.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def schedulable_on(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    if not pod_spec.get("nodeSelector", {}).items() <= labels.items():
        return False
    required = pod_spec.get("affinity", {}).get("nodeAffinity", {})
    terms = required.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms")
    return terms is None or any(_term_matches(t, labels) for t in terms)


@pytest.mark.parametrize(
    ("labels", "lands"),
    [
        ({"nvidia.com/gpu.present": "true"}, True),  # labelled by hand, or by kubegpu labels / GFD
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),  # NFD saw an NVIDIA PCI device
        ({"feature.node.kubernetes.io/cpu-model.vendor_id": "NVIDIA"}, True),  # NFD on Tegra
        ({"kubernetes.io/os": "linux"}, False),  # fault 4: a GPU-less node never gets the plugin
        ({"nvidia.com/gpu.present": "false"}, False),
    ],
)
def test_the_daemonsets_only_land_on_gpu_nodes(labels: dict[str, str], lands: bool) -> None:
    objs = render({"gfd": {"enabled": True}}, set_files=CONFIG_FILES)
    for name, ds in by_kind(objs, "DaemonSet").items():
        spec = ds["spec"]["template"]["spec"]
        if name.endswith("mps-control-daemon"):
            labels = {**labels, "nvidia.com/mps.capable": "true"}  # and only on MPS nodes
        assert schedulable_on(spec, labels) is lands, name


# ------------------------------------------------------------------------- the probe used until issue 5


def _probe_code(directory: Path) -> str:
    cmd = plugin(render())["livenessProbe"]["exec"]["command"]
    assert cmd[:2] == ["python", "-c"] and cmd == plugin(render())["readinessProbe"]["exec"]["command"]
    return cmd[2].replace("/var/lib/kubelet/device-plugins", str(directory))


def test_socket_probe() -> None:
    # A short directory: AF_UNIX socket paths are limited to 107 bytes, and pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="kg-probe-") as tmp:
        _check_socket_probe(Path(tmp))


def _check_socket_probe(directory: Path) -> None:
    code = _probe_code(directory)

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)

    nothing = probe()
    assert nothing.returncode == 1 and "no nvidia-*.sock" in nothing.stderr
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(directory / "nvidia-gpu.sock"))
    server.listen()
    (directory / "kubelet.sock").touch()  # not ours: ignored
    try:
        assert probe().returncode == 0
    finally:
        server.close()
    stale = probe()  # the file is left behind by a killed plugin: nobody answers
    assert stale.returncode == 1 and "ConnectionRefusedError" in stale.stderr


def test_example_values_render() -> None:
    paths = example_values_files()
    for path, objs in zip(paths, render_each([{"files": [p]} for p in paths]), strict=True):
        assert by_kind(objs, "DaemonSet"), path.name
    assert yaml.safe_load((ROOT / "deployments/helm/examples/values-sharing.yaml").read_text())["gfd"][
        "enabled"
    ]


def install_notes(values: dict[str, Any], namespace: str) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` skips it); a client-side dry run needs no
    cluster."""
    out = helm(
        "install", "kubegpu", CHART, "-n", namespace, "--dry-run=client", "-f", "-", stdin=json.dumps(values)
    )
    return out.split("\nNOTES:\n", 1)[1]


def test_install_notes_render() -> None:
    for values, expect in (
        ({}, "rollout status ds/kubegpu-device-plugin"),
        ({"config": {"name": "cm"}}, "(configs in ConfigMap cm; nodes without the label get the fallback)"),
    ):
        text = install_notes(values, "gpu")
        assert expect in text and "kubectl -n gpu" in text
        assert text.startswith("kubegpu 0.1.0 is installed in namespace gpu.")


@pytest.fixture(scope="module", autouse=True)
def _rendered_side_by_side() -> None:
    """The value sets of the parametrized checks, rendered at once before the first check: each test then
    reads helm's output (or refusal) from render's cache instead of waiting for its own helm process."""
    cases = [{"values": values} for values, _ in SCHEMA_REFUSALS + ENV_VARS + SECURITY_CONTEXTS]
    cases += [{"values": values, "namespace": namespace} for values, namespace, _ in NVIDIA_REFUSALS]
    cases += [{"values": values} for values in DEFAULT_CONFIG_FOUND]
    cases += [{"values": values} for values in RENDERED_ONCE]
    cases += [
        {"values": {"gfd": {"enabled": True}}, "set_files": CONFIG_FILES},
        {"values": EVERYTHING, "set_files": CONFIG_FILES},
        {"values": {"allowDefaultNamespace": True}, "namespace": "default"},
        {"release": "prod", "namespace": "gpu"},
    ]
    prerender(cases)


# What the single checks above render with the default release and namespace (a value set missing here only
# costs time).
RENDERED_ONCE = [
    {},
    {"nvidiaDriverRoot": "/run/nvidia/driver"},
    {"config": {"name": "kubegpu-configs", "default": "default"}},
    {"health": {"port": 8080}},
    {"runtimeClass": {"create": True}},
    {"fullnameOverride": "gpu"},
]
