"""A kubeconfig of any wrong shape is one error naming the file, the field and the fix, before the
Kubernetes client indexes into it (where it failed with a TypeError, shown as an internal error)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.settings.kubeconfig import KubeconfigError, check_kubeconfig, load_configuration, shape_problem

GOOD = b"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
contexts:
- name: x
  context: {cluster: c, user: u}
users:
- name: u
  user: {token: t}
current-context: x
"""


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            "apiVersion: v1\n".encode("utf-16"),
            "is UTF-16 or UTF-32 text, which the Kubernetes client cannot read",
        ),
        (b"apiVersion: v1\n---\nkind: Config\n", "holds more than one YAML document; a kubeconfig is one"),
        (b"[1, 2]", "is a list, not a mapping of clusters, contexts and users"),
        (b"hello", "is a string, not a mapping of clusters, contexts and users"),
        (b"clusters: 5\n", "clusters is a number, not a list"),
        (b"contexts: x\n", "contexts is a string, not a list"),
        (b"users:\n- 7\n", "users[0] is a number, not a mapping with a name and a user"),
        (b"clusters:\n- name: [1]\n", "clusters[0].name is a list, not a string"),
        (b"contexts:\n- name: a\n  context: [1]\n", "contexts[0].context is a list, not a mapping"),
        (b"current-context: 3\n", "current-context is a number, not a string"),
        (b"preferences: []\n", "preferences is a list, not a mapping"),
    ],
)
def test_each_wrong_shape_is_named(tmp_path: Path, data: bytes, says: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(data)
    with pytest.raises(KubeconfigError) as err:
        load_configuration(str(path))
    assert str(err.value).startswith(f"invalid kubeconfig {path}: {says}")
    assert "\n" not in str(err.value)


def test_a_good_kubeconfig_passes(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(GOOD)
    check_kubeconfig(str(path))
    assert load_configuration(str(path)).host == "https://127.0.0.1:6443"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
sections = st.fixed_dictionaries(
    {},
    optional={
        "clusters": json_values,
        "contexts": json_values,
        "users": json_values,
        "current-context": json_values,
        "preferences": json_values,
    },
)


@given(sections)
def test_whatever_passes_the_shape_check_the_client_reads_without_a_type_error(value: dict) -> None:
    from kubernetes.config.kube_config import KubeConfigLoader

    if shape_problem(value) is not None:
        return
    try:
        KubeConfigLoader(config_dict=value)
    except Exception as err:  # the client's own ConfigException is fine: a sentence, not a crash
        assert type(err).__name__ == "ConfigException", repr(err)
