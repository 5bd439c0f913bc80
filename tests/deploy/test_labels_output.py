"""The labels DaemonSet and where its labels go: the node's NodeFeature object through the API server (GFD's
default, `gfd.useNodeFeatureAPI: true`) or NFD's features.d file on the host (`false`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import NAMESPACE, by_kind, containers, env, render

LABELS_DS = "kubegpu-labels"
LABELS_CTR = "kubegpu-labels-ctr"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"
# What the downward API gives the fieldRefs on some node.
DOWNWARD = {
    "spec.nodeName": "gpu-node-7",
    "metadata.namespace": NAMESPACE,
    "metadata.name": "kubegpu-labels-x7k2p",
}


def labels_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objs, "DaemonSet")[LABELS_DS]["spec"]["template"]["spec"]


def labels_ctr(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return containers(by_kind(objs, "DaemonSet")[LABELS_DS])[LABELS_CTR]


def host_paths(pod: dict[str, Any]) -> list[str]:
    return [v["hostPath"]["path"] for v in pod.get("volumes") or [] if "hostPath" in v]


def test_the_labels_go_to_the_node_feature_api_by_default() -> None:
    objs = render({"gfd": {"enabled": True}})
    ctr, pod = labels_ctr(objs), labels_pod(objs)
    assert env(ctr)["GFD_USE_NODE_FEATURE_API"] == "true"
    assert env(ctr)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env(ctr)["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env(ctr)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert host_paths(pod) == [] and "volumeMounts" not in ctr  # no host directory to write
    assert pod["serviceAccountName"] == "kubegpu-labels" and "automountServiceAccountToken" not in pod
    assert by_kind(objs, "ServiceAccount")["kubegpu-labels"]["metadata"]["namespace"] == NAMESPACE
    role = by_kind(objs, "Role")["kubegpu-labels"]
    assert role["metadata"]["namespace"] == NAMESPACE  # the namespace of NAMESPACE, not cluster-wide
    assert role["rules"] == [
        {
            "apiGroups": ["nfd.k8s-sigs.io"],
            "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    binding = by_kind(objs, "RoleBinding")["kubegpu-labels"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kubegpu-labels", "namespace": NAMESPACE}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "kubegpu-labels",
    }
    assert "ClusterRoleBinding" not in {o["kind"] for o in objs}  # no config map: no Nodes to read


def test_the_file_output_is_one_value_away() -> None:
    objs = render({"gfd": {"enabled": True, "useNodeFeatureAPI": False}})
    ctr, pod = labels_ctr(objs), labels_pod(objs)
    assert env(ctr)["GFD_USE_NODE_FEATURE_API"] == "false"
    assert "NAMESPACE" not in env(ctr) and "POD_NAME" not in env(ctr)
    assert host_paths(pod) == [FEATURES_D]
    assert ctr["volumeMounts"] == [{"name": "output-dir", "mountPath": FEATURES_D}]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert [o["kind"] for o in objs] == ["DaemonSet", "DaemonSet"]  # no account, no RBAC


def test_the_plugin_never_gets_the_labels_account() -> None:
    for values in ({"gfd": {"enabled": True}}, {"gfd": {"enabled": True}, "config": {"name": "cm"}}):
        plugin = by_kind(render(values), "DaemonSet")["kubegpu-device-plugin"]["spec"]["template"]["spec"]
        assert plugin.get("serviceAccountName") != "kubegpu-labels"


def started_settings(ctr: dict[str, Any]) -> Any:
    """The settings `kubegpu labels` starts with in this container: its command line parsed by the labels
    command, its env vars (the downward API filled in) read by the labels settings code."""
    from kubegpu.labels.cli import labels
    from kubegpu.labels.settings import given_flags, resolve_settings
    from kubegpu.settings.setting import LABELS
    from kubegpu.settings.table import for_command

    assert ctr["command"] == ["kubegpu", "labels"]
    params = labels.make_context("labels", list(ctr.get("args", []))).params
    environ = {}
    for name, value in env(ctr).items():
        if isinstance(value, dict):
            value = DOWNWARD[value["fieldRef"]["fieldPath"]]
        environ[name] = value
    cli = {s.name: params.get(s.key) for s in for_command(LABELS) if s.flag}
    return resolve_settings(given_flags(cli, environ))


@pytest.mark.parametrize("use_api", [True, False])
def test_the_labels_container_starts_with_what_the_chart_means(use_api: bool) -> None:
    settings = started_settings(labels_ctr(render({"gfd": {"enabled": True, "useNodeFeatureAPI": use_api}})))
    assert settings.use_node_feature_api is use_api
    if use_api:
        assert (settings.api.node_name, settings.api.namespace) == ("gpu-node-7", NAMESPACE)
        assert settings.api.pod_name == "kubegpu-labels-x7k2p"
        assert settings.api.kubeconfig == ""  # the in-cluster config: the pod's service account
    else:
        assert settings.output_file == FEATURES_D + "/gfd"


def test_a_config_files_choice_does_not_override_the_chart(tmp_path: Path) -> None:
    """The chart always sets GFD_USE_NODE_FEATURE_API: the RBAC and mounts it rendered are the ones used."""
    ctr = labels_ctr(render({"gfd": {"enabled": True}}))
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  useNodeFeatureAPI: false\n")
    ctr["env"].append({"name": "CONFIG_FILE", "value": str(config)})
    assert started_settings(ctr).use_node_feature_api is True


def test_the_role_grants_what_the_labeller_does(tmp_path: Path) -> None:
    """The labeller's requests (create, unchanged pass, update, its pod) against the simulated API server,
    as RBAC verbs per resource: exactly the Role's rules."""
    from kubegpu.apisim import ApiServerSim
    from kubegpu.labels.nodefeature import open_node_feature_output
    from kubegpu.labels.settings import ApiSettings

    with ApiServerSim() as api:
        out = open_node_feature_output(
            ApiSettings(
                node_name="gpu-node-7",
                namespace=NAMESPACE,
                pod_name="kubegpu-labels-x7k2p",
                kubeconfig=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            )
        )
        for count in ("8", "8", "7"):
            out.write({"nvidia.com/gpu.count": count})
        api.delete("nodefeatures", "nvidia-features-for-gpu-node-7", namespace=NAMESPACE)
        out.write({"nvidia.com/gpu.count": "7"})
        calls = list(api.calls)
    verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    used: dict[str, set[str]] = {}
    for call in calls:
        resource = (
            "nodefeatures" if "/nodefeatures" in call.path else "pods" if "/pods/" in call.path else None
        )
        assert resource is not None, call.path
        used.setdefault(resource, set()).add(verb[call.method])
    role = by_kind(render({"gfd": {"enabled": True}}), "Role")["kubegpu-labels"]
    granted = {rule["resources"][0]: set(rule["verbs"]) for rule in role["rules"]}
    assert used == granted == {"nodefeatures": {"get", "create", "update"}, "pods": {"get"}}
