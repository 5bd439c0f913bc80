"""Least privilege in what the chart renders: a seccomp profile for every container, uid 0 only where a
root-owned host directory or a signal needs it (and then without capabilities), the HTTP endpoint on a
chosen address, and the CDI directory mounted exactly when the plugin may write CDI specs."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    CONFIG_FILES,
    ROOT,
    by_kind,
    containers,
    env,
    example_values_files,
    prerender,
    render,
)

PLUGIN_DS = "kubegpu-device-plugin"
PLUGIN_CTR = "kubegpu-device-plugin-ctr"
POD_IP = "10.244.3.17"  # what the downward API would give status.podIP on some node
NODE_NAME = "gpu-node-3"  # ... and spec.nodeName


def plugin_ds(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objs, "DaemonSet")[PLUGIN_DS]


def plugin(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return containers(plugin_ds(objs))[PLUGIN_CTR]


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def every_container(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(DaemonSet name, its pod spec, container) for every init and regular container."""
    for name, ds in by_kind(objs, "DaemonSet").items():
        spec = pod_spec(ds)
        for ctr in (spec.get("initContainers") or []) + spec["containers"]:
            yield name, spec, ctr


def effective(spec: dict[str, Any], ctr: dict[str, Any], field: str) -> Any:
    """A security context field as the kubelet applies it: the container's, else the pod's."""
    own = ctr.get("securityContext") or {}
    return own[field] if field in own else (spec.get("securityContext") or {}).get(field)


def image_user() -> int:
    """The uid the Dockerfile's USER gives every container that sets none."""
    users = re.findall(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert len(users) == 1, users
    return int(users[0][0])


# Value sets that between them render every container the chart has, in each of its security contexts.
EVERYTHING_ON = {"gfd": {"enabled": True}, "health": {"port": 8080}, "deviceListStrategy": "envvar,cdi-cri"}
RENDERINGS: list[dict[str, Any]] = [
    {},
    {"values": EVERYTHING_ON, "set_files": CONFIG_FILES},
    {"values": {**EVERYTHING_ON, "compatWithCPUManager": True}, "set_files": CONFIG_FILES},
    {"values": {"gfd": {"enabled": True}, "migStrategy": "mixed", "mps": {"enableHostPID": False}}},
    {"values": {"health": {"port": 8080, "address": "127.0.0.1"}}},
    {"values": {**EVERYTHING_ON, "dra": {"enabled": True}}, "set_files": CONFIG_FILES},
    *({"files": [p], "set_files": CONFIG_FILES} for p in example_values_files()),
]

# Every container, and whether it runs as uid 0 (written out here and in docs/install.md, with the reason).
ROOT_CONTAINERS = {
    "kubegpu-device-plugin-ctr",  # sockets in the kubelet's root:root 0750 device-plugins directory
    "kubegpu-device-plugin-sidecar",  # SIGHUP to the plugin: same uid, no CAP_KILL
    "kubegpu-labels-ctr",  # NFD's features.d, root:root 0755
    "kubegpu-labels-sidecar",  # SIGHUP to the labels daemon
    "mps-control-daemon-mounts",  # privileged: mounts a tmpfs with Bidirectional propagation
    "mps-control-daemon-ctr",  # privileged: compute mode, nvidia-cuda-mps-control (NVIDIA's rule)
    "mps-control-daemon-sidecar",  # SIGHUP to the MPS daemon
    "kubegpu-dra-ctr",  # sockets in the kubelet's root:root 0750 plugins_registry and plugins directories
}
NON_ROOT_CONTAINERS = {
    "kubegpu-device-plugin-init",  # the config-manager, oneshot: the API and the shared volumes only
    "kubegpu-labels-init",
    "mps-control-daemon-init",
}


def rendered() -> list[list[dict[str, Any]]]:
    prerender(RENDERINGS)
    return [render(**case) for case in RENDERINGS]


def test_every_container_runs_under_the_runtimes_seccomp_profile() -> None:
    seen = set()
    for objs in rendered():
        for ds, spec, ctr in every_container(objs):
            profile = effective(spec, ctr, "seccompProfile")
            assert profile == {"type": "RuntimeDefault"}, (ds, ctr["name"], profile)
            seen.add(ctr["name"])
    assert seen == ROOT_CONTAINERS | NON_ROOT_CONTAINERS  # every container was looked at


def test_seccomp_is_kept_when_nvidia_values_replace_the_security_contexts() -> None:
    """NVIDIA's values set the containers' securityContext verbatim; the pod's profile still applies."""
    objs = render({"securityContext": {"privileged": True}, "gfd": {"enabled": True, "securityContext": {}}})
    for ds, spec, ctr in every_container(objs):
        assert effective(spec, ctr, "seccompProfile") == {"type": "RuntimeDefault"}, (ds, ctr["name"])
        assert effective(spec, ctr, "runAsUser") == 0, (ds, ctr["name"])  # still the kubelet's dirs' owner


def test_uid_0_only_where_a_root_owned_directory_or_a_signal_needs_it() -> None:
    nobody = image_user()
    assert nobody != 0
    for objs in rendered():
        for ds, spec, ctr in every_container(objs):
            name = ctr["name"]
            uid = effective(spec, ctr, "runAsUser")
            uid = nobody if uid is None else uid
            if name in NON_ROOT_CONTAINERS:
                assert uid == nobody, (ds, name, uid)
                assert effective(spec, ctr, "runAsNonRoot") is True, (ds, name)  # the kubelet enforces it
                assert effective(spec, ctr, "runAsGroup") == nobody, (ds, name)
            else:
                assert name in ROOT_CONTAINERS and uid == 0, (ds, name, uid)


def test_root_containers_hold_no_capabilities_but_the_ones_nvidias_rules_give() -> None:
    """uid 0 for ownership, not for power: every capability dropped, unless the container is privileged
    (MPS, compatWithCPUManager) or NVIDIA's rule adds SYS_ADMIN (MIG, volume-mounts)."""
    for objs in rendered():
        for ds, _, ctr in every_container(objs):
            context = ctr.get("securityContext") or {}
            if context.get("privileged"):
                assert ctr["name"] in {PLUGIN_CTR, "mps-control-daemon-mounts", "mps-control-daemon-ctr"}
                continue
            assert context["capabilities"]["drop"] == ["ALL"], (ds, ctr["name"])
            assert context["capabilities"].get("add", ["SYS_ADMIN"]) == ["SYS_ADMIN"], (ds, ctr["name"])
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True


def test_the_non_root_uid_is_the_images_user() -> None:
    """The chart names the Dockerfile's USER; they must not drift apart."""
    objs = render(set_files=CONFIG_FILES)
    init = containers(plugin_ds(objs), init=True)["kubegpu-device-plugin-init"]
    assert init["securityContext"]["runAsUser"] == image_user() == 65532


# ------------------------------------------------------------------------------------------ CDI


def plugin_settings(ctr: dict[str, Any]) -> Any:
    """The settings `kubegpu plugin` would start with in this container: its command line parsed by the
    plugin's click command, its env vars (the downward API's pod IP filled in) read by the plugin's
    settings code."""
    from kubegpu.plugin.cli import plugin_cmd
    from kubegpu.settings.given import read_given
    from kubegpu.settings.plugin import resolve
    from kubegpu.settings.setting import PLUGIN
    from kubegpu.settings.table import for_command

    assert ctr["command"][:2] == ["kubegpu", "plugin"]
    params = plugin_cmd.make_context("plugin", [*ctr["command"][2:], *ctr.get("args", [])]).params
    environ = {}
    downward = {"status.podIP": POD_IP, "spec.nodeName": NODE_NAME}
    for name, value in env(ctr).items():
        if isinstance(value, dict):
            assert value["fieldRef"]["fieldPath"] in downward, (name, value)
            value = downward[value["fieldRef"]["fieldPath"]]
        environ[name] = value
    settings = for_command(PLUGIN)
    return resolve(read_given(settings, {s.name: params.get(s.key) for s in settings if s.flag}, environ))


CDI_VOLUME = {"name": "cdi-root", "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}}
CDI_MOUNT = {"name": "cdi-root", "mountPath": "/var/run/cdi"}

CDI_STRATEGIES = [
    ("cdi-annotations", True),
    ("cdi-cri", True),
    ("envvar,cdi-cri", True),
    ("envvar,cdi-annotations", True),
    ("cdi-annotations,cdi-cri", True),
    ("volume-mounts,cdi-cri", True),
    ("envvar,volume-mounts,cdi-annotations,cdi-cri", True),
    ("envvar", False),
    ("volume-mounts", False),
    ("envvar,volume-mounts", False),
    (None, False),  # the plugin's default: envvar
]


@pytest.mark.parametrize(("strategy", "cdi"), CDI_STRATEGIES)
def test_the_cdi_directory_is_mounted_exactly_when_a_cdi_strategy_is_chosen(
    strategy: str | None, cdi: bool
) -> None:
    objs = render({"deviceListStrategy": strategy})
    ctr = plugin(objs)
    volumes = pod_spec(plugin_ds(objs))["volumes"]
    settings = plugin_settings(ctr)
    if not cdi:
        assert "KUBEGPU_CDI_ROOT" not in env(ctr)
        assert all(v["name"] != "cdi-root" for v in volumes)  # no writable host directory for nothing
        assert not {"cdi-annotations", "cdi-cri"} & set(settings.device_list_strategies)
        return
    assert CDI_VOLUME in volumes
    assert CDI_MOUNT in ctr["volumeMounts"]  # writable: the plugin writes its specs there
    # Where the plugin writes, as its settings read the chart's env: the mounted host directory, which
    # containerd and CRI-O read CDI specs from.
    assert env(ctr)["KUBEGPU_CDI_ROOT"] == "/var/run/cdi"
    assert settings.env.cdi_root == Path("/var/run/cdi")
    assert set(strategy.split(",")) == set(settings.device_list_strategies)


@pytest.mark.parametrize(("strategy", "cdi"), [(None, True), ("cdi-cri", True), ("envvar", False)])
def test_with_a_config_map_the_cdi_directory_follows_what_a_config_may_choose(
    strategy: str | None, cdi: bool
) -> None:
    """A config file's deviceListStrategy applies unless the env var is set (NVIDIA's precedence), so with
    the env var unset any config may pick a CDI strategy."""
    objs = render({"deviceListStrategy": strategy}, set_files=CONFIG_FILES)
    ctr = plugin(objs)
    assert (CDI_MOUNT in ctr["volumeMounts"]) is cdi
    assert (CDI_VOLUME in pod_spec(plugin_ds(objs))["volumes"]) is cdi
    assert (env(ctr).get("KUBEGPU_CDI_ROOT") == "/var/run/cdi") is cdi


def test_only_the_plugin_gets_the_cdi_directory() -> None:
    objs = render({**EVERYTHING_ON, "deviceListStrategy": "cdi-cri"}, set_files=CONFIG_FILES)
    for name, ds in by_kind(objs, "DaemonSet").items():
        has = any(v["name"] == "cdi-root" for v in pod_spec(ds)["volumes"])
        assert has is (name == PLUGIN_DS), name


def test_the_dra_driver_gets_the_cdi_directory_and_the_kubelets_plugin_directories_only() -> None:
    """It writes one CDI spec per prepared claim and serves its sockets in the kubelet's directories:
    nothing else of the host (no device-plugins directory, no PodResources, no /dev)."""
    objs = render({**EVERYTHING_ON, "dra": {"enabled": True}}, set_files=CONFIG_FILES)
    spec = pod_spec(by_kind(objs, "DaemonSet")["kubegpu-dra"])
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]} == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugins": "/var/lib/kubelet/plugins",
        "cdi-root": "/var/run/cdi",
    }
    assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")
    # Its token is the only one in the chart that may write ResourceSlices.
    assert spec["serviceAccountName"] == "kubegpu-dra"


# ------------------------------------------------------------------------------------ HTTP endpoint


def test_the_http_endpoint_listens_on_the_pods_ip_by_default() -> None:
    """The one address both the kubelet's httpGet probes (they connect to the pod's IP) and Prometheus'
    pod discovery (__meta_kubernetes_pod_ip) use; never every interface."""
    ctr = plugin(render({"health": {"port": 8080}}))
    assert env(ctr)["KUBEGPU_HTTP_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    settings = plugin_settings(ctr)
    assert (settings.http_address, settings.http_port) == (POD_IP, 8080)
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}  # no host: the pod IP
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_without_a_port_there_is_no_endpoint_and_no_podresources_socket() -> None:
    objs = render()
    ctr = plugin(objs)
    assert not {"KUBEGPU_HTTP_PORT", "KUBEGPU_HTTP_ADDRESS"} & set(env(ctr))
    assert plugin_settings(ctr).http_port == 0
    assert all(v["name"] != "pod-resources" for v in pod_spec(plugin_ds(objs))["volumes"])


def test_an_address_given_is_used_as_is() -> None:
    ctr = plugin(render({"health": {"port": 9400, "address": "0.0.0.0"}}))
    assert env(ctr)["KUBEGPU_HTTP_ADDRESS"] == "0.0.0.0"
    assert plugin_settings(ctr).http_address == "0.0.0.0"
    assert ctr["livenessProbe"]["httpGet"]["port"] == "health"


def test_the_pod_device_metric_can_be_turned_off() -> None:
    on = render({"health": {"port": 8080}})
    mount = {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    assert mount in plugin(on)["volumeMounts"]
    # The plugin's default socket lies in that read-only mount.
    assert plugin_settings(plugin(on)).pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    off = render({"health": {"port": 8080, "podDeviceInfo": False}})
    ctr = plugin(off)
    assert ctr["args"] == ["--pod-resources-socket="]
    assert plugin_settings(ctr).pod_resources_socket == ""  # the daemon then reads no PodResources
    assert all(m["name"] != "pod-resources" for m in ctr["volumeMounts"])
    assert all(v["name"] != "pod-resources" for v in pod_spec(plugin_ds(off))["volumes"])


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("::1", "http://[::1]:8080"),
        ("localhost", "http://localhost:8080"),
    ],
)
def test_a_loopback_address_moves_the_probes_into_the_container(address: str, url: str) -> None:
    ctr = plugin(render({"health": {"port": 8080, "address": address}}))
    assert env(ctr)["KUBEGPU_HTTP_ADDRESS"] == address
    assert "ports" not in ctr  # nothing outside the pod can reach it
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        command = ctr[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"] and command[3] == url + path, command
        assert "httpGet" not in ctr[probe]


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """Answers like the plugin's endpoint: 200 on /healthz, 503 with its reason on /readyz."""

    def do_GET(self) -> None:
        status, body = (200, b"ok\n") if self.path == "/healthz" else (503, b"not ready: nvidia.com/gpu\n")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_loopback_probe_passes_on_200_and_fails_on_anything_else() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ctr = plugin(render({"health": {"port": port, "address": "127.0.0.1"}}))

        def probe(kind: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            _, _, code, url = ctr[kind]["exec"]["command"]
            environ = {"http_proxy": "http://192.0.2.1:3128", **(env_extra or {})}  # must be ignored
            return subprocess.run(
                [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=30, env=environ
            )

        alive = probe("livenessProbe")
        assert alive.returncode == 0, alive.stderr
        ready = probe("readinessProbe")
        assert ready.returncode == 1
        assert f"GET http://127.0.0.1:{port}/readyz: HTTP Error 503" in ready.stderr
        assert "not ready: nvidia.com/gpu" in ready.stderr  # the endpoint's reason reaches the pod's events
    finally:
        server.shutdown()
        server.server_close()
    gone = probe("livenessProbe")  # nothing listens any more
    assert gone.returncode == 1 and "Connection refused" in gone.stderr and "Traceback" not in gone.stderr


@pytest.mark.parametrize("address", ["a b", "\t"])
def test_an_address_with_spaces_is_refused(address: str) -> None:
    from .conftest import HelmError

    with pytest.raises(HelmError, match="at '/health/address'"):
        render({"health": {"port": 8080, "address": address}})


# ------------------------------------------------------------ the reasons, on this machine's kernel

SETPRIV = shutil.which("setpriv") or "setpriv"
needs_root = pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")),
    reason="needs uid 0 and util-linux setpriv to run commands as other users without capabilities",
)


def run_as(uid: int, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -c code args` as `uid` with no capabilities at all, as the chart's containers run."""
    drop = ["--inh-caps=-all", "--bounding-set=-all", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return subprocess.run(
        [SETPRIV, *drop, sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


@needs_root
def test_the_uids_the_chart_picks_are_the_ones_the_host_permissions_need() -> None:
    """With the users the chart gives each container and no capabilities: the daemon can serve in and
    connect to the kubelet's root-only directory and the init container could not; the init container's
    config link is replaced by the sidecar and read by the daemon; the sidecar can signal the daemon and
    the init container's user could not."""
    objs = render(set_files=CONFIG_FILES)
    spec = pod_spec(plugin_ds(objs))
    uid_of = {
        c["name"]: effective(spec, c, "runAsUser")
        for c in (spec["initContainers"] or []) + spec["containers"]
    }
    daemon, sidecar = uid_of[PLUGIN_CTR], uid_of["kubegpu-device-plugin-sidecar"]
    init = uid_of["kubegpu-device-plugin-init"]
    host = Path(tempfile.mkdtemp(prefix="kg-uids-"))
    try:
        host.chmod(0o755)
        plugins = host / "device-plugins"  # the kubelet's: root:root 0750, with its root-owned socket
        plugins.mkdir(mode=0o750)
        kubelet = socket.socket(socket.AF_UNIX)
        kubelet.bind(str(plugins / "kubelet.sock"))
        kubelet.listen()
        serve = (
            "import socket, sys; d = sys.argv[1]; s = socket.socket(socket.AF_UNIX); "
            "s.bind(d + '/nvidia-gpu-' + sys.argv[2] + '.sock'); "
            "socket.socket(socket.AF_UNIX).connect(d + '/kubelet.sock')"
        )
        assert run_as(daemon, serve, str(plugins), "daemon").returncode == 0
        refused = run_as(init, serve, str(plugins), "init")
        assert "PermissionError" in refused.stderr, refused.stderr  # why the plugin is not non-root

        available, config = host / "available-configs", host / "config"  # ConfigMap volume, emptyDir
        available.mkdir(mode=0o755)
        config.mkdir()
        config.chmod(0o777)
        for name in ("a", "b"):
            (available / name).write_text(f"version: v1 # {name}\n")
        link = (
            "import sys; from kubegpu.configmanager.symlink import update_symlink; "
            "update_symlink(sys.argv[2], sys.argv[1], sys.argv[3])"
        )
        dst = str(config / "config.yaml")
        assert run_as(init, link, str(available), "a", dst).returncode == 0
        relinked = run_as(sidecar, link, str(available), "b", dst)
        assert relinked.returncode == 0, relinked.stderr
        read = run_as(daemon, "import sys; print(open(sys.argv[1]).read(), end='')", dst)
        assert read.stdout == "version: v1 # b\n", read.stderr

        hup = "import os, signal, sys; os.kill(int(sys.argv[1]), signal.SIGHUP)"
        target = subprocess.Popen(
            [SETPRIV, f"--reuid={daemon}", f"--regid={daemon}", "--clear-groups", "sleep", "60"]
        )
        try:
            denied = run_as(init, hup, str(target.pid))
            assert "PermissionError" in denied.stderr, denied.stderr  # why the sidecar is not non-root
            assert run_as(sidecar, hup, str(target.pid)).returncode == 0
            assert target.wait(timeout=30) == -signal.SIGHUP
        finally:
            target.kill()
            target.wait()
        kubelet.close()
    finally:
        shutil.rmtree(host)
