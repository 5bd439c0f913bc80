"""`make image-test`: build the image (scripts/image/build.sh, cached), load its OCI archive into a private
buildah storage as a node would import it, and run kubegpu in it for real:

1. the image's config (user 65532, the version and revision labels) and files (at most 350 MB, no shell,
   package manager, pip or compiler);
2. `kubegpu --version` as the image's default user, every shared object in the venv loads, and every
   command the manifests run (`kubegpu plugin`, `python -m kubegpu.mps run`, ...) answers --help;
3. `kubegpu plugin` as uid 0 on a read-only root filesystem with the fake NVML's 8-GPU profile and the
   device-plugin directory mounted, against `kubegpu kubelet-sim` outside the container (this repository's
   venv): the simulated kubelet must see capacity 8 / allocatable 8, and the plugin must stop cleanly;
4. `kubegpu doctor` in the image against the same node while the plugin serves;
5. `kubegpu labels --oneshot` as uid 0 on a read-only root, into a mounted features.d: nvidia.com/gpu.count=8;
6. `kubegpu dra` as uid 0 on a read-only root against the fake API server and the kubelet simulator's DRA
   side: it registers, publishes the 8 GPUs, prepares an allocated claim (a CDI spec appears), stops.

Every command runs on a read-only root filesystem (see Container). Everything the test starts (containers,
the storage, simulators, temporary directories) is removed at the end, whatever happened. Where no
builder can be installed (no apt-get, or not root) it says so loudly and exits 0; everywhere else a
failure is an error. Run it with the repository's venv (`make image-test`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from containers import Container, Daemon, Storage  # scripts/image/, this script's directory

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/kubegpu:{VERSION}"
ARCHIVE = ROOT / "dist" / f"kubegpu-{VERSION}.oci.tar"
MAX_IMAGE_BYTES = 350 * 1000 * 1000
NO_BUILDER = 3  # build.sh's exit status when no builder is here and none can be installed
FORBIDDEN_FILES = {"sh", "bash", "dash", "apt", "apt-get", "dpkg", "pip", "pip3", "gcc", "cc", "ld"}
PROFILE = "dgx-a100"  # the fake NVML's 8-GPU node
PLUGINS_IN_CONTAINER = "/var/lib/kubelet/device-plugins"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"


def step(message: str) -> None:
    print(f"image-test: {message}", flush=True)


def skip(reason: str) -> int:
    banner = "*" * 100
    print(f"{banner}\n*** image-test SKIPPED: {reason}\n*** The image was neither built nor run.\n{banner}")
    return 0


def check_config(storage: Storage) -> None:
    info = json.loads(storage("inspect", "--type", "image", IMAGE))
    config = info["OCIv1"]["config"]
    labels = config.get("Labels") or {}
    assert config.get("User") == "65532:65532", config.get("User")
    assert labels.get("org.opencontainers.image.version") == VERSION, labels
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    revision = git.stdout.strip()
    if revision:
        assert labels.get("org.opencontainers.image.revision") == revision, labels
    step(f"config: user 65532:65532, version {VERSION}, revision {revision[:12] or '-'}")


def check_files(container: Container) -> None:
    """The files of a container that has not run yet: the image, uncompressed. Its size, and no package
    manager, shell, compiler or installer among them."""
    paths = [Path(top) / name for top, _, files in os.walk(container.mountpoint) for name in files]
    size = sum(path.lstat().st_size for path in paths)
    assert size <= MAX_IMAGE_BYTES, f"the image is {size / 1e6:.0f} MB, over {MAX_IMAGE_BYTES / 1e6:.0f} MB"
    found = sorted(
        str(path.relative_to(container.mountpoint))
        for path in paths
        if path.name in FORBIDDEN_FILES or (path.parent.name == "pip" and path.name == "__init__.py")
    )
    assert found == [], f"the image holds what it must not: {found}"
    limit = MAX_IMAGE_BYTES / 1e6
    step(f"{size / 1e6:.0f} MB uncompressed (at most {limit:.0f}); no shell, apt, dpkg, pip, cc")


def check_version(container: Container) -> None:
    ran = container.run(["kubegpu", "--version"])
    assert ran.returncode == 0 and ran.stdout == f"kubegpu, version {VERSION}\n", ran
    whoami = container.run(["python3", "-c", "import os; print(os.getuid(), os.getgid())"])
    assert whoami.stdout == "65532 65532\n", whoami
    step(f"`kubegpu --version` as the default user (65532): {ran.stdout.strip()}")


def manifest_commands() -> list[list[str]]:
    """Every container command of the static manifests' DaemonSets (the chart renders the same)."""
    import yaml

    commands = set()
    for path in sorted((ROOT / "deployments/static").glob("*.yml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DaemonSet":
                spec = doc["spec"]["template"]["spec"]
                commands |= {tuple(c["command"]) for c in spec.get("initContainers", []) + spec["containers"]}
    return [list(c) for c in sorted(commands)]


def check_manifest_commands(container: Container) -> None:
    commands = manifest_commands()
    for command in commands:
        ran = container.run([*command, "--help"])
        assert ran.returncode == 0 and "Usage:" in ran.stdout, (command, ran.stdout, ran.stderr)
    names = ", ".join(" ".join(command) for command in commands)
    step(f"the {len(commands)} commands the manifests run answer --help: {names}")


# Loads every shared object in the venv (extension modules and the libraries wheels bundle): each of
# their NEEDED libraries must be in the image. Prints what fails to load.
LOAD_EVERY_LIBRARY = """
import ctypes, pathlib, sys
failed = []
for so in sorted(pathlib.Path(sys.prefix).rglob("*.so*")):
    try:
        ctypes.CDLL(str(so))
    except OSError as e:
        failed.append(str(e))
print("\\n".join(failed) or "ok", end="")
"""


def check_libraries(container: Container) -> None:
    ran = container.run(["python3", "-c", LOAD_EVERY_LIBRARY])
    assert ran.returncode == 0 and ran.stdout == "ok", f"libraries the image lacks:\n{ran.stdout}{ran.stderr}"
    step("every shared object in the venv loads (no library missing from the base)")


def node_status(line: str) -> dict[str, Any] | None:
    event = json.loads(line)
    return event["data"] if event["kind"] == "node-status" else None


def check_plugin_and_doctor(container: Container, tmp: Path) -> None:
    plugins = tmp / "host/var/lib/kubelet/device-plugins"
    plugins.mkdir(parents=True)
    # The fake NVML keeps its state in a directory, a temporary one unless told: on a read-only root there
    # is none, so it gets one mounted, as the tests give it theirs.
    nvml = tmp / "nvml"
    nvml.mkdir()
    fake_nvml = {"KUBEGPU_FAKE_NVML": PROFILE, "KUBEGPU_FAKE_NVML_STATE": str(nvml)}
    kubegpu = Path(sys.executable).parent / "kubegpu"  # this repository's, outside the container
    kubelet = Daemon("kubelet-sim (outside)", [str(kubegpu), "kubelet-sim", "--dir", str(plugins), "--json"])
    plugin: Daemon | None = None
    try:
        kubelet.wait_for(lambda line: json.loads(line)["kind"] == "kubelet-started", "kubelet-sim start")
        argv = container.argv(
            ["kubegpu", "plugin", "--pod-resources-socket", ""],
            user="0:0",
            env=fake_nvml,
            volumes=[(plugins, PLUGINS_IN_CONTAINER), (nvml, str(nvml))],
        )
        plugin = Daemon("kubegpu plugin (in the image)", argv)
        want = {"capacity": {"nvidia.com/gpu": 8}, "allocatable": {"nvidia.com/gpu": 8}}
        kubelet.wait_for(lambda line: node_status(line) == want, "capacity 8 / allocatable 8", plugin)
        step("`kubegpu plugin` (uid 0, read-only root): the kubelet simulator sees capacity 8, allocatable 8")

        doctor = container.run(
            ["kubegpu", "doctor", "--host-root", "/host", "--json"],
            user="0:0",
            env=fake_nvml,
            volumes=[(plugins, "/host" + PLUGINS_IN_CONTAINER), (nvml, str(nvml))],
        )
        report = json.loads(doctor.stdout)
        findings = {f["check"]: f for f in report["findings"]}
        # No driver, device nodes or container toolkit on this machine (exit 1); the node's GPUs (the fake
        # NVML), the kubelet's socket and the plugin's registration it must see.
        assert doctor.returncode == report["exit_code"] == 1, doctor
        assert findings["plugin-sockets"]["status"] == "ok", findings["plugin-sockets"]
        assert findings["nvml"]["status"] == "ok" and "8 GPU(s)" in findings["nvml"]["evidence"], findings
        assert findings["kubelet-socket"]["status"] == "ok", findings["kubelet-socket"]
        step(f"`kubegpu doctor` (uid 0, read-only root): {len(findings)} checks, NVML and kubelet socket ok")

        code = plugin.stop()
        assert code == 0, f"the plugin exited {code} on SIGTERM:\n{plugin.tail()}"
        assert "stopped; sockets removed" in plugin.tail(), plugin.tail()
        assert not (plugins / "nvidia-gpu.sock").exists()
        step("`kubegpu plugin` stopped on SIGTERM: exit 0, its socket removed")
    finally:
        if plugin is not None:
            plugin.stop()
        kubelet.stop()


def check_labels(container: Container, tmp: Path) -> None:
    """`kubegpu labels` once, into NFD's features.d as with gfd.useNodeFeatureAPI=false."""
    features, nvml = tmp / "features.d", tmp / "labels-nvml"
    features.mkdir()
    nvml.mkdir()
    ran = container.run(
        ["kubegpu", "labels", "--oneshot", "true", "--use-node-feature-api", "false"],
        user="0:0",
        env={
            "KUBEGPU_FAKE_NVML": PROFILE,
            "KUBEGPU_FAKE_NVML_STATE": str(nvml),
            "GFD_OUTPUT_FILE": f"{FEATURES_D}/gfd",
        },
        volumes=[(features, FEATURES_D), (nvml, str(nvml))],
    )
    assert ran.returncode == 0, ran
    labels = (features / "gfd").read_text().splitlines()
    assert "nvidia.com/gpu.count=8" in labels, labels
    step(f"`kubegpu labels` (uid 0, read-only root): {len(labels)} labels, nvidia.com/gpu.count=8")


async def check_dra(container: Container) -> None:
    from kubegpu.demo.dranode import DRIVER, SimulatedDraNode, claim_pod

    async with SimulatedDraNode(profile=PROFILE) as node:
        # The driver's settings as the chart gives them; the node's host paths are the same inside.
        env = {k: v for k, v in node.env.items() if k not in os.environ or os.environ[k] != v}
        driver = Daemon(
            "kubegpu dra (in the image)",
            container.argv(
                ["kubegpu", "dra", "-v"],
                user="0:0",
                env=env,
                volumes=[(node.root, str(node.root))],
            ),
        )
        try:
            await node.wait_registered()
            await node.wait(lambda: len(node.published()) == 8 or driver.proc.poll() is not None, "8 devices")
            assert len(node.published()) == 8, driver.tail()
            step("`kubegpu dra` (uid 0, read-only root): registered with the kubelet, published 8 GPUs")
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one-gpu", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            }
            pod = claim_pod("smoke", "one-gpu")
            node.allocate(claim, pod)
            assert node.sim is not None
            await node.sim.admit(pod)
            specs = list(node.cdi.glob("*.json")) + list(node.cdi.glob("*.yaml"))
            prepared = [c for c in node.sim.dra_claims() if c.prepared]
            assert prepared and specs, f"no prepared claim or CDI spec:\n{driver.tail()}"
            step(f"`kubegpu dra` prepared an allocated claim: CDI spec {specs[0].name}")
            code = driver.stop()
            assert code == 0, f"the DRA driver exited {code} on SIGTERM:\n{driver.tail()}"
        finally:
            driver.stop()


def main() -> int:
    if os.geteuid() != 0:
        return skip("needs root (buildah, mount namespaces); run `make image-test` as root")
    started = time.monotonic()
    built = subprocess.run([str(ROOT / "scripts/image/build.sh")], cwd=ROOT)
    if built.returncode == NO_BUILDER:
        return skip("no OCI builder here and none can be installed (see the message above)")
    if built.returncode != 0:
        return built.returncode
    step(f"built {IMAGE} and {ARCHIVE.relative_to(ROOT)} in {time.monotonic() - started:.0f}s")
    # The archive is run with buildah whichever builder made it (docker or podman, where present).
    installed = subprocess.run([str(ROOT / "scripts/image/install-builder.sh")])
    if installed.returncode == NO_BUILDER:
        return skip("the image was built, but buildah, which runs it here, cannot be installed")
    if installed.returncode != 0:
        return installed.returncode

    tested = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kgimg-", dir="/tmp"))  # unix socket paths must stay short
    storage = Storage(tmp)
    try:
        storage("pull", "--quiet", f"oci-archive:{ARCHIVE}")
        step(f"loaded {ARCHIVE.name} into a private storage")
        check_config(storage)
        container = storage.container(IMAGE)
        check_files(container)
        check_version(container)
        check_libraries(container)
        check_manifest_commands(container)
        check_plugin_and_doctor(container, tmp)
        check_labels(container, tmp)
        asyncio.run(check_dra(container))
    finally:
        storage.close()
        shutil.rmtree(tmp, ignore_errors=True)
    step(f"passed in {time.monotonic() - tested:.0f}s (build {tested - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
