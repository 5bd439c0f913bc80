"""The status.devices entries Prepare writes for shared allocations (ConsumableShares), through the real claim
reader and status writer against the simulated API server: each shared claim written once, after the lock is
free; a write the API server refuses or holds is logged with the claims it concerns and never fails a claim
or holds up the answer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kubegpu.apisim import ApiServerSim, Fault
from kubegpu.dra.claim_status import ClaimStatusWriter
from kubegpu.dra.claims import AllocatedClaim, ClaimReader
from kubegpu.dra.kubeapi import KubeClient
from kubegpu.dra.prepare import Preparer
from kubegpu.settings.feature_gates import parse_feature_gates
from kubegpu.settings.kubeaccess import ApiAccess
from tests.dra.test_prepare import allocated, make, ref

LOG = "kubegpu.dra.prepare"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
SHARES = {
    "c1": "00000000-0000-4000-8000-000000000001",
    "c2": "00000000-0000-4000-8000-000000000002",
    "c4": "00000000-0000-4000-8000-000000000004",
}
WRITE_FAILED = (
    'the API server answered 500 Internal Server Error: an error on the server ("injected") has prevented '
    "the request from succeeding"
)


def entry(name: str, memory: str) -> dict[str, Any]:
    """The claim's status.devices entry for its share of gpu-0 (a 40 GiB A100 of the test inventory)."""
    return {
        "driver": "gpu.nvidia.com",
        "pool": "node-a",
        "device": "gpu-0",
        "shareID": SHARES[name],
        "data": {"consumedCapacity": {"memory": memory}, "deviceCapacity": {"memory": "40Gi"}},
    }


class OnThreads:
    """The status writer, recording the threads it is called on."""

    def __init__(self, writer: ClaimStatusWriter) -> None:
        self.writer = writer
        self.threads: set[str] = set()

    def __call__(self, claim: AllocatedClaim, entries: list[dict[str, Any]]) -> None:
        self.threads.add(threading.current_thread().name.rsplit("_", 1)[0])
        self.writer(claim, entries)


class Node:
    """A Preparer with ConsumableShares on, reading and writing claims through the simulated API server."""

    def __init__(self, api: ApiServerSim, preparer: Preparer, writer: OnThreads) -> None:
        self.api = api
        self.preparer = preparer
        self.writer = writer
        self.uids: dict[str, str] = {}

    def allocate(self, name: str, device: str, memory: str | None = None) -> str:
        """A claim allocated on this node and reserved for a pod: a share of `memory` of the device, or
        the device whole; its UID."""
        obj = allocated(name, "", [device])
        if memory is not None:
            result = obj["status"]["allocation"]["devices"]["results"][0]
            result.update(shareID=SHARES[name], consumedCapacity={"memory": memory})
        created = self.api.create("resourceclaims", {**obj, "spec": {"devices": {}}})
        created["status"] = obj["status"]
        self.uids[name] = self.api.update("resourceclaims", created, status=True)["metadata"]["uid"]
        return self.uids[name]

    async def prepare(self, *names: str) -> dict[str, str]:
        out = await self.preparer.prepare([ref(name, self.uids[name]) for name in names])
        return {name: out[self.uids[name]].error for name in names}

    def devices(self, name: str) -> Any:
        return self.api.get("resourceclaims", name)["status"].get("devices")

    def calls(self) -> list[tuple[str, str]]:
        """The claim reads and writes so far, each path relative to the claims' collection."""
        return [(c.method, c.path.removeprefix(CLAIMS)) for c in self.api.calls if c.path.startswith(CLAIMS)]


@contextmanager
def shared_node(tmp_path: Path, timeout: float = 5.0, *, shares: bool = True) -> Iterator[Node]:
    """`shares`: ConsumableShares on (else off, as when a claim allocated while it was on comes later)."""
    if shares:
        preparer, _ = make(tmp_path, gates=parse_feature_gates("ConsumableShares=true"), shares="memory")
    else:
        preparer, _ = make(tmp_path)
    with ApiServerSim() as api:
        client = KubeClient(ApiAccess(server=api.url))
        reader = ClaimReader(client, "gpu.nvidia.com", timeout)
        preparer.reader = reader
        # As the driver wires it (dra/daemon.py): the writer's own timeout, the reader's version.
        writer = OnThreads(ClaimStatusWriter(client, lambda: reader.version or "v1", 5.0))
        if shares:
            preparer.status_writer = writer
        try:
            yield Node(api, preparer, writer)
        finally:
            preparer.close()


async def test_each_shared_claim_is_written_once_and_a_claim_holding_a_device_whole_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with shared_node(tmp_path) as node:
        node.allocate("c1", "gpu-0", "1Gi")
        node.allocate("c2", "gpu-0", "2Gi")
        node.allocate("c3", "gpu-1")
        with caplog.at_level(logging.WARNING, logger=LOG):
            assert await node.prepare("c1", "c2", "c3") == {"c1": "", "c2": "", "c3": ""}
        assert node.devices("c1") == [entry("c1", "1Gi")]
        assert node.devices("c2") == [entry("c2", "2Gi")]
        assert node.devices("c3") is None
        assert sorted(node.calls()) == [
            ("GET", "c1"),
            ("GET", "c2"),
            ("GET", "c3"),
            ("PUT", "c1/status"),  # from the claim as Prepare read it: no second GET
            ("PUT", "c2/status"),
        ]
        before = len(node.calls())
        node.allocate("c4", "gpu-0", "4Gi")
        assert await node.prepare("c4") == {"c4": ""}
        assert node.calls()[before:] == [("GET", "c4"), ("PUT", "c4/status")]  # the others not again
        assert await node.prepare("c1", "c4") == {"c1": "", "c4": ""}  # answered from the checkpoint
        assert node.calls()[before:] == [("GET", "c4"), ("PUT", "c4/status")]
        assert node.devices("c4") == [entry("c4", "4Gi")]
        assert caplog.messages == []
        # On the claim reads' threads: the driver's API calls in flight stay bounded, and stop with close().
        assert node.writer.threads == {"claim-read"}


async def test_a_refused_status_write_is_logged_with_its_claim_and_the_claims_stay_prepared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with shared_node(tmp_path) as node:
        uid = node.allocate("c1", "gpu-0", "1Gi")
        node.allocate("c2", "gpu-0", "2Gi")
        node.api.fault = Fault(status=500, path_contains="c1/status")
        with caplog.at_level(logging.WARNING, logger=LOG):
            assert await node.prepare("c1", "c2") == {"c1": "", "c2": ""}
        assert caplog.messages == [
            f"cannot write the status.devices of claim default/c1 ({uid}): {WRITE_FAILED}"
        ]
        assert node.devices("c1") is None
        assert node.devices("c2") == [entry("c2", "2Gi")]
        checkpoint = node.preparer.checkpoint
        assert {u: c.state for u, c in checkpoint.claims.items()} == {
            node.uids["c1"]: "PrepareCompleted",
            node.uids["c2"]: "PrepareCompleted",
        }
        assert node.preparer.failures.counts == {}  # not a failure of the claim


async def test_status_writes_the_api_server_holds_are_left_behind_and_logged_with_their_claims(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with shared_node(tmp_path, timeout=1.0) as node:
        u1, u2 = node.allocate("c1", "gpu-0", "1Gi"), node.allocate("c2", "gpu-0", "2Gi")
        node.api.fault = Fault(hang_s=3.0, path_contains="/status")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=LOG):
            assert await node.prepare("c1", "c2") == {"c1": "", "c2": ""}
        assert time.monotonic() - started < 3.0  # answered before the API server did
        assert caplog.messages == [
            f"2 claim status write(s) did not finish within 1 s: claim default/c1 ({u1}), "
            f"claim default/c2 ({u2})"
        ]
        assert node.devices("c1") is None and node.devices("c2") is None
        assert len(node.preparer.checkpoint.claims) == 2


async def test_without_consumable_shares_no_status_is_written_even_for_a_shared_allocation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with shared_node(tmp_path, shares=False) as node:
        node.allocate("c1", "gpu-0", "1Gi")  # allocated as a share while the mode was on
        with caplog.at_level(logging.WARNING, logger=LOG):
            assert await node.prepare("c1") == {"c1": ""}
        assert node.calls() == [("GET", "c1")]
        assert node.devices("c1") is None
        assert caplog.messages == []
