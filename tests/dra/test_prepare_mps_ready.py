"""Prepare waits for a claim's MPS control daemon as NVIDIA's driver does (MPSSupport, here on a shared GPU):
one that does not come online fails the claim with NVIDIA's text after NVIDIA's waits, before any CDI spec
is written; the kubelet's retry, once the daemon is ready, rolls the unfinished Prepare back and prepares
the claim."""

from __future__ import annotations

import json
from pathlib import Path

from kubegpu.node.nvml import fake_smi
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.dra.test_mps_daemon import FakeApi, daemons
from tests.dra.test_prepare import make, ref
from tests.dra.test_prepare_shares import mps_sharer

DEPLOYMENT = "/apis/apps/v1/namespaces/nvidia-dra/deployments/mps-control-daemon-gpu-c3a6e328500d"
PODS = "/api/v1/namespaces/nvidia-dra/pods"
SPEC = "k8s.gpu.nvidia.com-claim_u-a.json"


async def test_a_daemon_not_ready_fails_the_claim_and_the_retry_prepares_it_once_ready(
    tmp_path: Path,
) -> None:
    gates = parse_feature_gates("ConsumableShares=true,MPSSupport=true")
    preparer, reader = make(tmp_path, gates=gates, shares="memory")
    fake_smi.install(tmp_path / "plugin" / "driver-root", tmp_path / "smi.log")
    api = FakeApi({DEPLOYMENT: {"status": {"replicas": 1}}})  # created, never ready
    sleeps: list[float] = []
    preparer.mps = daemons(tmp_path / "plugin", api, sleeps)
    reader.objects["a"] = mps_sharer("a", "u-a")

    out = await preparer.prepare([ref("a", "u-a")])
    assert (out["u-a"].error, out["u-a"].kind) == (
        "claim default/a: MPS control daemon is not yet ready: waiting for MPS control daemon to come "
        "online; the kubelet will retry",
        "mps",
    )
    assert api.calls == [("POST", DEPLOYMENT.rsplit("/", 1)[0])] + [("GET", DEPLOYMENT)] * 4
    assert len(sleeps) == 3  # NVIDIA's four tries
    assert not (tmp_path / "cdi" / SPEC).exists()
    entry = preparer.checkpoint.claims["u-a"]  # the daemon recorded with it: a restart finds it
    assert (entry.state, entry.sharing) == (
        "PrepareStarted",
        {"gpu-0": {"strategy": "MPS", "mpsControlDaemon": "gpu-c3a6e328500d"}},
    )

    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"ready": True}]}}
    api.objects = {DEPLOYMENT: {"status": {"readyReplicas": 1}}, PODS: {"items": [pod]}}
    api.calls.clear()
    out = await preparer.prepare([ref("a", "u-a")])
    assert out["u-a"].error == ""
    assert ("GET", DEPLOYMENT) in api.calls  # waited for again: ready now
    assert preparer.checkpoint.claims["u-a"].state == "PrepareCompleted"
    spec = json.loads((tmp_path / "cdi" / SPEC).read_text())
    assert [d["name"] for d in spec["devices"]] == ["u-a-gpu-0"]
