"""resource.k8s.io v1 <-> v1beta1: the same object read back in either version (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubegpu.apisim.convert import from_hub, to_hub
from kubegpu.apisim.kinds import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.dra_objects import claim, gpu, request, resource_slice

SLICES = st.lists(st.integers(0, 7), unique=True, max_size=4).map(
    lambda minors: resource_slice("node-a", [gpu(m) for m in minors])
)
REQUESTS = st.lists(
    st.builds(
        request,
        st.sampled_from(["a", "b", "c"]),
        count=st.none() | st.integers(1, 4),
        selectors=st.lists(st.sampled_from(['device.driver == "x"', "true"]), max_size=2),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda r: r["name"],
)


@given(SLICES)
def test_slices_survive_a_trip_through_v1beta1(body: dict[str, Any]) -> None:
    beta = from_hub(RESOURCE_SLICES, "v1beta1", to_hub(RESOURCE_SLICES, "v1", body))
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert all(set(d) <= {"name", "basic"} for d in beta["spec"]["devices"])
    assert to_hub(RESOURCE_SLICES, "v1beta1", beta) == body


@given(REQUESTS)
def test_claims_and_templates_survive_a_trip_through_v1beta1(requests: list[dict[str, Any]]) -> None:
    body = claim("c", requests)
    beta = from_hub(RESOURCE_CLAIMS, "v1beta1", body)
    assert all("exactly" not in r and "deviceClassName" in r for r in beta["spec"]["devices"]["requests"])
    assert to_hub(RESOURCE_CLAIMS, "v1beta1", beta) == body
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
    }
    template["spec"] = {"spec": body["spec"]}
    beta_template = from_hub(RESOURCE_CLAIM_TEMPLATES, "v1beta1", template)
    assert to_hub(RESOURCE_CLAIM_TEMPLATES, "v1beta1", beta_template) == template


def test_v1beta2_is_v1_with_another_api_version() -> None:
    body = resource_slice("node-a", [gpu(0)])
    assert from_hub(RESOURCE_SLICES, "v1beta2", body) == {**body, "apiVersion": "resource.k8s.io/v1beta2"}
