"""dra_manager_state: the kubelet's JSON shape, round trips, and corruption refused (hypothesis)."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubegpu.kubeletsim.dra_checkpoint import ClaimInfo, PreparedDevice, from_json, to_json

NAMES = st.text(alphabet=string.ascii_lowercase + string.digits + "-.", min_size=1, max_size=12)
DEVICES = st.builds(
    PreparedDevice,
    NAMES,
    NAMES,
    st.tuples(NAMES) | st.just(()),
    st.lists(NAMES.map(lambda n: f"k8s.gpu.nvidia.com/claim={n}"), max_size=2).map(tuple),
)
CLAIMS = st.lists(
    st.builds(
        ClaimInfo,
        st.uuids().map(str),
        NAMES,
        NAMES,
        st.sets(st.uuids().map(str), max_size=3),
        st.dictionaries(NAMES, st.lists(DEVICES, max_size=3), max_size=2),
    ),
    max_size=4,
)


@given(CLAIMS)
def test_round_trip(claims: list[ClaimInfo]) -> None:
    back = from_json(to_json(claims))
    assert [(c.claim_uid, c.claim_name, c.namespace, c.pod_uids, c.drivers) for c in back] == [
        (c.claim_uid, c.claim_name, c.namespace, c.pod_uids, c.drivers) for c in claims
    ]
    assert all(not c.prepared for c in back)  # never checkpointed: prepared again after a restart


@given(CLAIMS, st.integers(min_value=1, max_value=2**32 - 1))
def test_a_changed_checksum_is_refused(claims: list[ClaimInfo], delta: int) -> None:
    outer = json.loads(to_json(claims))
    outer["Checksum"] = (outer["Checksum"] + delta) % 2**32
    with pytest.raises(ValueError, match="corrupt DRA manager checkpoint: checksum mismatch"):
        from_json(json.dumps(outer))


def test_the_kubelets_shape() -> None:
    claim = ClaimInfo(
        "uid-1", "c1", "default", {"pod-1"}, {"gpu.nvidia.com": [PreparedDevice("node-a", "gpu-0")]}
    )
    outer = json.loads(to_json([claim]))
    assert set(outer) == {"Data", "Checksum"}
    assert json.loads(outer["Data"]) == {
        "kind": "DRACheckpoint",
        "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
        "ClaimInfoStateList": [
            {
                "ClaimUID": "uid-1",
                "ClaimName": "c1",
                "Namespace": "default",
                "PodUIDs": {"pod-1": {}},
                "DriverState": {
                    "gpu.nvidia.com": {
                        "Devices": [
                            {
                                "PoolName": "node-a",
                                "DeviceName": "gpu-0",
                                "RequestNames": None,
                                "CDIDeviceIDs": None,
                            }
                        ]
                    }
                },
            }
        ],
    }


@given(st.text(max_size=40))
def test_garbage_is_a_clear_error(text: str) -> None:
    try:
        from_json(text)
    except ValueError as err:
        assert str(err).startswith("corrupt DRA manager checkpoint: ")
