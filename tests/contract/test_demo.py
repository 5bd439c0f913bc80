"""`kubegpu demo` end to end, as a newcomer runs it."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys

import pytest


def test_demo_runs_and_reports_what_it_shows() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results = json.loads(out.stdout)
    assert results["gpus"] == 8
    assert len(results["allocated"]) == 2
    assert results["visible_devices"].split(",") == results["allocated"]
    assert results["allocatable_after_xid"] == 7
    assert results["allocatable_after_restart"] == 7  # the XID'd GPU stays out across a kubelet restart
    assert results["allocatable_after_recovery"] == 8  # and comes back once recovery probes pass
    assert results["exit_code"] == 0 and results["sockets_left"] == []
    dra = results["dra"]
    assert dra["service"] == "v1.DRAPlugin"
    assert dra["devices"] == [f"gpu-{i}" for i in range(8)]
    (cdi,) = dra["cdi_devices"]
    assert cdi.startswith("k8s.gpu.nvidia.com/claim=") and cdi.endswith("-gpu-0")
    assert dra["exit_code"] == 0
    # ConsumableShares: two claims on one GPU by memory, each told its share, a third pending with the reason
    sharing = results["sharing"]
    assert {
        k: (v["device"], v["consumed"], v["env_memory_bytes"]) for k, v in sharing.items() if k != "pending"
    } == {
        "train": ("gpu-1", "24Gi", 24 * 1024**3),
        "serve": ("gpu-1", "12Gi", 12 * 1024**3),
    }
    (status,) = sharing["serve"]["status"]
    assert (status["device"], status["data"]["consumedCapacity"]) == ("gpu-1", {"memory": "12Gi"})
    assert sharing["pending"] == {
        "claim": "batch",
        "reason": "memory: 20Gi wanted, 4Gi left on the shared device "
        "(default/serve 12Gi, default/train 24Gi)",
    }
    # DynamicMIG on the mig-dynamic node: a 1g.10gb partition picked by the allocator, created at Prepare as
    # the device names it (A100 40GB: GI profile 15, placement 0, two memory slices), destroyed at Unprepare.
    mig = results["dynamic_mig"]
    assert (mig["partitions"], mig["counter_sets"], mig["mig_devices_before"]) == (100, 4, 0)
    assert mig["device"] == "gpu-0-mig-1g10gb-15-0"
    (cdi,) = mig["cdi_devices"]
    assert re.fullmatch(r"k8s\.gpu\.nvidia\.com/claim=[0-9a-f-]{36}-gpu-0-mig-1g10gb-15-0", cdi)
    assert mig["mig_devices"] == [{"profile": "1g.10gb", "gi_profile_id": 15, "placement": [0, 2]}]
    gpu_line, mig_line = mig["nvidia_smi_l"]
    assert gpu_line == "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1d3a5a3e-7a51-4f0b-9c1e-0a4e2c0d1001)"
    assert re.fullmatch(r"  MIG 1g\.10gb Device 0: \(UUID: MIG-[0-9a-f-]{36}\)", mig_line)
    assert (mig["mig_devices_after"], mig["exit_code"]) == (0, 0)
    # A time-sliced GPU split between two pods, each with its own memory and SM share; an idle holder.
    usage = results["usage"]
    assert usage["memory_bytes"] == {"train": 6 * 1024**3, "serve": 2 * 1024**3}
    assert usage["sm_share"] == {"train": 0.55, "serve": 0.15}
    assert usage["idle_holder"] == "lab/notebook" and usage["idle_seconds"] >= 1.0


def test_demo_human_output_narrates_every_step() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "demo"], capture_output=True, text=True, timeout=60, check=True
    )
    for step in (
        "Start the kubelet",
        "A pod asks for 2 GPUs",
        "XID 79",
        "kubelet restarts",
        "recovers by itself",
        "Clean exit",
        "GPU use: a shared GPU split between two pods, and an idle holder",
        "DRA: the same GPUs through resource.k8s.io",
        "DRA: one GPU shared by memory (ConsumableShares)",
        "DRA: a 1g partition made on demand (DynamicMIG)",
        "the scheduler picked partition gpu-0-mig-1g10gb-15-0",
        "$ nvidia-smi -L",
        "  MIG 1g.10gb Device 0: (UUID: MIG-",
        "the claim is unprepared and the MIG device destroyed (0 MIG devices left on the node)",
    ):
        assert step in out.stdout
    assert "NVIDIA_VISIBLE_DEVICES=" in out.stdout
    assert "Got goaway" not in out.stderr


# Every shipped profile but dgx-a100 (above), with its GPU count written out.
WITH_GPUS = {"t4-pcie": 4, "dgx1-volta": 8, "hgx-h100": 8, "a100-mig": 4, "a100-mig-single": 2,
             "a100-mig-invalid": 2}  # fmt: skip
WITHOUT_DRIVER = {
    "no-driver": "nvml init failed: Driver Not Loaded.",
    "no-library": "nvml init failed: NVML Shared Library Not Found.",
}


def _demo(profile: str) -> tuple[int, str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "kubegpu", "demo", "--profile", profile, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, out.stdout, out.stderr


@pytest.mark.timeout(600)  # nine demos in a row (about 20 s on an idle 2-core machine); loaded CI is slower
def test_demo_runs_on_every_shipped_profile() -> None:
    profiles = [*WITH_GPUS, *WITHOUT_DRIVER]
    # The demos mostly wait (recovery's quiet period): three at a time keeps the test short.
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = dict(zip(profiles, pool.map(_demo, profiles), strict=True))
    for profile, gpus in WITH_GPUS.items():
        code, stdout, stderr = outcomes[profile]
        assert code == 0, f"{profile}: {stderr}"
        results = json.loads(stdout)
        assert results["gpus"] == gpus
        assert len(results["allocated"]) == 2
        assert results["allocatable_after_xid"] == gpus - 1
        assert results["allocatable_after_restart"] == gpus - 1
        assert results["allocatable_after_recovery"] == gpus
        assert results["exit_code"] == 0 and results["sockets_left"] == []
    for profile, error in WITHOUT_DRIVER.items():
        code, stdout, stderr = outcomes[profile]
        assert code == 0, f"{profile}: {stderr}"
        results = json.loads(stdout)
        assert results["gpus"] == 0
        assert results["exit_code"] == 1  # failOnInitError=true: the plugin stops, saying why
        assert results["error"].startswith(f"kubegpu: {error}")
        assert results["capacity_without_driver"] == {}  # failOnInitError=false: up, advertising nothing
        assert results["exit_code_waiting"] == 0


def test_an_unknown_profile_is_one_line_and_exit_2() -> None:
    code, stdout, stderr = _demo("no-such-profile")
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1
    assert stderr.startswith(
        "Error: Invalid value for --profile: unknown fake NVML profile 'no-such-profile': use one of "
    )
