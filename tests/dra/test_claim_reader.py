"""The claim reader through the light client against the simulated API server: version discovery, the
404 that names the claim (gone) against the 404 of a version no longer served (look it up again), and API
failures as ApiUnavailable, a per-claim error that says what failed and that the kubelet will retry."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.apisim import ApiServerSim
from kubegpu.dra.claims import ApiUnavailable, ClaimError, ClaimGone, ClaimReader
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.settings.kubeaccess import ApiAccess

DRIVER = "gpu.nvidia.com"


def allocated_claim(api: ApiServerSim, name: str) -> dict[str, Any]:
    created = api.create(
        "resourceclaims",
        {"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {}}},
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
    created["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
    }
    return api.update("resourceclaims", created, status=True)


def reader_for(url: str) -> ClaimReader:
    return ClaimReader(KubeClient(ApiAccess(server=url)), DRIVER)


@pytest.mark.parametrize(("served", "version"), [(("v1", "v1beta1"), "v1"), (("v1beta1",), "v1beta1")])
def test_the_claim_is_read_in_the_version_served(served: tuple[str, ...], version: str) -> None:
    with ApiServerSim(resource_versions=served) as api:
        uid = allocated_claim(api, "c1")["metadata"]["uid"]
        reader = reader_for(api.url)
        claim = reader.get("default", "c1", uid)
        assert (claim.uid, [r.device for r in claim.results], reader.version) == (uid, ["gpu-0"], version)
        assert api.calls[-1].path == f"/apis/resource.k8s.io/{version}/namespaces/default/resourceclaims/c1"


def test_a_deleted_claim_is_gone_and_a_version_gone_is_looked_up_again() -> None:
    with ApiServerSim(resource_versions=("v1", "v1beta1")) as api:
        uid = allocated_claim(api, "c1")["metadata"]["uid"]
        reader = reader_for(api.url)
        reader.get("default", "c1", uid)
        api.served["resource.k8s.io"] = ("v1beta1",)  # a downgrade: v1 answers 404 for every claim
        with pytest.raises(ApiUnavailable) as err:
            reader.get("default", "c1", uid)
        assert not isinstance(err.value, ClaimGone) and reader.version is None
        assert str(err.value) == (
            "cannot read claim default/c1: the API server answered 404 Not Found: the server could not find "
            "the requested resource; the kubelet will retry"
        )
        assert reader.get("default", "c1", uid).uid == uid and reader.version == "v1beta1"
        with pytest.raises(ClaimGone) as gone:
            reader.get("default", "c2", uid)
        assert str(gone.value) == "claim default/c2 not found: it was deleted before it could be prepared"


def test_an_unreachable_api_server_is_a_per_claim_error_the_kubelet_retries() -> None:
    api = ApiServerSim()
    api.start()
    api.stop()  # nothing listens on its port
    with pytest.raises(ApiUnavailable) as err:
        reader_for(api.url).get("default", "c1", "uid-1")
    assert isinstance(err.value, ClaimError) and err.value.kind == "connection"
    assert str(err.value) == (
        "cannot read claim default/c1: the API server refused the connection (is it down?); "
        "the kubelet will retry"
    )
