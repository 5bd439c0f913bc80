"""Unprepare's error paths on a node with faults injected on purpose: a time slice that cannot be reset (a
failing nvidia-smi), an MPS control daemon that cannot be stopped (the API server down), a CDI spec that
cannot be removed, a checkpoint that cannot be written. Each is answered to the kubelet with its cause,
counted by kind, and leaves the claim prepared (spec and checkpoint entry) so the kubelet's retry finishes
it; with ConsumableShares, what another claim still holds (its time slice, MPS daemon, device) is kept and
logged."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import pytest

from kubegpu.dra import checkpoint as checkpoint_module
from kubegpu.dra.api_errors import ApiUnreachable
from kubegpu.dra.checkpoint import Checkpoint
from kubegpu.dra.prepare import Preparer
from kubegpu.dra.rebuild import rebuild
from kubegpu.dra.timeslicing import TimeSlicer
from kubegpu.node.nvml import fake_smi
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.builders import gpu_uuid
from tests.dra.test_mps_daemon import FakeApi, daemons
from tests.dra.test_prepare import Reader, allocated, make, ref
from tests.dra.test_rebuild import lose_the_checkpoint

GPU0, GPU1 = gpu_uuid(0), gpu_uuid(1)  # GPU-00000000-1111-2222-3333-000000000000, GPU-00000001-...
DEPLOYMENTS = "/apis/apps/v1/namespaces/nvidia-dra/deployments"


def sharing_claim(
    name: str,
    uid: str,
    device: str,
    sharing: dict[str, Any] | None,
    *,
    share: str | None = None,
    consumed: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A claim allocated `device`, with a GpuConfig of `sharing` (none when None), held whole or, with a
    shareID `share` (ConsumableShares), as a share that consumed `consumed` (1Gi of memory by default)."""
    config = []
    if sharing is not None:
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
        config = [{"source": "FromClaim", "requests": ["gpu"],
                   "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]  # fmt: skip
    obj = allocated(name, uid, [device], config=config)
    if share is not None:
        result = obj["status"]["allocation"]["devices"]["results"][0]
        result.update(shareID=share, consumedCapacity=consumed or {"memory": "1Gi"})
    return obj


LONG = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
MPS = {"strategy": "MPS"}


def time_sliced(preparer: Preparer, root: Path, *, shares: bool = False) -> Path:
    """TimeSlicingSettings on, nvidia-smi the fake one under the driver root; the log of its calls."""
    smi_log = root / "smi.log"
    fake_smi.install(root / "driver-root", smi_log)
    preparer.timeslicer = TimeSlicer(str(root / "driver-root"))
    gates = "TimeSlicingSettings=true" + (",ConsumableShares=true" if shares else "")
    preparer.gates = parse_feature_gates(gates)
    preparer.shares = "memory" if shares else None
    return smi_log


class NodeApi(FakeApi):
    """Every MPS daemon is ready at once; `down` makes each call fail as an unreachable API server does."""

    def __init__(self) -> None:
        pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"ready": True}]}}
        super().__init__({"/api/v1/namespaces/nvidia-dra/pods": {"items": [pod]}})
        self.down = False

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.down:
            raise ApiUnreachable("cannot reach the API server at https://10.0.0.1:443: connection refused")
        if method == "GET" and path.startswith(f"{DEPLOYMENTS}/"):
            self.calls.append((method, path))
            return {"status": {"readyReplicas": 1}}
        return super().request(method, path, **kwargs)

    def deleted(self) -> list[str]:
        return [path.removeprefix(f"{DEPLOYMENTS}/") for method, path in self.calls if method == "DELETE"]


def with_mps(preparer: Preparer, root: Path, *, shares: bool = False, api: NodeApi | None = None) -> NodeApi:
    """MPSSupport on (and ConsumableShares when `shares`) against `api` (by default one whose daemons are
    ready at once), the fake nvidia-smi logging to root/smi.log."""
    api = api or NodeApi()
    fake_smi.install(root / "plugin" / "driver-root", root / "smi.log")
    gates = "MPSSupport=true" + (",ConsumableShares=true" if shares else "")
    preparer.gates = parse_feature_gates(gates)
    preparer.shares = "memory" if shares else None
    preparer.mps = daemons(root / "plugin", api, [])
    return api


async def prepare_sharers(preparer: Preparer, reader: Reader, sharing: dict[str, Any]) -> None:
    """Claims a and b (u-a, u-b) holding shares of gpu-0, and w (u-w) holding gpu-1 whole, all with
    `sharing`, prepared."""
    reader.objects["a"] = sharing_claim("a", "u-a", "gpu-0", sharing, share="s-a")
    reader.objects["b"] = sharing_claim("b", "u-b", "gpu-0", sharing, share="s-b")
    reader.objects["w"] = sharing_claim("w", "u-w", "gpu-1", sharing)
    out = await preparer.prepare([ref("a", "u-a"), ref("b", "u-b"), ref("w", "u-w")])
    assert {uid: o.error for uid, o in out.items()} == {"u-a": "", "u-b": "", "u-w": ""}


def spec_of(root: Path, uid: str) -> Path:
    return root / "cdi" / f"k8s.gpu.nvidia.com-claim_{uid}.json"


def messages(caplog: pytest.LogCaptureFixture, logger: str = "kubegpu.dra.claim_devices") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


async def test_a_time_slice_that_cannot_be_reset_fails_unprepare_and_the_retry_resets_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    smi_log = time_sliced(preparer, tmp_path)
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-0", LONG)
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    assert fake_smi.calls(smi_log) == [f"-i {GPU0} -c DEFAULT", f"compute-policy -i {GPU0} --set-timeslice 3"]

    (tmp_path / "smi.log.fail").write_text("Unable to set the compute policy: Insufficient Permissions\n")
    caplog.set_level(logging.INFO)
    assert await preparer.unprepare([ref("c", "u1")]) == {
        "u1": "error resetting timeslice config in claim 'u1': error running nvidia-smi: exit status 3: "
        "Unable to set the compute policy: Insufficient Permissions"
    }
    assert preparer.failures.counts == {"timeslice": 1}
    assert list(preparer.checkpoint.claims) == ["u1"]  # kept for the retry
    assert spec_of(tmp_path, "u1").exists()
    assert not [m for m in messages(caplog) if m.startswith("unprepared")]

    (tmp_path / "smi.log.fail").unlink()
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert fake_smi.calls(smi_log)[-2:] == [
        f"-i {GPU0} -c DEFAULT",
        f"compute-policy -i {GPU0} --set-timeslice 0",
    ]
    assert preparer.checkpoint.claims == {} and not spec_of(tmp_path, "u1").exists()
    assert messages(caplog)[-1] == "unprepared claim default/c (u1)"


async def test_a_shared_gpu_keeps_its_time_slice_until_its_last_holder_is_unprepared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    smi_log = time_sliced(preparer, tmp_path, shares=True)
    await prepare_sharers(preparer, reader, LONG)
    set_calls = len(fake_smi.calls(smi_log))

    caplog.set_level(logging.INFO)
    assert await preparer.unprepare([ref("a", "u-a")]) == {"u-a": ""}
    assert len(fake_smi.calls(smi_log)) == set_calls  # b still uses gpu-0's time slice
    assert messages(caplog) == [
        "claim default/a: device gpu-0 is still used by another claim: kept",
        "unprepared claim default/a (u-a)",
    ]
    assert not spec_of(tmp_path, "u-a").exists() and sorted(preparer.checkpoint.claims) == ["u-b", "u-w"]

    caplog.clear()
    assert await preparer.unprepare([ref("b", "u-b")]) == {"u-b": ""}  # the last holder: back to Default
    assert fake_smi.calls(smi_log)[set_calls:] == [
        f"-i {GPU0} -c DEFAULT",
        f"compute-policy -i {GPU0} --set-timeslice 0",
    ]
    assert messages(caplog) == ["unprepared claim default/b (u-b)"]


async def test_without_shares_an_admin_claim_on_the_gpu_does_not_keep_its_time_slice(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    smi_log = time_sliced(preparer, tmp_path)
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-0", LONG)
    admin = allocated("admin", "u-admin", ["gpu-0"])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    reader.objects["admin"] = admin
    out = await preparer.prepare([ref("c", "u1"), ref("admin", "u-admin")])
    assert {uid: o.error for uid, o in out.items()} == {"u1": "", "u-admin": ""}
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert fake_smi.calls(smi_log)[-1] == f"compute-policy -i {GPU0} --set-timeslice 0"


async def test_an_mps_daemon_that_cannot_be_stopped_fails_unprepare_and_keeps_the_claim(
    tmp_path: Path,
) -> None:
    preparer, reader = make(tmp_path)
    api = with_mps(preparer, tmp_path)
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-0", MPS)
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    daemon_dir = tmp_path / "plugin" / "mps" / "u1-c3a6e"  # NVIDIA's ID: claim UID, sha256 of the UUIDs
    assert daemon_dir.is_dir()

    api.down = True
    assert await preparer.unprepare([ref("c", "u1")]) == {
        "u1": "claim default/c: error unpreparing devices: error deleting MPS control daemon "
        "mps-control-daemon-u1-c3a6e: cannot reach the API server at https://10.0.0.1:443: connection refused"
    }
    assert preparer.failures.counts == {"mps": 1}
    assert list(preparer.checkpoint.claims) == ["u1"] and spec_of(tmp_path, "u1").exists()
    assert daemon_dir.is_dir()

    api.down = False
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert api.deleted() == ["mps-control-daemon-u1-c3a6e"]
    assert fake_smi.compute_modes(tmp_path / "smi.log") == {GPU0: "DEFAULT"}
    assert not daemon_dir.exists() and preparer.checkpoint.claims == {}


async def test_a_shared_mps_daemon_is_kept_and_said_so_while_another_claim_uses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    api = with_mps(preparer, tmp_path, shares=True)
    await prepare_sharers(preparer, reader, MPS)  # w's daemon: NVIDIA's per-claim one
    assert sorted(p.name for p in (tmp_path / "plugin" / "mps").iterdir()) == [
        "gpu-c3a6e328500d",  # gpu-0's daemon, named after the GPU: both sharers use it
        "u-w-3af14",
    ]

    caplog.set_level(logging.INFO)
    assert await preparer.unprepare([ref("a", "u-a")]) == {"u-a": ""}
    assert api.deleted() == []
    assert messages(caplog) == [
        "claim default/a: MPS control daemon mps-control-daemon-gpu-c3a6e328500d is still used by another "
        "claim: kept",
        "claim default/a: device gpu-0 is still used by another claim: kept",
        "unprepared claim default/a (u-a)",
    ]
    assert await preparer.unprepare([ref("b", "u-b"), ref("w", "u-w")]) == {"u-b": "", "u-w": ""}
    assert api.deleted() == ["mps-control-daemon-gpu-c3a6e328500d", "mps-control-daemon-u-w-3af14"]


async def test_an_orphans_mps_daemon_is_found_by_its_directory_and_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim whose checkpoint entry is lost (its spec is on disk): Unprepare finds its daemon by the
    directory named after the claim, stops it and removes the spec."""
    first, reader = make(tmp_path)
    with_mps(first, tmp_path)
    reader.objects["c"] = sharing_claim("c", "u1", "gpu-0", MPS)
    assert (await first.prepare([ref("c", "u1")]))["u1"].error == ""
    first.checkpoint.remove("u1")

    restarted, _ = make(tmp_path)
    api = with_mps(restarted, tmp_path)
    caplog.set_level(logging.INFO)
    assert await restarted.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert api.deleted() == ["mps-control-daemon-u1-c3a6e"]
    assert not (tmp_path / "plugin" / "mps" / "u1-c3a6e").exists()
    assert not spec_of(tmp_path, "u1").exists() and restarted.orphans == {}
    assert messages(caplog)[-1] == "unprepared claim default/c (u1) (known from its CDI spec only)"


async def test_a_cdi_spec_that_cannot_be_removed_fails_unprepare_with_its_path_and_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    spec = spec_of(tmp_path, "u1")
    spec.unlink()
    (spec / "stuck").mkdir(parents=True)  # something the driver cannot unlink where its spec was

    expected = f"claim default/c: cannot remove {spec}: Is a directory"
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": expected}
    assert preparer.failures.counts == {"io": 1}
    assert expected in [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert list(preparer.checkpoint.claims) == ["u1"]  # the entry goes only with the spec

    (spec / "stuck").rmdir()
    spec.rmdir()
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    assert preparer.checkpoint.claims == {}


class FullDisk:
    """The checkpoint's file system, full on demand: writing it fails as os.write does, with no file name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        write = checkpoint_module.write_atomic

        def write_unless_full(path: Path, data: bytes, **kwargs: Any) -> bool:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(path, data, **kwargs)

        monkeypatch.setattr(checkpoint_module, "write_atomic", write_unless_full)


async def test_a_checkpoint_that_cannot_be_written_fails_unprepare_with_the_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparer, reader = make(tmp_path)
    disk = FullDisk(monkeypatch)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    disk.full = True
    expected = "claim default/c: cannot remove a file: No space left on device"
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": expected}
    assert preparer.failures.counts == {"io": 1}
    assert expected in [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert not spec_of(tmp_path, "u1").exists()  # the spec goes first
    on_disk = Checkpoint(preparer.checkpoint.path, preparer.checkpoint.boot_id)
    on_disk.load()
    assert list(on_disk.claims) == ["u1"]  # the entry, for the retry


async def test_the_retry_of_an_unprepare_whose_checkpoint_write_failed_removes_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The entry stays in memory as it stays on disk: the retry must find it (an entry dropped from memory
    # only answered the retry with success and held its device for the next driver process).
    preparer, reader = make(tmp_path)
    disk = FullDisk(monkeypatch)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    disk.full = True
    assert (await preparer.unprepare([ref("c", "u1")]))["u1"] != ""
    assert list(preparer.checkpoint.claims) == ["u1"]
    disk.full = False
    assert await preparer.unprepare([ref("c", "u1")]) == {"u1": ""}
    restarted, _ = make(tmp_path)  # the next driver process reads what is on disk
    assert restarted.checkpoint.claims == {}


async def test_unprepare_of_an_unknown_claim_does_nothing_and_says_so_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, _ = make(tmp_path)
    caplog.set_level(logging.DEBUG, logger="kubegpu.dra.claim_devices")
    assert await preparer.unprepare([ref("never", "u9")]) == {"u9": ""}
    assert messages(caplog) == ["unprepare of unknown claim default/never (u9): nothing to do"]
    assert preparer.released == set()  # the checkpoint is intact: nothing to remember


async def test_a_uid_sent_under_another_name_is_a_mismatch_counted_as_such(tmp_path: Path) -> None:
    preparer, reader = make(tmp_path)
    reader.objects["c"] = allocated("c", "u1", ["gpu-0"])
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    assert (await preparer.unprepare([ref("d", "u1")]))["u1"].startswith("claim default/d: UID u1 belongs to")
    assert preparer.failures.counts == {"mismatch": 1}
    assert list(preparer.checkpoint.claims) == ["u1"]


async def test_a_claim_unprepared_while_the_checkpoint_is_lost_is_not_rebuilt(tmp_path: Path) -> None:
    """The API server may still list a claim as reserved after the kubelet unprepared it (the reservation
    goes with the pod): the rebuild after a lost checkpoint must not prepare it again."""
    preparer, _ = await lose_the_checkpoint(tmp_path)
    assert await preparer.unprepare([ref("c1", "u1")]) == {"u1": ""}
    assert preparer.released == {"u1"}
    assert await rebuild(preparer) == 1  # u2 from its spec; u1 stays unprepared
    assert sorted(preparer.checkpoint.claims) == ["u2"]
    assert not spec_of(tmp_path, "u1").exists()
