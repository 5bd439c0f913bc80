"""The real `helm` the deployment tests and `make static` run, and the real `kubectl` the kubectl-plugin
tests run `kubectl gpu` with, installed into the venv from a pinned wheel.

Usage: python scripts/helm_binary.py [--bin-dir DIR]     # default: this Python's venv bin/ (.venv/bin)

Helm publishes no Python package, but the AWS CDK's kubectl Lambda layer wheels carry the official static
helm and kubectl builds (requirements/helm.in says which). The wheel is downloaded without its dependencies,
checked against the sha256 in requirements/helm.txt, and only helm/helm and kubectl/kubectl are extracted
from it: wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl. Nothing is done
when DIR/helm already is HELM_VERSION and DIR/kubectl KUBECTL_VERSION. The binaries are linux/amd64 only;
elsewhere this fails and says so.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "requirements/helm.txt"
HELM_VERSION = "v4.3.1"  # what the wheel pinned in requirements/helm.txt carries
KUBECTL_VERSION = "v1.37.1"  # ... and its kubectl
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
KUBECTL_IN_LAYER = "kubectl/kubectl"


class HelmUnavailable(RuntimeError):
    """No usable helm: the message says why and how to get one."""


def default_bin_dir() -> Path:
    return Path(sys.prefix) / "bin"


def version(helm: Path) -> str | None:
    try:
        proc = subprocess.run(
            [helm, "version", "--template", "{{.Version}}"], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def kubectl_version(kubectl: Path) -> str | None:
    try:
        proc = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, timeout=30)
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    return str(json.loads(proc.stdout)["clientVersion"]["gitVersion"])


def find_kubectl(bin_dir: Path | None = None) -> Path:
    """The venv's kubectl, or HelmUnavailable saying how to install it."""
    kubectl = (bin_dir or default_bin_dir()) / "kubectl"
    found = kubectl_version(kubectl) if kubectl.exists() else None
    if found != KUBECTL_VERSION:
        raise HelmUnavailable(
            f"{kubectl} is {'kubectl ' + found if found else 'missing'}, not kubectl {KUBECTL_VERSION}, the "
            f"one in the wheel pinned in requirements/helm.txt: install it with `make .venv/bin/kubegpu` (or "
            f"`{sys.executable} scripts/helm_binary.py`)"
        )
    return kubectl


def find(bin_dir: Path | None = None) -> Path:
    """The venv's helm, or HelmUnavailable saying how to install it."""
    helm = (bin_dir or default_bin_dir()) / "helm"
    if not helm.exists():
        raise HelmUnavailable(
            f"{helm} does not exist: the deployment checks run the real helm {HELM_VERSION}. Install it with "
            f"`make .venv/bin/kubegpu` (or `{sys.executable} scripts/helm_binary.py`), which takes it from "
            f"the wheel pinned in requirements/helm.txt"
        )
    found = version(helm)
    if found != HELM_VERSION:
        raise HelmUnavailable(
            f"{helm} is helm {found or '(does not run)'}, not {HELM_VERSION}, the one pinned in "
            f"requirements/helm.txt: reinstall it with `{sys.executable} scripts/helm_binary.py`"
        )
    return helm


def download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(PINS), "-d", str(into)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise HelmUnavailable(
            f"could not download the wheel that carries helm ({PINS.relative_to(ROOT)}); the deployment "
            f"checks cannot run without it.\n{proc.stderr.strip()}"
        )
    return wheels[0]


def extract(wheel: Path, names: tuple[str, ...] = (HELM_IN_LAYER, KUBECTL_IN_LAYER)) -> dict[str, bytes]:
    """The named files of the wheel's layer, and nothing else of it."""
    with zipfile.ZipFile(wheel) as whl:
        (bundle,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with whl.open(bundle) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
            for member in tgz:
                if member.name == LAYER_ZIP:
                    layer = tgz.extractfile(member)
                    assert layer is not None
                    with zipfile.ZipFile(io.BytesIO(layer.read())) as zipped:
                        return {name: zipped.read(name) for name in names}
    raise HelmUnavailable(f"{wheel.name} has no {LAYER_ZIP}: not the wheel requirements/helm.in describes")


def extract_helm(wheel: Path) -> bytes:
    return extract(wheel, (HELM_IN_LAYER,))[HELM_IN_LAYER]


def _place(binary: bytes, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, target)


def install(bin_dir: Path) -> Path:
    helm, kubectl = bin_dir / "helm", bin_dir / "kubectl"
    helm_ok = helm.exists() and version(helm) == HELM_VERSION
    kubectl_ok = kubectl.exists() and kubectl_version(kubectl) == KUBECTL_VERSION
    if helm_ok and kubectl_ok:
        return helm
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise HelmUnavailable(
            f"the helm in {PINS.relative_to(ROOT)} is built for linux/amd64 only, and this is "
            f"{platform.system()}/{platform.machine()}: the deployment checks cannot run here"
        )
    with tempfile.TemporaryDirectory(prefix="kubegpu-helm-") as tmp:
        binaries = extract(download_wheel(Path(tmp)))
    _place(binaries[HELM_IN_LAYER], helm)
    _place(binaries[KUBECTL_IN_LAYER], kubectl)
    find_kubectl(bin_dir)
    return find(bin_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", type=Path, default=default_bin_dir())
    args = ap.parse_args(argv)
    try:
        helm = install(args.bin_dir)
    except HelmUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{helm}: helm {HELM_VERSION}; {helm.with_name('kubectl')}: kubectl {KUBECTL_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
