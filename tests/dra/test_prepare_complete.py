"""What a prepared claim leaves behind, read whole: the devices answered to the kubelet, its CDI spec (a
share's env, an MPS client's limits), the status.devices entries of its shares, its checkpoint entry, and
the log lines an SRE reads; and the per-claim refusals of `_stage` (a foreign pool, a node with no devices,
a strategy whose gate is off, MPS with shares but without MPSSupport, a time slice nvidia-smi cannot set,
an MPS daemon that does not come up), NVIDIA's texts written out."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra.checkpoint import PreparedClaim, PreparedDevice
from kubegpu.dra.claims import AllocatedClaim
from kubegpu.dra.gpuconfig import ConfigError
from kubegpu.node.nvml import fake_smi
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.builders import gpu_uuid, make_inventory
from tests.dra.test_prepare import allocated, make, ref
from tests.dra.test_unprepare_paths import (
    DEPLOYMENTS,
    GPU0,
    LONG,
    MPS,
    NodeApi,
    messages,
    sharing_claim,
    spec_of,
    time_sliced,
    with_mps,
)

SPEC_ENV_OF_SHARE = [
    "KUBEGPU_SHARE_ID=s-a",
    "KUBEGPU_CONSUMED_MEMORY_BYTES=1073741824",  # 1Gi
    "KUBEGPU_DEVICE_MEMORY_BYTES=42949672960",  # the builders' GPU: 40Gi
]


def spec_devices(root: Path, uid: str) -> dict[str, dict[str, Any]]:
    """The claim's CDI spec: container edits by device name."""
    spec = json.loads(spec_of(root, uid).read_text())
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def two_shares(sharing: dict[str, Any], consumed: dict[str, str]) -> dict[str, Any]:
    """Claim a (u-a) holding a share of gpu-0 (s-a) and of gpu-1 (s-a1), each having consumed `consumed`."""
    obj = sharing_claim("a", "u-a", "gpu-0", sharing, share="s-a", consumed=consumed)
    first = obj["status"]["allocation"]["devices"]["results"][0]
    obj["status"]["allocation"]["devices"]["results"].append({**first, "device": "gpu-1", "shareID": "s-a1"})
    return obj


async def test_a_claims_shares_reach_its_spec_its_status_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    time_sliced(preparer, tmp_path, shares=True)
    preparer.shares = 4  # integer mode: 4 shares a device
    written: list[tuple[str, list[dict[str, Any]]]] = []
    preparer.status_writer = lambda claim, entries: written.append((claim.uid, entries))
    reader.objects["a"] = two_shares(LONG, {"memory": "1Gi", "shares": "1"})
    caplog.set_level(logging.INFO)

    out = await preparer.prepare([ref("a", "u-a")])
    assert out["u-a"].devices == (
        PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=u-a-gpu-0",), False, "s-a"),
        PreparedDevice(("gpu",), "node-a", "gpu-1", ("k8s.gpu.nvidia.com/claim=u-a-gpu-1",), False, "s-a1"),
    )
    env = {name: edits["env"] for name, edits in spec_devices(tmp_path, "u-a").items()}
    assert env == {
        f"u-a-gpu-{i}": [
            f"KUBEGPU_SHARE_ID={share}",
            "KUBEGPU_CONSUMED_MEMORY_BYTES=1073741824",
            "KUBEGPU_DEVICE_MEMORY_BYTES=42949672960",
            "KUBEGPU_CONSUMED_SHARES=1",
            "KUBEGPU_DEVICE_SHARES=4",
        ]
        for i, share in ((0, "s-a"), (1, "s-a1"))
    }
    data = {
        "consumedCapacity": {"memory": "1Gi", "shares": "1"},
        "deviceCapacity": {"memory": "40Gi", "shares": "4"},
    }
    assert written == [
        (
            "u-a",
            [
                {
                    "driver": "gpu.nvidia.com",
                    "pool": "node-a",
                    "device": "gpu-0",
                    "shareID": "s-a",
                    "data": data,
                },
                {
                    "driver": "gpu.nvidia.com",
                    "pool": "node-a",
                    "device": "gpu-1",
                    "shareID": "s-a1",
                    "data": data,
                },
            ],
        )
    ]
    assert messages(caplog) == [
        "prepared claim default/a (u-a): gpu-0 for gpu, gpu-1 for gpu",
        "claim default/a: device gpu-0 shared by {'strategy': 'TimeSlicing', 'interval': 'Long'}",
        "claim default/a: device gpu-1 shared by {'strategy': 'TimeSlicing', 'interval': 'Long'}",
    ]
    assert preparer.checkpoint.claims["u-a"].sharing == {
        "gpu-0": {"strategy": "TimeSlicing", "interval": "Long"},
        "gpu-1": {"strategy": "TimeSlicing", "interval": "Long"},
    }


async def test_an_mps_share_is_kept_to_what_it_consumed_and_a_whole_gpu_gets_nvidias_edits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    with_mps(preparer, tmp_path, shares=True)
    reader.objects["a"] = sharing_claim("a", "u-a", "gpu-0", MPS, share="s-a")
    reader.objects["w"] = sharing_claim("w", "u-w", "gpu-1", MPS)
    caplog.set_level(logging.INFO)
    out = await preparer.prepare([ref("a", "u-a"), ref("w", "u-w")])
    assert {uid: o.error for uid, o in out.items()} == {"u-a": "", "u-w": ""}

    def mounts(daemon: str) -> list[dict[str, Any]]:
        base = tmp_path / "plugin" / "mps" / daemon
        options = ["rw", "nosuid", "nodev", "bind"]
        return [
            {"hostPath": str(base / "shm"), "containerPath": "/dev/shm", "options": options},
            {"hostPath": str(base / "pipe"), "containerPath": "/tmp/nvidia-mps", "options": options},
        ]

    assert spec_devices(tmp_path, "u-a") == {
        "u-a-gpu-0": {
            "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
            "env": [
                *SPEC_ENV_OF_SHARE,
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU0}=1024M",  # 1Gi
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=2",  # 1Gi of 40Gi: 2.5 %, rounded down
            ],
            "mounts": mounts("gpu-c3a6e328500d"),
        }
    }
    assert spec_devices(tmp_path, "u-w") == {
        "u-w-gpu-1": {
            "deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}],
            "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],  # NVIDIA's: no client limits
            "mounts": mounts("u-w-3af14"),
        }
    }
    assert [m for m in messages(caplog) if "shared by" in m] == [
        "claim default/a: device gpu-0 shared by {'strategy': 'MPS', 'mpsControlDaemon': 'gpu-c3a6e328500d'}",
        "claim default/w: device gpu-1 shared by {'strategy': 'MPS', 'mpsControlDaemon': 'u-w-3af14'}",
    ]


class NeverReady(NodeApi):
    """The daemon's Deployment never gets a ready replica (an image that cannot be pulled)."""

    ready = False

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET" and path.startswith(f"{DEPLOYMENTS}/") and not self.ready:
            self.calls.append((method, path))
            return {"status": {"replicas": 1}}
        return super().request(method, path, **kwargs)


async def test_an_mps_daemon_that_does_not_come_up_fails_the_claim_and_leaves_it_started(
    tmp_path: Path,
) -> None:
    preparer, reader = make(tmp_path)
    api = NeverReady()
    with_mps(preparer, tmp_path, api=api)
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-0", MPS)
    out = await preparer.prepare([ref("c", "u1")])
    assert (out["u1"].error, out["u1"].kind) == (
        "claim default/c: MPS control daemon is not yet ready: waiting for MPS control daemon to come "
        "online; the kubelet will retry",
        "mps",
    )
    # The Deployment stays; the entry records the daemon, so Unprepare (or the retry) finds it.
    assert preparer.checkpoint.claims == {
        "u1": PreparedClaim(
            "u1",
            "default",
            "c",
            "PrepareStarted",
            (PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=u1-gpu-0",)),),
            {"gpu-0": {"strategy": "MPS", "mpsControlDaemon": "u1-c3a6e"}},
        )
    }
    assert not spec_of(tmp_path, "u1").exists()
    assert (tmp_path / "plugin" / "mps" / "u1-c3a6e").is_dir()

    api.ready = True
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    assert preparer.checkpoint.claims["u1"].state == "PrepareCompleted" and spec_of(tmp_path, "u1").exists()


async def test_stage_refuses_each_claim_with_its_cause_and_records_nothing(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    elsewhere = allocated("elsewhere", "u1", ["gpu-0"])
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    reader.objects["elsewhere"] = elsewhere
    reader.objects["sliced"] = sharing_claim("sliced", "u2", "gpu-0", LONG)
    reader.objects["mps"] = sharing_claim("mps", "u3", "gpu-1", MPS)
    out = await preparer.prepare([ref("elsewhere", "u1"), ref("sliced", "u2"), ref("mps", "u3")])
    assert {uid: (o.error, o.kind) for uid, o in out.items()} == {
        "u1": (
            "claim default/elsewhere: device gpu-0 was allocated from pool node-b, this node's pool is "
            "node-a",
            "invalid",
        ),
        "u2": (
            '"TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" feature '
            "gate is not enabled; start the driver with --feature-gates TimeSlicingSettings=true",
            "config",
        ),
        "u3": (
            '"MPS" is selected as the GPU sharing strategy, but the "MPSSupport" feature gate is not '
            "enabled; start the driver with --feature-gates MPSSupport=true",
            "config",
        ),
    }
    assert preparer.checkpoint.claims == {} and not (tmp_path / "cdi").exists()

    preparer.gates, preparer.shares = parse_feature_gates("ConsumableShares=true"), "memory"
    reader.objects["mps"] = sharing_claim("mps", "u3", "gpu-1", MPS, share="s-3")
    assert (await preparer.prepare([ref("mps", "u3")]))["u3"].error == (
        "MPS sharing is not supported when consumable shares is enabled"  # NVIDIA's
    )


async def test_a_node_that_publishes_no_devices_says_so(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path, make_inventory(0))
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == (
        "claim default/c: device gpu-0 is not published by this node (it publishes no devices)"
    )


async def test_a_time_slice_nvidia_smi_cannot_set_fails_the_claim_before_anything_is_recorded(
    tmp_path: Path,
) -> None:
    preparer, reader = make(tmp_path)
    smi_log = time_sliced(preparer, tmp_path)
    (tmp_path / "smi.log.fail").write_text("Failed to set the compute mode: GPU is lost\n")
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-1", LONG)
    out = await preparer.prepare([ref("c", "u1")])
    assert (out["u1"].error, out["u1"].kind) == (
        "error setting timeslice config for requests '[gpu]' in claim 'u1': error running nvidia-smi: exit "
        "status 3: Failed to set the compute mode: GPU is lost",
        "timeslice",
    )
    assert fake_smi.calls(smi_log) == [f"-i {gpu_uuid(1)} -c DEFAULT"]
    assert preparer.checkpoint.claims == {} and not spec_of(tmp_path, "u1").exists()


def test_sharing_summary_is_the_claims_configs_by_device_as_its_entry_records_them(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    obj = sharing_claim("c", "u1", "gpu-0", LONG)
    results = obj["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "plain", "device": "gpu-1"})  # no config for this request
    claim: AllocatedClaim = reader.check(obj, "default", "c", "u1")
    assert preparer.sharing_summary(claim) == {"gpu-0": {"strategy": "TimeSlicing", "interval": "Long"}}
    results[1]["device"] = "gpu-7"
    with pytest.raises(ConfigError, match=r"^claim default/c: a device is not published here$"):
        preparer.sharing_summary(reader.check(obj, "default", "c", "u1"))


async def test_a_claim_holding_one_gpu_whole_still_shares_its_other_gpus_share(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    time_sliced(preparer, tmp_path, shares=True)
    mixed = sharing_claim("m", "u-m", "gpu-0", LONG, share="s-m")
    results = mixed["status"]["allocation"]["devices"]["results"]
    results.append({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"})
    reader.objects["m"] = mixed
    reader.objects["n"] = sharing_claim("n", "u-n", "gpu-0", LONG, share="s-n")
    reader.objects["x"] = sharing_claim("x", "u-x", "gpu-1", LONG, share="s-x")
    out = await preparer.prepare([ref("m", "u-m"), ref("n", "u-n"), ref("x", "u-x")])
    assert {uid: o.error for uid, o in out.items()} == {
        "u-m": "",
        "u-n": "",  # gpu-0 is a share of m's: shared by NVIDIA's rule
        "u-x": "claim default/x: device gpu-1 is already prepared for claim default/m (u-m)",  # whole
    }
