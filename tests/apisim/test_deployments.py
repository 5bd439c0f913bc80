"""apps/v1 Deployments on the simulated API server, through the official client as a controller uses them:
discovery, generateName, the status subresource, watch, validation, and foreground deletion."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubegpu.apisim import ApiServerSim


def deployment(name: str = "", generate_name: str = "", image: str = "img:1") -> dict:
    meta = {"name": name} if name else {"generateName": generate_name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**meta, "labels": {"app": "mps"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "mps"}},
            "template": {
                "metadata": {"labels": {"app": "mps"}},
                "spec": {"containers": [{"name": "mps-control-daemon", "image": image}]},
            },
        },
    }


def test_discovery_serves_apps_v1_deployments_with_status(k8s: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(k8s).get_api_versions().groups}
    assert [v.version for v in groups["apps"].versions] == ["v1"]
    resources = {r.name: r for r in client.AppsV1Api(k8s).get_api_resources().resources}
    assert set(resources) == {"deployments", "deployments/status"}
    assert resources["deployments"].namespaced is True
    assert resources["deployments"].kind == "Deployment"
    assert resources["deployments"].short_names == ["deploy"]
    assert resources["deployments/status"].verbs == ["get", "patch", "update"]


def test_create_with_generate_name_then_status_apart_from_spec(k8s: client.ApiClient) -> None:
    apps = client.AppsV1Api(k8s)
    created = apps.create_namespaced_deployment("default", deployment(generate_name="mps-"))
    name = created.metadata.name
    assert name.startswith("mps-") and len(name) == len("mps-") + 5
    assert created.metadata.generation == 1 and created.metadata.uid
    # A status written through the main resource is dropped; /status writes only the status.
    body = apps.read_namespaced_deployment(name, "default")
    body.status = client.V1DeploymentStatus(ready_replicas=1, replicas=1)
    assert apps.replace_namespaced_deployment(name, "default", body).status is None
    apps.patch_namespaced_deployment_status(name, "default", {"status": {"readyReplicas": 1, "replicas": 1}})
    read = apps.read_namespaced_deployment(name, "default")
    assert (read.status.ready_replicas, read.status.replicas) == (1, 1)
    assert read.metadata.generation == 1  # a status write is not a spec change


def test_validation_of_what_a_driver_could_get_wrong(k8s: client.ApiClient) -> None:
    apps = client.AppsV1Api(k8s)
    bad = deployment(name="mps-control-daemon-x", image="")
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(ApiException) as err:
        apps.create_namespaced_deployment("default", bad)
    assert err.value.status == 422
    message = json.loads(err.value.body)["message"]
    assert message.startswith(
        'Deployment.apps "mps-control-daemon-x" is invalid: [spec.template.metadata.labels: Invalid value: '
    )
    assert "`selector` does not match template `labels`" in message
    assert message.endswith("spec.template.spec.containers[0].image: Required value]")


def test_foreground_deletion_marks_deletes_the_dependents_then_the_owner(
    api: ApiServerSim, k8s: client.ApiClient
) -> None:
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    owner = apps.create_namespaced_deployment("default", deployment(name="mps-control-daemon-a"))
    start = owner.metadata.resource_version
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.metadata.name,
           "uid": owner.metadata.uid, "blockOwnerDeletion": True}  # fmt: skip
    core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "mps-control-daemon-a-pod", "ownerReferences": [ref]},
         "spec": {"containers": [{"name": "c", "image": "img:1"}]}},
    )  # fmt: skip
    answer = apps.delete_namespaced_deployment(
        owner.metadata.name, "default", propagation_policy="Foreground"
    )
    # The client types the answer as a Status and hands back the object as a dict.
    assert answer["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert answer["metadata"]["deletionTimestamp"]
    assert api.list("pods") == [] and api.list("deployments") == []
    seen = [
        (e["type"], e["raw_object"]["metadata"].get("finalizers"))
        for e in watch.Watch().stream(
            apps.list_namespaced_deployment, "default", resource_version=start, timeout_seconds=1
        )
    ]
    assert seen == [("MODIFIED", ["foregroundDeletion"]), ("DELETED", None)]


def test_a_missing_deployment_is_the_real_not_found(k8s: client.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        client.AppsV1Api(k8s).read_namespaced_deployment("nope", "default")
    assert err.value.status == 404
    assert json.loads(err.value.body)["message"] == 'deployments.apps "nope" not found'
