"""The simulated API server, driven through the official `kubernetes` client as a driver or tool would.

Expected texts are the kube-apiserver's (apimachinery's errors and field errors), written out here.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubegpu.apisim import ApiServerSim
from tests.dra_objects import claim, device_class, gpu, request, resource_slice


def status_of(err: ApiException) -> dict[str, Any]:
    return json.loads(err.body)


def test_discovery_lists_the_served_resource_versions_with_v1_preferred(k8s: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(k8s).get_api_versions().groups}
    resource = groups["resource.k8s.io"]
    assert [v.version for v in resource.versions] == ["v1", "v1beta2", "v1beta1"]
    assert resource.preferred_version.group_version == "resource.k8s.io/v1"
    assert [v.version for v in groups["nfd.k8s-sigs.io"].versions] == ["v1alpha1"]
    group = client.ResourceApi(k8s).get_api_group()
    assert group.preferred_version.version == "v1"
    resources = {r.name: r for r in client.ResourceV1Api(k8s).get_api_resources().resources}
    assert set(resources) == {
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
        "deviceclasses",
    }
    assert resources["resourceslices"].namespaced is False
    assert resources["resourceclaims"].namespaced is True
    assert "deletecollection" in resources["resourceslices"].verbs
    assert client.VersionApi(k8s).get_code().git_version == "v1.34.0"


def test_a_132_cluster_serves_only_v1beta1() -> None:
    api = ApiServerSim(resource_versions=("v1beta1",), kubernetes_version="1.32.4")
    with api, client.ApiClient(client.Configuration(host=api.url)) as k8s:
        groups = {g.name: g for g in client.ApisApi(k8s).get_api_versions().groups}
        assert [v.version for v in groups["resource.k8s.io"].versions] == ["v1beta1"]
        assert groups["resource.k8s.io"].preferred_version.version == "v1beta1"
        with pytest.raises(ApiException) as err:
            client.ResourceV1Api(k8s).list_resource_slice()
        assert err.value.status == 404
        assert status_of(err.value)["message"] == "the server could not find the requested resource"
        assert client.ResourceV1beta1Api(k8s).list_resource_slice().items == []


def test_no_dra_api_at_all() -> None:
    with (
        ApiServerSim(resource_versions=()) as api,
        client.ApiClient(client.Configuration(host=api.url)) as k8s,
    ):
        assert "resource.k8s.io" not in {g.name for g in client.ApisApi(k8s).get_api_versions().groups}


def test_create_assigns_identity_and_generate_name(api: ApiServerSim, k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    body = resource_slice("node-a", [gpu(0)])
    body["metadata"] = {"generateName": "node-a-gpu.nvidia.com-"}
    created = slices.create_resource_slice(body)
    assert created.metadata.name.startswith("node-a-gpu.nvidia.com-")
    assert len(created.metadata.name) == len("node-a-gpu.nvidia.com-") + 5
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert created.metadata.generation == 1
    assert int(created.metadata.resource_version) == api.resource_version
    assert created.spec.devices[0].attributes["driverVersion"].version == "550.54.15"


def test_create_twice_is_already_exists_with_the_real_text(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    with pytest.raises(ApiException) as err:
        slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    assert err.value.status == 409
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'resourceslices.resource.k8s.io "s1" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "s1", "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 409,
    }


def test_not_found_texts(k8s: client.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        client.ResourceV1Api(k8s).read_namespaced_resource_claim("gone", "team-a")
    assert err.value.status == 404
    assert status_of(err.value)["message"] == 'resourceclaims.resource.k8s.io "gone" not found'
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(k8s).read_node("gone")
    assert status_of(err.value)["message"] == 'nodes "gone" not found'
    assert status_of(err.value)["details"] == {"name": "gone", "kind": "nodes"}


def test_update_with_a_stale_resource_version_is_a_conflict(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    first = slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    fresh = slices.read_resource_slice("s1")
    fresh.spec.pool.generation = 2
    updated = slices.replace_resource_slice("s1", fresh)
    assert updated.metadata.generation == 2  # a spec change counts
    assert int(updated.metadata.resource_version) > int(first.metadata.resource_version)
    first.spec.pool.generation = 3
    with pytest.raises(ApiException) as err:
        slices.replace_resource_slice("s1", first)
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "Conflict"
    assert status_of(err.value)["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def test_field_selectors_as_the_kubelet_and_drivers_use_them(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="a-gpu"))
    slices.create_resource_slice(resource_slice("node-b", [gpu(0)], name="b-gpu"))
    slices.create_resource_slice(
        resource_slice("node-a", [gpu(1)], name="a-other", driver="other.example.com")
    )

    def names(**kw: str) -> list[str]:
        return sorted(s.metadata.name for s in slices.list_resource_slice(**kw).items)

    assert names(field_selector="spec.nodeName=node-a") == ["a-gpu", "a-other"]
    assert names(field_selector="spec.nodeName=node-a,spec.driver=gpu.nvidia.com") == ["a-gpu"]
    assert names(field_selector="spec.driver!=gpu.nvidia.com") == ["a-other"]
    assert names(field_selector="metadata.name=b-gpu") == ["b-gpu"]
    with pytest.raises(ApiException) as err:
        slices.list_resource_slice(field_selector="spec.pool.name=node-a")
    assert err.value.status == 400
    assert status_of(err.value)["message"] == "field label not supported: spec.pool.name"


def test_label_selectors(api: ApiServerSim, k8s: client.ApiClient) -> None:
    api.add_node("a", {"gpu": "true", "zone": "z1"})
    api.add_node("b", {"gpu": "false", "zone": "z2"})
    api.add_node("c", {"zone": "z1"})

    def names(selector: str) -> list[str]:
        return sorted(n.metadata.name for n in client.CoreV1Api(k8s).list_node(label_selector=selector).items)

    assert names("gpu=true") == ["a"]
    assert names("gpu") == ["a", "b"]
    assert names("!gpu") == ["c"]
    assert names("zone in (z1),gpu!=true") == ["c"]
    assert names("zone notin (z1)") == ["b"]


def test_v1beta1_sees_the_same_objects_in_its_own_shape(k8s: client.ApiClient) -> None:
    client.ResourceV1Api(k8s).create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    raw = client.ResourceV1beta1Api(k8s).read_resource_slice("s1", _preload_content=False)
    body = json.loads(raw.data)
    assert body["apiVersion"] == "resource.k8s.io/v1beta1"
    assert body["spec"]["devices"][0]["name"] == "gpu-0"
    assert body["spec"]["devices"][0]["basic"]["capacity"] == {"memory": {"value": "80Gi"}}
    assert "attributes" not in body["spec"]["devices"][0]

    beta_claim = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}},
    }
    client.ResourceV1beta1Api(k8s).create_namespaced_resource_claim("team-a", beta_claim)
    as_v1 = client.ResourceV1Api(k8s).read_namespaced_resource_claim("c1", "team-a")
    assert as_v1.spec.devices.requests[0].exactly.device_class_name == "gpu.nvidia.com"
    assert as_v1.spec.devices.requests[0].exactly.count == 2
    assert as_v1.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"  # defaulted


def test_claim_status_is_its_own_subresource(k8s: client.ApiClient) -> None:
    claims = client.ResourceV1Api(k8s)
    created = claims.create_namespaced_resource_claim("team-a", claim("c1", namespace="team-a"))
    allocation = {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]
        }
    }
    body = claims.read_namespaced_resource_claim("c1", "team-a").to_dict()
    body["status"] = {"allocation": allocation}
    claims.replace_namespaced_resource_claim("c1", "team-a", body)  # main resource: status ignored
    assert claims.read_namespaced_resource_claim("c1", "team-a").status is None
    status = {
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p1", "uid": "u1"}]}
    }
    claims.patch_namespaced_resource_claim_status("c1", "team-a", status)
    # reservedFor merges on uid with a strategic merge patch, as the scheduler's patches do.
    claims.patch_namespaced_resource_claim_status(
        "c1", "team-a", {"status": {"reservedFor": [{"resource": "pods", "name": "p2", "uid": "u2"}]}}
    )
    read = claims.read_namespaced_resource_claim("c1", "team-a")
    assert [r.uid for r in read.status.reserved_for] == ["u1", "u2"]
    assert read.status.allocation.devices.results[0].device == "gpu-0"
    assert read.metadata.uid == created.metadata.uid


def test_claim_spec_is_immutable_and_status_rules_hold(k8s: client.ApiClient) -> None:
    claims = client.ResourceV1Api(k8s)
    claims.create_namespaced_resource_claim("team-a", claim("c1", namespace="team-a"))
    body = claims.read_namespaced_resource_claim("c1", "team-a").to_dict()
    body["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    with pytest.raises(ApiException) as err:
        claims.replace_namespaced_resource_claim("c1", "team-a", body)
    assert err.value.status == 422
    assert status_of(err.value)["message"].startswith(
        'ResourceClaim.resource.k8s.io "c1" is invalid: spec: Invalid value: '
    )
    assert status_of(err.value)["message"].endswith(": field is immutable")
    with pytest.raises(ApiException) as err:
        claims.patch_namespaced_resource_claim_status(
            "c1", "team-a", {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}
        )
    assert status_of(err.value)["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: may not be specified when `allocated` is not set",
            "field": "status.reservedFor",
        }
    ]


def test_validation_rejects_what_a_driver_gets_wrong(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    too_many = resource_slice("node-a", [gpu(i) for i in range(129)], name="big")
    with pytest.raises(ApiException) as err:
        slices.create_resource_slice(too_many)
    assert status_of(err.value)["message"] == (
        'ResourceSlice.resource.k8s.io "big" is invalid: '
        "spec.devices: Too many: 129: must have at most 128 items"
    )
    bad = resource_slice("node-a", [gpu(0), gpu(0, **{"name": "GPU_1"})], name="bad")
    bad["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "550.54"}
    bad["spec"]["pool"]["resourceSliceCount"] = 0
    with pytest.raises(ApiException) as err:
        slices.create_resource_slice(bad)
    fields = [c["field"] for c in status_of(err.value)["details"]["causes"]]
    assert fields == [
        "spec.pool.resourceSliceCount",
        "spec.devices[0].attributes[driverVersion].version",
        "spec.devices[1].name",
    ]
    assert "must be a string compatible with semver.org spec 2.0.0" in status_of(err.value)["message"]


def test_selectors_must_compile(k8s: client.ApiClient) -> None:
    body = claim(
        "c1", [request(selectors=['device.attributes["gpu.nvidia.com"].productName =='])], namespace="team-a"
    )
    with pytest.raises(ApiException) as err:
        client.ResourceV1Api(k8s).create_namespaced_resource_claim("team-a", body)
    cause = status_of(err.value)["details"]["causes"][0]
    assert cause["field"] == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert "compilation failed" in cause["message"]
    with pytest.raises(ApiException):
        client.ResourceV1Api(k8s).create_device_class(device_class("x", "dev.driver == 1"))


def test_watch_from_a_resource_version_and_selector_transitions(
    api: ApiServerSim, k8s: client.ApiClient
) -> None:
    slices = client.ResourceV1Api(k8s)
    start = slices.list_resource_slice().metadata.resource_version
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    slices.create_resource_slice(resource_slice("node-b", [gpu(0)], name="s2"))
    s1 = slices.read_resource_slice("s1")
    s1.spec.pool.generation = 2
    slices.replace_resource_slice("s1", s1)
    slices.delete_resource_slice("s1")
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            slices.list_resource_slice,
            field_selector="spec.nodeName=node-a",
            resource_version=start,
            timeout_seconds=1,
        )
    ]
    assert seen == [("ADDED", "s1"), ("MODIFIED", "s1"), ("DELETED", "s1")]


def test_watch_without_a_resource_version_starts_with_the_current_state(
    api: ApiServerSim, k8s: client.ApiClient
) -> None:
    api.add_node("a")
    api.add_node("b")
    stream = watch.Watch().stream(client.CoreV1Api(k8s).list_node, timeout_seconds=1)
    assert [(e["type"], e["object"].metadata.name) for e in stream] == [("ADDED", "a"), ("ADDED", "b")]


def test_a_label_change_out_of_a_selector_is_a_deleted_event(
    api: ApiServerSim, k8s: client.ApiClient
) -> None:
    api.add_node("a", {"gpu": "true"})
    start = str(api.resource_version)
    api.set_label("a", "gpu", "false")
    api.set_label("a", "gpu", "true")
    events = watch.Watch().stream(
        client.CoreV1Api(k8s).list_node, label_selector="gpu=true", resource_version=start, timeout_seconds=1
    )
    seen = [(e["type"], e["object"].metadata.labels["gpu"]) for e in events]
    # Leaving the selector shows the object as it was, entering it as it is.
    assert seen == [("DELETED", "true"), ("ADDED", "true")]


def test_watch_from_compacted_history_is_410_gone(api: ApiServerSim, k8s: client.ApiClient) -> None:
    api.add_node("a")
    old = str(api.resource_version)
    api.add_node("b")
    api.compact()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(client.CoreV1Api(k8s).list_node, resource_version=old, timeout_seconds=1))
    assert err.value.status == 410


def test_bookmarks_end_a_watch_that_asked_for_them(api: ApiServerSim, k8s: client.ApiClient) -> None:
    api.add_node("a")
    rv = str(api.resource_version)
    events = list(
        watch.Watch().stream(
            client.CoreV1Api(k8s).list_node,
            resource_version=rv,
            timeout_seconds=1,
            allow_watch_bookmarks=True,
        )
    )
    assert [e["type"] for e in events] == ["BOOKMARK"]


def test_a_watch_sees_a_write_made_while_it_waits(api: ApiServerSim, k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    rv = slices.list_resource_slice().metadata.resource_version
    timer = threading.Timer(
        0.2, lambda: api.create("resourceslices", resource_slice("node-a", [gpu(0)], name="late"))
    )
    timer.start()
    try:
        for event in watch.Watch().stream(slices.list_resource_slice, resource_version=rv, timeout_seconds=5):
            assert (event["type"], event["object"].metadata.name) == ("ADDED", "late")
            break
    finally:
        timer.cancel()


def test_deleting_the_node_collects_its_slices(api: ApiServerSim, k8s: client.ApiClient) -> None:
    node = api.add_node("node-a")
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(
        resource_slice("node-a", [gpu(0)], name="owned", owner_uid=node["metadata"]["uid"])
    )
    slices.create_resource_slice(resource_slice("node-a", [gpu(1)], name="unowned"))
    status = client.CoreV1Api(k8s).delete_node("node-a")  # the client leaves it a dict ("object")
    assert (status["kind"], status["status"], status["details"]["name"]) == ("Status", "Success", "node-a")
    assert [s.metadata.name for s in slices.list_resource_slice().items] == ["unowned"]


def test_orphan_propagation_keeps_dependents(api: ApiServerSim, k8s: client.ApiClient) -> None:
    node = api.add_node("node-a")
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(
        resource_slice("node-a", [gpu(0)], name="owned", owner_uid=node["metadata"]["uid"])
    )
    client.CoreV1Api(k8s).delete_node("node-a", propagation_policy="Orphan")
    kept = slices.read_resource_slice("owned")
    assert kept.metadata.owner_references is None


def test_delete_collection_wipes_a_nodes_slices_as_the_kubelet_does(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="a1"))
    slices.create_resource_slice(resource_slice("node-a", [gpu(1)], name="a2", driver="other.example.com"))
    slices.create_resource_slice(resource_slice("node-b", [gpu(0)], name="b1"))
    slices.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")
    assert [s.metadata.name for s in slices.list_resource_slice().items] == ["b1"]


def test_finalizers_hold_a_deleted_claim_until_removed(k8s: client.ApiClient) -> None:
    claims = client.ResourceV1Api(k8s)
    body = claim("c1", namespace="team-a")
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    claims.create_namespaced_resource_claim("team-a", body)
    marked = claims.delete_namespaced_resource_claim("c1", "team-a")
    assert marked.metadata.deletion_timestamp is not None
    claims.patch_namespaced_resource_claim("c1", "team-a", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        claims.read_namespaced_resource_claim("c1", "team-a")
    assert err.value.status == 404


def test_delete_preconditions(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"))
    with pytest.raises(ApiException) as err:
        slices.delete_resource_slice(
            "s1", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
        )
    assert err.value.status == 409
    assert "Precondition failed: UID in precondition: other" in status_of(err.value)["message"]


def test_device_taints_are_dropped_when_the_gate_is_off() -> None:
    tainted = resource_slice(
        "node-a", [gpu(0, taints=[{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}])]
    )
    with ApiServerSim(feature_gates={"DRADeviceTaints": False}) as api:
        stored = api.create("resourceslices", tainted)
        assert "taints" not in stored["spec"]["devices"][0]
    with ApiServerSim() as api:
        stored = api.create("resourceslices", tainted)
        assert stored["spec"]["devices"][0]["taints"][0]["value"] == "79"
    # 1.32 has no device taints at all (they came in 1.33): an unknown field, dropped
    with ApiServerSim(resource_versions=("v1beta1",), kubernetes_version="1.32.4") as api:
        stored = api.create("resourceslices", tainted)
        assert "taints" not in stored["spec"]["devices"][0]


def test_dry_run_validates_without_storing(k8s: client.ApiClient) -> None:
    slices = client.ResourceV1Api(k8s)
    slices.create_resource_slice(resource_slice("node-a", [gpu(0)], name="s1"), dry_run="All")
    assert slices.list_resource_slice().items == []


def test_node_features_through_custom_objects(k8s: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(k8s)
    body = {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": "node-a-gfd", "labels": {"nfd.node.kubernetes.io/node-name": "node-a"}},
        "spec": {"labels": {"nvidia.com/gpu.count": "8"}},
    }
    custom.create_namespaced_custom_object(
        "nfd.k8s-sigs.io", "v1alpha1", "node-feature-discovery", "nodefeatures", body
    )
    custom.patch_namespaced_custom_object(
        "nfd.k8s-sigs.io",
        "v1alpha1",
        "node-feature-discovery",
        "nodefeatures",
        "node-a-gfd",
        {"spec": {"labels": {"nvidia.com/gpu.product": "A100"}}},
    )
    listed = custom.list_namespaced_custom_object(
        "nfd.k8s-sigs.io",
        "v1alpha1",
        "node-feature-discovery",
        "nodefeatures",
        label_selector="nfd.node.kubernetes.io/node-name=node-a",
    )
    (item,) = listed["items"]
    assert item["kind"] == "NodeFeature"  # custom resources keep kind/apiVersion in lists
    assert item["spec"]["labels"] == {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "A100"}


def test_a_strategic_merge_patch_on_a_custom_resource_is_unsupported(api: ApiServerSim) -> None:
    import urllib.error
    import urllib.request

    api.create("nodefeatures", {"metadata": {"name": "n"}, "spec": {}}, namespace="nfd")
    req = urllib.request.Request(
        f"{api.url}/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/nfd/nodefeatures/n",
        data=b'{"spec": {}}',
        method="PATCH",
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    assert err.value.code == 415
    assert json.loads(err.value.read())["reason"] == "UnsupportedMediaType"


def test_requests_are_recorded(api: ApiServerSim, k8s: client.ApiClient) -> None:
    client.CoreV1Api(k8s).list_node(field_selector="metadata.name=a")
    assert api.lists("nodes") == [{"fieldSelector": "metadata.name=a"}]
    assert api.calls[-1].method == "GET"
