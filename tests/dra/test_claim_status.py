"""The claim's status.devices written by the driver (dra/claim_status.py) through the light client against the
simulated API server: other drivers' entries kept, the same share's entry replaced, a write that lost a race
(409 Conflict) read and made again."""

from __future__ import annotations

from typing import Any

from kubegpu.apisim import ApiServerSim
from kubegpu.dra.claim_status import ClaimStatusWriter
from kubegpu.dra.claims import AllocatedClaim
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.settings.kubeaccess import ApiAccess

SHARE = "00000000-0000-4000-8000-000000000001"
OURS = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "shareID": SHARE}
THEIRS = {"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth1"}


def allocated(api: ApiServerSim) -> dict[str, Any]:
    created = api.create("resourceclaims", {"metadata": {"name": "c", "namespace": "default"},
                                            "spec": {"devices": {}}})  # fmt: skip
    created["status"] = {"allocation": {"devices": {"results": [OURS, THEIRS]}}}
    return api.update("resourceclaims", created, status=True)


def entry(memory: str) -> dict[str, Any]:
    return {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "shareID": SHARE,
            "data": {"consumedCapacity": {"memory": memory}}}  # fmt: skip


THEIR_ENTRY = {"driver": "net.example.com", "pool": "node-a", "device": "eth1", "data": {"mtu": 9000}}


class RacingClient(KubeClient):
    """Another writer changes the claim's status between our read and our write, once."""

    def __init__(self, api: ApiServerSim) -> None:
        super().__init__(ApiAccess(server=api.url))
        self.sim = api
        self.raced = False

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "PUT" and not self.raced:
            self.raced = True
            current = self.sim.get("resourceclaims", "c")
            current["status"]["devices"] = [THEIR_ENTRY]
            self.sim.update("resourceclaims", current, status=True)
        return super().request(method, path, **kwargs)


def test_the_entries_are_written_and_others_kept_through_a_conflict() -> None:
    with ApiServerSim() as api:
        uid = allocated(api)["metadata"]["uid"]
        client = RacingClient(api)
        writer = ClaimStatusWriter(client, lambda: "v1", 5.0)
        claim = AllocatedClaim("default", "c", uid, (), ())
        writer(claim, [entry("4Gi")])
        assert client.raced
        assert api.get("resourceclaims", "c")["status"]["devices"] == [THEIR_ENTRY, entry("4Gi")]
        writer(claim, [entry("6Gi")])  # the same share again: replaced, not added
        assert api.get("resourceclaims", "c")["status"]["devices"] == [THEIR_ENTRY, entry("6Gi")]
        puts = [c for c in api.calls if c.method == "PUT"]
        writer(claim, [entry("6Gi")])  # nothing changes: nothing is written
        assert [c for c in api.calls if c.method == "PUT"] == puts


def test_a_claim_replaced_under_the_same_name_is_left_alone() -> None:
    with ApiServerSim() as api:
        allocated(api)
        writer = ClaimStatusWriter(KubeClient(ApiAccess(server=api.url)), lambda: "v1", 5.0)
        writer(AllocatedClaim("default", "c", "another-uid", (), ()), [entry("4Gi")])
        assert "devices" not in api.get("resourceclaims", "c")["status"]


def test_the_claim_as_prepare_read_it_saves_a_read_and_a_stale_one_is_read_again() -> None:
    with ApiServerSim() as api:
        read = allocated(api)
        uid = read["metadata"]["uid"]
        writer = ClaimStatusWriter(KubeClient(ApiAccess(server=api.url)), lambda: "v1", 5.0)
        writer(AllocatedClaim("default", "c", uid, (), (), obj=read), [entry("4Gi")])
        assert [c.method for c in api.calls] == ["PUT"]  # no GET: Prepare's read was current
        stale = api.get("resourceclaims", "c")
        current = api.get("resourceclaims", "c")
        current["status"]["devices"] = [THEIR_ENTRY, entry("4Gi")]
        api.update("resourceclaims", current, status=True)  # someone writes after Prepare read it
        writer(AllocatedClaim("default", "c", uid, (), (), obj=stale), [entry("6Gi")])
        assert [c.method for c in api.calls][1:] == ["PUT", "GET", "PUT"]  # 409, read again, written
        assert api.get("resourceclaims", "c")["status"]["devices"] == [THEIR_ENTRY, entry("6Gi")]
