"""The DRA driver's API access from a kubeconfig (kubectl's merge rules, relative paths, base64 data) or a
pod's service account, without the kubernetes client; every problem one line naming the cause and the fix."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubegpu.settings.kubeaccess import ApiAccess, in_cluster_access, load_access
from kubegpu.settings.kubeconfig import KubeconfigError

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def kubeconfig(path: Path, *, current: str | None = "ctx", **sections: list[dict[str, Any]]) -> Path:
    config: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", **sections}
    if current is not None:
        config["current-context"] = current
    path.write_text(json.dumps(config))
    return path


def test_the_current_context_names_cluster_and_user_with_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    path = tmp_path / "config"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: prod\n"
        "clusters:\n"
        "- name: prod\n  cluster:\n    server: https://10.0.0.1:6443/\n"
        "    certificate-authority: certs/ca.crt\n    tls-server-name: api.prod.test\n"
        "- name: other\n  cluster: {server: https://other:6443}\n"
        "contexts:\n- name: prod\n  context: {cluster: prod, user: node}\n"
        "users:\n- name: node\n  user:\n    client-certificate: certs/node.crt\n"
        f"    client-key-data: {base64.b64encode(b'KEY').decode()}\n    tokenFile: /var/run/token\n"
    )
    access = load_access(str(path))
    assert access == ApiAccess(
        server="https://10.0.0.1:6443",
        ca_file=str(tmp_path / "certs" / "ca.crt"),
        cert_file=str(tmp_path / "certs" / "node.crt"),
        key_data=b"KEY",
        token_file="/var/run/token",
        tls_server_name="api.prod.test",
        source=f"kubeconfig {path}, context 'prod'",
    )
    assert "KEY" not in repr(access)


def test_merged_files_first_one_wins_as_in_kubectl(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    a = kubeconfig(
        tmp_path / "a",
        current=None,
        clusters=[{"name": "c", "cluster": {"server": "https://first:6443"}}],
    )
    b = kubeconfig(
        tmp_path / "b" / "config",
        current="ctx",
        clusters=[{"name": "c", "cluster": {"server": "https://second:6443"}}],
        contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        users=[{"name": "u", "user": {"token": "t0k", "client-certificate": "node.crt"}}],
    )
    access = load_access(f"{a}{os.pathsep}{tmp_path / 'missing'}{os.pathsep}{b}")
    assert (access.server, access.token) == ("https://first:6443", "t0k")
    assert access.cert_file == str(tmp_path / "b" / "node.crt")  # relative to the file that holds it


def test_ca_and_client_data_are_base64(tmp_path: Path) -> None:
    cluster = {
        "server": "https://k:6443",
        "certificate-authority-data": base64.b64encode(PEM).decode(),
        "insecure-skip-tls-verify": True,
    }
    path = kubeconfig(
        tmp_path / "config",
        clusters=[{"name": "c", "cluster": cluster}],
        contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        users=[{"name": "u", "user": {"username": "admin", "password": "pw"}}],
    )
    access = load_access(str(path))
    assert (access.ca_data, access.insecure, access.username, access.password) == (PEM, True, "admin", "pw")


@pytest.mark.parametrize(
    ("sections", "current", "error"),
    [
        ({}, None, "kubeconfig {path} sets no current-context; set one (kubectl config use-context NAME)"),
        (
            {},
            "ctx",
            "kubeconfig {path}, context 'ctx': no context named 'ctx'; fix the context or the kubeconfig",
        ),
        (
            {"contexts": [{"name": "ctx", "context": {"cluster": "gone"}}]},
            "ctx",
            "kubeconfig {path}, context 'ctx': no cluster named 'gone'; fix the context or the kubeconfig",
        ),
        (
            {
                "contexts": [{"name": "ctx", "context": {"cluster": "c"}}],
                "clusters": [{"name": "c", "cluster": {}}],
            },
            "ctx",
            "kubeconfig {path}, context 'ctx': cluster 'c' has no server",
        ),
        (
            {
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": "https://k"}}],
                "users": [{"name": "u", "user": {"exec": {"command": "aws"}}}],
            },
            "ctx",
            "kubeconfig {path}, context 'ctx', user 'u' authenticates with exec, which the DRA driver does "
            "not run (it would run a program on every node); give the user a token, tokenFile or client "
            "certificate, or run the driver in a pod with its service account (no --kubeconfig)",
        ),
        (
            {
                "contexts": [{"name": "ctx", "context": {"cluster": "c"}}],
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://k", "certificate-authority-data": "!!"}}
                ],
            },
            "ctx",
            "kubeconfig {path}, context 'ctx': certificate-authority-data is not valid base64; fix or "
            "regenerate it",
        ),
        (
            {
                "contexts": [{"name": "ctx", "context": {"cluster": "c"}}],
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://k", "proxy-url": "http://proxy:3128"}}
                ],
            },
            "ctx",
            "kubeconfig {path}, context 'ctx': cluster 'c' sets proxy-url, which the DRA driver does not "
            "support; reach the API server directly (the driver runs on the cluster's nodes)",
        ),
        (
            {"clusters": [{"cluster": {"server": "https://k"}}]},
            "ctx",
            "invalid kubeconfig {path}: clusters[0].name is null, not a string; fix or regenerate it",
        ),
        (
            {"clusters": [{"name": "k", "cluster": None}]},
            "ctx",
            "invalid kubeconfig {path}: every entry of clusters needs a name and a cluster mapping",
        ),
    ],
)
def test_problems_are_one_line_with_the_fix(
    tmp_path: Path, sections: dict[str, Any], current: str | None, error: str
) -> None:
    path = kubeconfig(tmp_path / "config", current=current, **sections)
    with pytest.raises(KubeconfigError) as err:
        load_access(str(path))
    assert str(err.value) == error.format(path=path)


def test_a_missing_or_hostile_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError) as err:
        load_access(str(tmp_path / "nope"))
    assert str(err.value) == f"no kubeconfig found at {tmp_path / 'nope'}"
    bomb = tmp_path / "bomb"
    bomb.write_text(
        "a: &a [" + ", ".join(["x"] * 50) + "]\n" + "".join(f"b{i}: [*a, *a, *a]\n" for i in range(3000))
    )
    with pytest.raises(KubeconfigError) as err:
        load_access(str(bomb))
    assert str(err.value).startswith(f"invalid kubeconfig {bomb}: ")


def service_account(tmp_path: Path, token: bytes = b"tok\n", ca: bytes = PEM) -> Path:
    (tmp_path / "token").write_bytes(token)
    (tmp_path / "ca.crt").write_bytes(ca)
    return tmp_path


def test_in_cluster_uses_the_service_account_and_brackets_ipv6(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert load_access("", environ=env, service_account=sa) == ApiAccess(
        server="https://[fd00::1]:443",
        ca_file=str(sa / "ca.crt"),
        token_file=str(sa / "token"),
        source="in-cluster config",
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_access(env, sa).server == "https://10.96.0.1:443"


def test_in_cluster_problems(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError) as err:
        in_cluster_access({}, tmp_path)
    assert (
        str(err.value)
        == "not running in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeconfigError) as err:
        in_cluster_access(env, tmp_path)
    assert (
        str(err.value)
        == f"cannot read the service account token {tmp_path / 'token'}: No such file or directory"
    )
    with pytest.raises(KubeconfigError) as err:
        in_cluster_access(env, service_account(tmp_path, token=b"\n"))
    assert str(err.value) == f"the service account token {tmp_path / 'token'} is empty"


def test_in_cluster_loads_no_yaml_reader_and_no_kubernetes_client(tmp_path: Path) -> None:
    sa = service_account(tmp_path)
    script = (
        "import sys; from pathlib import Path\n"
        "from kubegpu.settings.kubeaccess import load_access\n"
        "env = {'KUBERNETES_SERVICE_HOST': '10.96.0.1', 'KUBERNETES_SERVICE_PORT': '443'}\n"
        f"load_access('', environ=env, service_account=Path({str(sa)!r}))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'kubernetes')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
