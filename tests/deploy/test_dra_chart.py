"""The chart's DRA part (dra.enabled): the `kubegpu dra` DaemonSet with NVIDIA's DRA driver's settings,
NVIDIA's DeviceClasses, RBAC limited to what the driver does, the policy that keeps a node's driver to
its own node's ResourceSlices, and the device plugin leaving DRA's GPUs alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.configcheck.dra import check_driver

from .conftest import (
    CHART,
    NAMESPACE,
    HelmError,
    by_kind,
    containers,
    env,
    helm,
    render,
    value_args,
)

DRA_DS = "kubegpu-dra"
DRA_CTR = "kubegpu-dra-ctr"
ON = {"dra": {"enabled": True}}


def dra_ds(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(objs, "DaemonSet")[DRA_DS]


def dra(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return containers(dra_ds(objs))[DRA_CTR]


def test_off_by_default_renders_nothing_of_dra() -> None:
    objs = render()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert kinds == {("DaemonSet", "kubegpu-device-plugin")}
    assert "KUBEGPU_DRA_GPUS" not in env(containers(objs[0])["kubegpu-device-plugin-ctr"])


def test_enabled_renders_the_driver_its_rbac_policy_and_nvidias_classes() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(ON)}
    assert kinds == {
        ("DaemonSet", "kubegpu-device-plugin"),
        ("DaemonSet", "kubegpu-dra"),
        ("ServiceAccount", "kubegpu-dra"),
        ("ClusterRole", "kubegpu-dra"),
        ("ClusterRoleBinding", "kubegpu-dra"),
        ("ValidatingAdmissionPolicy", "kubegpu-dra-resourceslices"),
        ("ValidatingAdmissionPolicyBinding", "kubegpu-dra-resourceslices"),
        ("DeviceClass", "gpu.nvidia.com"),
        ("DeviceClass", "mig.nvidia.com"),
    }


def test_the_driver_gets_nvidias_dra_settings_by_their_env_names() -> None:
    objs = render(ON)
    ctr = dra(objs)
    assert ctr["command"] == ["kubegpu", "dra"]
    assert env(ctr) == {
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "KUBEGPU_DRA_DRIVER_NAME": "gpu.nvidia.com",
        "KUBEGPU_DRA_GPUS": "all",
        "CDI_ROOT": "/var/run/cdi",
        "KUBELET_REGISTRAR_DIRECTORY_PATH": "/var/lib/kubelet/plugins_registry",
        "KUBELET_PLUGINS_DIRECTORY_PATH": "/var/lib/kubelet/plugins",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    spec = dra_ds(objs)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "kubegpu-dra"
    assert spec["priorityClassName"] == "system-node-critical"
    # The same GPU nodes as the device plugin.
    plugin_spec = by_kind(objs, "DaemonSet")["kubegpu-device-plugin"]["spec"]["template"]["spec"]
    assert spec["affinity"] == plugin_spec["affinity"] and spec["tolerations"] == plugin_spec["tolerations"]


def test_the_kubelets_directories_are_mounted_at_the_same_paths() -> None:
    """The kubelet dials the socket path the driver registers: inside and outside must be one path."""
    values = {
        "dra": {
            "enabled": True,
            "kubeletRegistrarDirectoryPath": "/data/kubelet/plugins_registry",
            "kubeletPluginsDirectoryPath": "/data/kubelet/plugins",
            "cdiRoot": "/etc/cdi",
            "driverName": "gpu.example.com",
        }
    }
    ds = dra_ds(render(values))
    ctr = containers(ds)[DRA_CTR]
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {n: (m["mountPath"], m.get("readOnly", False)) for n, m in mounts.items()} == {
        "plugins-registry": ("/data/kubelet/plugins_registry", False),
        "plugins": ("/data/kubelet/plugins", False),
        "cdi-root": ("/etc/cdi", False),
    }
    assert volumes == {
        "plugins-registry": {"path": "/data/kubelet/plugins_registry", "type": "Directory"},
        "plugins": {"path": "/data/kubelet/plugins", "type": "DirectoryOrCreate"},
        "cdi-root": {"path": "/etc/cdi", "type": "DirectoryOrCreate"},
    }
    e = env(ctr)
    assert (e["KUBELET_REGISTRAR_DIRECTORY_PATH"], e["KUBELET_PLUGINS_DIRECTORY_PATH"], e["CDI_ROOT"]) == (
        "/data/kubelet/plugins_registry",
        "/data/kubelet/plugins",
        "/etc/cdi",
    )
    assert ctr["livenessProbe"]["exec"]["command"][3:] == [
        "/data/kubelet/plugins_registry/gpu.example.com-reg.sock",
        "/data/kubelet/plugins/gpu.example.com/dra.sock",
    ]


def test_the_driver_gets_no_driver_root_it_would_not_read() -> None:
    """`kubegpu dra` has no driver-root setting (the NVIDIA runtime gives it libnvidia-ml): neither the env
    var nor the mount, which the device plugin gets."""
    objs = render({**ON, "nvidiaDriverRoot": "/run/nvidia/driver"})
    ctr = dra(objs)
    assert all(m["name"] != "driver-root" for m in ctr["volumeMounts"])
    assert "NVIDIA_DRIVER_ROOT" not in env(ctr)
    plugin = containers(by_kind(objs, "DaemonSet")["kubegpu-device-plugin"])["kubegpu-device-plugin-ctr"]
    assert env(plugin)["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"


@pytest.mark.parametrize("gpus", ["all", "0,1", "GPU-8f6a1d2e-3b4c-5d6e-7f80-91a2b3c4d5e6"])
def test_the_device_plugin_leaves_out_the_gpus_dra_serves(gpus: str) -> None:
    objs = render({"dra": {"enabled": True, "gpus": gpus}})
    plugin = containers(by_kind(objs, "DaemonSet")["kubegpu-device-plugin"])["kubegpu-device-plugin-ctr"]
    assert env(plugin)["KUBEGPU_DRA_GPUS"] == gpus
    assert env(dra(objs))["KUBEGPU_DRA_GPUS"] == gpus


def test_dra_alone_without_the_device_plugin() -> None:
    objs = render({"dra": {"enabled": True}, "devicePlugin": {"enabled": False}})
    assert set(by_kind(objs, "DaemonSet")) == {DRA_DS}


def test_nvidias_device_classes_and_selectors() -> None:
    classes = by_kind(render(ON), "DeviceClass")
    assert {n: (c["apiVersion"], c["spec"]) for n, c in classes.items()} == {
        "gpu.nvidia.com": (
            "resource.k8s.io/v1",
            {
                "selectors": [
                    {
                        "cel": {
                            "expression": "device.driver == 'gpu.nvidia.com' && "
                            "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                        }
                    }
                ]
            },
        ),
        "mig.nvidia.com": (
            "resource.k8s.io/v1",
            {
                "selectors": [
                    {
                        "cel": {
                            "expression": "device.driver == 'gpu.nvidia.com' && "
                            "device.attributes['gpu.nvidia.com'].type == 'mig'"
                        }
                    }
                ]
            },
        ),
    }


def test_classes_follow_the_driver_name_and_can_be_left_out() -> None:
    values = {
        "dra": {
            "enabled": True,
            "driverName": "gpu.kubegpu.io",
            "deviceClasses": {"gpu": "kubegpu", "mig": ""},
        }
    }
    classes = by_kind(render(values), "DeviceClass")
    assert list(classes) == ["kubegpu"]
    assert classes["kubegpu"]["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.kubegpu.io' && device.attributes['gpu.kubegpu.io'].type == 'gpu'"
    )


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["resource.k8s.io/v1/DeviceClass", "resource.k8s.io/v1beta1/DeviceClass"], "resource.k8s.io/v1"),
        (
            ["resource.k8s.io/v1beta2/DeviceClass", "resource.k8s.io/v1beta1/DeviceClass"],
            "resource.k8s.io/v1beta2",
        ),
        (["resource.k8s.io/v1beta1/DeviceClass"], "resource.k8s.io/v1beta1"),
    ],
)
def test_device_classes_use_the_newest_version_the_cluster_serves(served: list[str], expected: str) -> None:
    """A 1.32 cluster serves only v1beta1, 1.33 adds v1beta2, 1.34 v1 (helm install asks the cluster)."""
    args = [a for version in served for a in ("--api-versions", version)]
    text = helm(
        "template", "kubegpu", CHART, "-n", NAMESPACE, "--set", "dra.enabled=true", *args,
        "-s", "templates/deviceclasses.yaml",
    )  # fmt: skip
    versions = {d["apiVersion"] for d in yaml.safe_load_all(text) if d}
    assert versions == {expected}


def test_rbac_is_exactly_what_the_driver_does() -> None:
    objs = render(ON)
    role = by_kind(objs, "ClusterRole")["kubegpu-dra"]
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]
    binding = by_kind(objs, "ClusterRoleBinding")["kubegpu-dra"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kubegpu-dra", "namespace": NAMESPACE}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "kubegpu-dra",
    }
    # Only the DRA pods get this service account; the device plugin's pods keep no token.
    for name, ds in by_kind(objs, "DaemonSet").items():
        spec = ds["spec"]["template"]["spec"]
        if name == DRA_DS:
            assert spec["serviceAccountName"] == "kubegpu-dra"
        else:
            assert spec.get("serviceAccountName") != "kubegpu-dra"


def test_the_slice_policy_names_the_drivers_service_account_and_the_node_claim() -> None:
    objs = render(ON, namespace="gpu-system")
    policy = by_kind(objs, "ValidatingAdmissionPolicy")["kubegpu-dra-resourceslices"]["spec"]
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["resourceslices"],
        }
    ]
    assert [c["expression"] for c in policy["matchConditions"]] == [
        'request.userInfo.username == "system:serviceaccount:gpu-system:kubegpu-dra"'
    ]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables == {
        "userNodeName": "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')",
        "objectNodeName": "(request.operation == 'DELETE' ? oldObject : object).spec.?nodeName.orValue('')",
    }
    assert [v["expression"] for v in policy["validations"]] == [
        "variables.userNodeName != ''",
        "variables.userNodeName == variables.objectNodeName",
    ]
    binding = by_kind(objs, "ValidatingAdmissionPolicyBinding")["kubegpu-dra-resourceslices"]["spec"]
    assert binding == {"policyName": "kubegpu-dra-resourceslices", "validationActions": ["Deny"]}


def test_the_slice_policy_can_be_left_out() -> None:
    objs = render({"dra": {"enabled": True, "restrictSlicesToOwnNode": False}})
    assert not by_kind(objs, "ValidatingAdmissionPolicy")
    assert not by_kind(objs, "ValidatingAdmissionPolicyBinding")


def test_the_driver_runs_without_capabilities() -> None:
    ds = dra_ds(render(ON))
    spec = ds["spec"]["template"]["spec"]
    ctr = containers(ds)[DRA_CTR]
    assert spec["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert ctr["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    verbatim = containers(dra_ds(render({"dra": {"enabled": True, "securityContext": {"privileged": True}}})))
    assert verbatim[DRA_CTR]["securityContext"] == {"privileged": True}


SCHEMA_REFUSALS = [
    ({"dra": {"enabled": "yes"}}, "at '/dra/enabled': got string, want boolean"),
    (
        {"dra": {"driverName": "GPU.Nvidia.com"}},
        "at '/dra/driverName': 'GPU.Nvidia.com' does not match pattern",
    ),
    ({"dra": {"driverName": "a" * 64}}, "at '/dra/driverName': maxLength: got 64, want 63"),
    ({"dra": {"gpus": "0, 1"}}, "at '/dra/gpus': '0, 1' does not match pattern"),
    ({"dra": {"cdiRoot": "var/run/cdi"}}, "at '/dra/cdiRoot': 'var/run/cdi' does not match pattern"),
    (
        {"dra": {"kubeletPluginsDirectoryPath": "plugins"}},
        "at '/dra/kubeletPluginsDirectoryPath': 'plugins' does not match pattern",
    ),
    ({"dra": {"deviceClasses": {"gpu": "GPU"}}}, "at '/dra/deviceClasses/gpu': 'GPU' does not match pattern"),
    (
        {"dra": {"deviceClasses": {"vfio": "x"}}},
        "at '/dra/deviceClasses': additional properties 'vfio' not allowed",
    ),
    ({"dra": {"enable": True}}, "at '/dra': additional properties 'enable' not allowed"),
]


@pytest.mark.parametrize(("values", "complaint"), SCHEMA_REFUSALS)
def test_the_schema_refuses_bad_dra_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(HelmError) as err:
        render(values)
    assert complaint in str(err.value), err.value


def test_helm_lint_strict_passes_with_dra(tmp_path: Path) -> None:
    values = tmp_path / "dra.yaml"
    values.write_text(yaml.safe_dump({"dra": {"enabled": True, "gpus": "0,1"}}))
    out = helm("lint", "--strict", CHART, "-n", NAMESPACE, *value_args((values,), ()), stdin="{}")
    assert "1 chart(s) linted, 0 chart(s) failed" in out and "[WARNING]" not in out, out


def test_dra_on_a_cluster_older_than_132_is_refused_with_the_way_out() -> None:
    proc_args = ("template", "kubegpu", CHART, "-n", NAMESPACE, "--set", "dra.enabled=true")
    with pytest.raises(HelmError) as err:
        helm(*proc_args, "--kube-version", "1.31.4")
    assert (
        "execution error at (kubegpu/templates/validation.yaml:19:4): "
        "dra.enabled needs Kubernetes 1.32 or later (resource.k8s.io v1beta1), and this cluster is v1.31.4: "
        "upgrade the cluster, or leave dra.enabled false and serve the GPUs with the device plugin."
    ) in str(err.value), err.value
    assert "kind: DaemonSet" in helm(*proc_args, "--kube-version", "1.32.0")
    # Without DRA the chart keeps its oldest release.
    assert "kind: DaemonSet" in helm(
        "template", "kubegpu", CHART, "-n", NAMESPACE, "--kube-version", "1.25.0"
    )


def test_install_notes_say_how_to_see_the_slices() -> None:
    from .test_chart import install_notes

    text = install_notes({"dra": {"enabled": True, "gpus": "0,1"}}, "gpu")
    assert (
        "\n\nDRA: `kubegpu dra` publishes each GPU node's devices as ResourceSlices of driver "
        "gpu.nvidia.com\n"
        "(GPUs 0,1; the device plugin leaves those out):\n\n"
        "  kubectl -n gpu rollout status ds/kubegpu-dra\n"
        "  kubectl get resourceslices --field-selector spec.driver=gpu.nvidia.com\n\n"
        "Claims name the DeviceClasses gpu.nvidia.com and mig.nvidia.com; `kubegpu explain NAMESPACE/POD` "
        "says why a claim is not allocated.\n"
    ) in text
    alone = install_notes(
        {"dra": {"enabled": True, "deviceClasses": {"mig": ""}}, "devicePlugin": {"enabled": False}}, "gpu"
    )
    assert "(GPUs all):" in alone and "Claims name the DeviceClasses gpu.nvidia.com;" in alone
    assert "DRA:" not in install_notes({}, "gpu")


def test_every_env_var_the_chart_gives_means_something_to_the_daemon_that_gets_it() -> None:
    """The DRA container's to `kubegpu dra`, the device plugin's KUBEGPU_DRA_GPUS to `kubegpu plugin`: a
    renamed setting would otherwise be ignored in silence."""
    from kubegpu.settings.setting import DRA
    from kubegpu.settings.table import for_command

    runtime = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}  # the NVIDIA container runtime's
    objs = render({"dra": {"enabled": True}, "nvidiaDriverRoot": "/run/nvidia/driver", "nvidiaDevRoot": "/"})
    dra_known = {e for s in for_command(DRA) for e in s.envvars} | runtime
    assert set(env(dra(objs))) - dra_known == set()
    plugin_known = {e for s in for_command("plugin") for e in s.envvars}
    plugin = containers(by_kind(objs, "DaemonSet")["kubegpu-device-plugin"])["kubegpu-device-plugin-ctr"]
    assert "KUBEGPU_DRA_GPUS" in plugin_known and "KUBEGPU_DRA_GPUS" in env(plugin)


def test_the_driver_reads_the_values_the_chart_gives_it() -> None:
    """`kubegpu dra`'s own settings code, on the env the chart renders (the downward API's NODE_NAME
    filled in as the kubelet would)."""
    from kubegpu.settings.setting import DRA
    from kubegpu.settings.table import for_command

    values = {"dra": {"enabled": True, "gpus": "0,1", "driverName": "gpu.example.com", "cdiRoot": "/etc/cdi"}}
    given = {k: v for k, v in env(dra(render(values))).items() if isinstance(v, str)}
    given["NODE_NAME"] = "gpu-1"
    by_env = {e: s for s in for_command(DRA) for e in s.envvars}
    assert {by_env[k].name: v for k, v in given.items() if k in by_env} == {
        "node-name": "gpu-1",
        "driver-name": "gpu.example.com",
        "gpus": "0,1",
        "cdi-root": "/etc/cdi",
        "kubelet-registrar-directory-path": "/var/lib/kubelet/plugins_registry",
        "kubelet-plugins-directory-path": "/var/lib/kubelet/plugins",
    }


def test_the_extended_resource_bridge_goes_on_the_gpu_class_only() -> None:
    objs = render({"dra": {"enabled": True, "extendedResourceName": "nvidia.com/gpu"}})
    classes = by_kind(objs, "DeviceClass")
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]
    assert all("extendedResourceName" not in c["spec"] for c in by_kind(render(ON), "DeviceClass").values())
    with pytest.raises(HelmError) as err:
        helm(
            "template", "kubegpu", CHART, "-n", NAMESPACE, "--set", "dra.enabled=true",
            "--set", "dra.extendedResourceName=nvidia.com/gpu",
            "--api-versions", "resource.k8s.io/v1beta1/DeviceClass",
        )  # fmt: skip
    assert (
        "dra.extendedResourceName needs resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 or later), and "
        "this cluster serves resource.k8s.io/v1beta1: leave it unset."
    ) in str(err.value)
    with pytest.raises(HelmError) as err:
        render({"dra": {"extendedResourceName": "nvidia.com/gpu 1"}})
    assert "at '/dra/extendedResourceName': 'nvidia.com/gpu 1' does not match pattern" in str(err.value)


def test_feature_gates_become_nvidias_env_and_the_driver_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "FEATURE_GATES" not in env(dra(render(ON)))
    ctr = dra(
        render({"dra": {"enabled": True, "featureGates": {"TimeSlicingSettings": True, "DynamicMIG": False}}})
    )
    assert env(ctr)["FEATURE_GATES"] == "DynamicMIG=false,TimeSlicingSettings=true,"  # NVIDIA's chart's form
    monkeypatch.setenv("FEATURE_GATES", env(ctr)["FEATURE_GATES"])
    report = check_driver({})
    assert report.errors == [] and report.gates is not None and report.gates["TimeSlicingSettings"]
    with pytest.raises(HelmError) as err:
        render({"dra": {"featureGates": {"DynamicMIG": "yes"}}})
    assert "/dra/featureGates/DynamicMIG" in str(err.value)


def test_metrics_are_off_by_default_and_on_with_nvidias_env_names_and_a_port() -> None:
    assert {"HTTP_ENDPOINT", "METRICS_PATH"} & set(env(dra(render(ON)))) == set()
    assert "ports" not in dra(render(ON))
    ctr = dra(
        render({"dra": {"enabled": True, "metrics": {"enabled": True, "httpEndpoint": "0.0.0.0:9401"}}})
    )
    assert (env(ctr)["HTTP_ENDPOINT"], env(ctr)["METRICS_PATH"]) == ("0.0.0.0:9401", "/metrics")
    assert ctr["ports"] == [{"name": "dra-metrics", "containerPort": 9401, "protocol": "TCP"}]


@pytest.mark.parametrize("endpoint", ["8080", "host:port", ":80 80"])
def test_the_schema_refuses_a_metrics_endpoint_the_driver_would_refuse(endpoint: str) -> None:
    with pytest.raises(HelmError, match="httpEndpoint"):
        render({"dra": {"enabled": True, "metrics": {"enabled": True, "httpEndpoint": endpoint}}})


MPS_ON = {"dra": {"enabled": True, "featureGates": {"MPSSupport": True}}}


def test_mps_support_grants_deployments_in_the_namespace_only_with_the_gate() -> None:
    assert "Role" not in {o["kind"] for o in render(ON)}
    objs = render(MPS_ON, namespace="gpu-system")
    role = by_kind(objs, "Role")["kubegpu-dra-mps"]
    assert role["metadata"]["namespace"] == "gpu-system"
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    binding = by_kind(objs, "RoleBinding")["kubegpu-dra-mps"]
    assert binding["metadata"]["namespace"] == "gpu-system"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kubegpu-dra", "namespace": "gpu-system"}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "kubegpu-dra-mps",
    }
    assert "Role" not in {
        o["kind"] for o in render({"dra": {"enabled": True, "featureGates": {"MPSSupport": False}}})
    }


def test_mps_support_gives_the_driver_its_image_driver_root_and_mounts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {**MPS_ON, "nvidiaDriverRoot": "/run/nvidia/driver", "imagePullSecrets": [{"name": "regcred"}]}
    ds = dra_ds(render(values))
    ctr = containers(ds)[DRA_CTR]
    e = env(ctr)
    assert e["IMAGE_NAME"].startswith("localhost/kubegpu:")
    assert (e["IMAGE_PULL_POLICY"], e["IMAGE_PULL_SECRETS"], e["NVIDIA_DRIVER_ROOT"]) == (
        "IfNotPresent", "regcred", "/run/nvidia/driver"
    )  # fmt: skip
    assert e["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert ctr["securityContext"] == {"privileged": True}
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert (mounts["driver-root"]["mountPath"], mounts["driver-root"]["readOnly"]) == ("/driver-root", True)
    volumes = {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["driver-root"] == {"path": "/run/nvidia/driver", "type": "Directory"}
    # `kubegpu dra`'s own checks accept what the chart gives it
    monkeypatch.setenv("FEATURE_GATES", e["FEATURE_GATES"])
    monkeypatch.setenv("IMAGE_NAME", e["IMAGE_NAME"])
    report = check_driver({})
    assert report.errors == [] and report.warnings == []


def test_helm_lint_strict_passes_with_mps(tmp_path: Path) -> None:
    values = tmp_path / "mps.yaml"
    values.write_text(yaml.safe_dump(MPS_ON))
    out = helm("lint", "--strict", CHART, "-n", NAMESPACE, *value_args((values,), ()), stdin="{}")
    assert "1 chart(s) linted, 0 chart(s) failed" in out and "[WARNING]" not in out, out


def test_consumable_shares_sets_the_env_and_grants_the_claim_status() -> None:
    values = {"dra": {"enabled": True, "featureGates": {"ConsumableShares": True}, "consumableShares": 4}}
    objs = render(values)
    container = dra_ds(objs)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["FEATURE_GATES"], env["CONSUMABLE_SHARES"]) == ("ConsumableShares=true,", "4")
    rules = by_kind(objs, "ClusterRole")["kubegpu-dra"]["rules"]
    assert rules[2:4] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": ["gpu.nvidia.com"],
            "verbs": ["associated-node:update", "associated-node:patch"],
        },
    ]
    assert "CONSUMABLE_SHARES" not in {
        e["name"] for e in dra_ds(render(ON))["spec"]["template"]["spec"]["containers"][0]["env"]
    }
