"""`kubegpu doctor` on fake host trees: a healthy GPU node, then each fault planted in turn."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.node.nvml.backend import load_nvml
from kubegpu.settings.env import NvmlSelection
from kubegpu.toolkit.cli import doctor
from kubegpu.toolkit.doctor.findings import Finding
from kubegpu.toolkit.doctor.node import doctor_node

CONTAINERD_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "nvidia"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/bin/nvidia-container-runtime"
"""


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    """A healthy 4x T4 node: driver, device nodes and /dev/char links, toolkit, containerd, sockets."""
    root = tmp_path / "host"
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.550.90.07").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.90.07")
    dev = root / "dev"
    (dev / "char").mkdir(parents=True)
    for minor, name in enumerate(["nvidia0", "nvidia1", "nvidia2", "nvidia3"]):
        (dev / name).touch()
        (dev / "char" / f"195:{minor}").symlink_to(f"../{name}")
    for name, numbers in (("nvidiactl", "195:255"), ("nvidia-uvm", "510:0")):
        (dev / name).touch()
        (dev / "char" / numbers).symlink_to(f"../{name}")
    (root / "usr/bin").mkdir(parents=True)
    for binary in ("nvidia-container-runtime", "nvidia-ctk", "nvidia-container-cli"):
        (root / "usr/bin" / binary).touch(mode=0o755)
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: nvidia-container-toolkit\nStatus: install ok\nVersion: 1.17.3-1\n"
    )
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(CONTAINERD_V2)
    plugins = root / "var/lib/kubelet/device-plugins"
    plugins.mkdir(parents=True, mode=0o750)
    (root / "var/lib/kubelet/config.yaml").write_text("kind: KubeletConfiguration\ncgroupDriver: systemd\n")
    sockets = []
    cwd = os.getcwd()
    os.chdir(plugins)  # a relative bind: tmp paths can exceed the 108-byte AF_UNIX limit
    try:
        for name in ("kubelet.sock", "nvidia-gpu.sock"):  # the kubelet first, then the plugin registers
            s = socket.socket(socket.AF_UNIX)
            s.bind(name)
            sockets.append(s)
    finally:
        os.chdir(cwd)
    old = time.time() - 60
    os.utime(plugins / "kubelet.sock", (old, old), follow_symlinks=False)
    yield root
    for s in sockets:
        s.close()


def problems(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        if f.status != "ok":
            out.setdefault(f.check, []).append(f)
    return out


T4 = load_nvml(NvmlSelection.fake("t4-pcie"))


def test_healthy_node_is_all_ok(host: Path) -> None:
    findings = doctor_node(host, nvml=T4, env={})
    assert problems(findings) == {}
    evidence = {f.check: f.evidence for f in findings}
    assert "4 GPU(s) (Tesla T4), driver 550.90.07" in evidence["nvml"]
    assert "version 1.17.3-1" in evidence["container-toolkit"]
    assert "nvidia runtime is the default; CDI enabled" in evidence["runtime-config"]


@pytest.mark.parametrize(
    ("profile", "words"), [("no-driver", "modprobe nvidia"), ("no-library", "libnvidia-ml")]
)
def test_nvml_failures_are_explained(host: Path, profile: str, words: str) -> None:
    found = problems(doctor_node(host, nvml=load_nvml(NvmlSelection.fake(profile)), env={}))
    (nvml,) = found["nvml"]
    assert nvml.status == "fail" and nvml.fault == 2 and words in nvml.fix


def test_missing_driver_files(host: Path) -> None:
    (host / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").unlink()
    (host / "dev/nvidiactl").unlink()
    found = problems(doctor_node(host, nvml=T4, env={}))
    assert found["libnvidia-ml"][0].fault == 2
    assert "missing /dev/nvidiactl" in found["device-nodes"][0].evidence


def test_dev_char_symlinks_missing_under_systemd_cgroups(host: Path) -> None:
    for link in (host / "dev/char").iterdir():
        if link.name.startswith("195:") and link.name != "195:255":
            link.unlink()
    (finding,) = problems(doctor_node(host, nvml=T4, env={}))["dev-char-symlinks"]
    assert finding.status == "fail" and finding.fault == 1
    assert (
        "nvidia0, nvidia1, nvidia2, nvidia3" in finding.evidence
        and "systemd cgroup driver" in finding.evidence
    )
    assert "create-dev-char-symlinks" in finding.fix


def test_runtime_not_default_and_toolkit_missing(host: Path) -> None:
    (host / "etc/containerd/config.toml").write_text(
        CONTAINERD_V2.replace('default_runtime_name = "nvidia"', 'default_runtime_name = "runc"')
    )
    (host / "usr/bin/nvidia-container-runtime").unlink()
    found = problems(doctor_node(host, nvml=T4, env={}))
    assert (
        found["runtime-config"][0].status == "warn"
        and "runtimeClassName: nvidia" in found["runtime-config"][0].fix
    )
    assert found["container-toolkit"][0].status == "fail" and found["container-toolkit"][0].fault == 1


def test_containerd_without_nvidia_and_docker(host: Path) -> None:
    (host / "etc/containerd/config.toml").write_text(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
    )
    (host / "etc/docker").mkdir()
    (host / "etc/docker/daemon.json").write_text(
        json.dumps({"runtimes": {"nvidia": {"path": "x"}}, "default-runtime": "nvidia"})
    )
    findings = doctor_node(host, nvml=T4, env={})
    runtime = [f for f in findings if f.check == "runtime-config"]
    assert [(f.status, f.object) for f in runtime] == [
        ("fail", "/etc/containerd/config.toml"),
        ("ok", "/etc/docker/daemon.json"),
    ]
    assert "CDI enabled" in runtime[0].evidence  # containerd 2.x default


def test_stale_registration_and_missing_socket(host: Path) -> None:
    plugins = host / "var/lib/kubelet/device-plugins"
    os.utime(plugins / "kubelet.sock", None, follow_symlinks=False)  # the kubelet restarted just now
    old = time.time() - 120
    os.utime(plugins / "nvidia-gpu.sock", (old, old), follow_symlinks=False)
    (finding,) = problems(doctor_node(host, nvml=T4, env={}))["plugin-sockets"]
    assert "older than kubelet.sock" in finding.evidence and finding.fault == 2
    (plugins / "nvidia-gpu.sock").unlink()
    (finding,) = problems(doctor_node(host, nvml=T4, env={}))["plugin-sockets"]
    assert "not serving" in finding.evidence


def test_plugin_dir_permissions_and_absence(host: Path) -> None:
    plugins = host / "var/lib/kubelet/device-plugins"
    plugins.chmod(0o500)
    try:
        (finding,) = problems(doctor_node(host, nvml=T4, env={}))["device-plugin-dir"]
        assert "mode 500" in finding.evidence and finding.fault == 4
    finally:
        plugins.chmod(0o750)


def test_cdi_configured_without_spec(host: Path) -> None:
    (finding,) = problems(doctor_node(host, nvml=T4, env={"DEVICE_LIST_STRATEGY": "cdi-cri"}))["cdi-spec"]
    assert finding.fault == 1 and "nvidia-ctk cdi generate" in finding.fix
    (host / "var/run/cdi").mkdir(parents=True)
    (host / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json").write_text(
        '{"kind": "k8s.device-plugin.nvidia.com/gpu"}'
    )
    assert "cdi-spec" not in problems(doctor_node(host, nvml=T4, env={"DEVICE_LIST_STRATEGY": "cdi-cri"}))


def test_cli_json_and_bad_root(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEGPU_FAKE_NVML", "t4-pcie")
    result = CliRunner().invoke(doctor, ["--host-root", str(host), "--json"])
    assert result.exit_code == 0, result.output
    assert {f["status"] for f in json.loads(result.output)["findings"]} == {"ok"}
    result = CliRunner().invoke(doctor, ["--host-root", str(host / "nope")])
    assert (result.exit_code, result.stdout) == (2, "")  # bad input, not a finding
    assert result.stderr == (
        f"error: --host-root {host / 'nope'} is not a directory: pass the directory where the host's "
        "filesystem is mounted, e.g. --host-root /host\n"
    )
