"""The Preparer as the driver builds it: the feature gates and the time slicer given as arguments reach
Prepare (the ConsumableShares mode: test_claim_status_writes.py); the claim reads of all calls together run
on at most eight named threads; `close` (the driver stopping) drops the reads not started and does not wait
for those in flight."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Container, Sequence
from pathlib import Path

from kubegpu.dra.claims import AllocatedClaim
from kubegpu.dra.timeslicing import TimeSlicer
from kubegpu.node.nvml import fake_smi
from kubegpu.settings.feature_gates import parse_feature_gates
from tests.builders import gpu_uuid
from tests.dra.test_prepare import Reader, allocated, make, ref
from tests.dra.test_publisher import eventually


def time_sliced(name: str, uid: str, device: str) -> dict[str, object]:
    sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    config = [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
               "parameters": parameters}}]  # fmt: skip
    return allocated(name, uid, [device], config=config)


async def test_the_gates_and_the_time_slicer_given_at_start_are_used(tmp_path: Path) -> None:
    fake_smi.install(tmp_path, tmp_path / "smi.log")
    calls: list[list[str]] = []

    def record(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv[1:]))
        return subprocess.CompletedProcess(argv, 0, "", "")

    gates = parse_feature_gates("TimeSlicingSettings=true")
    preparer, reader = make(tmp_path, gates=gates, timeslicer=TimeSlicer(str(tmp_path), run=record))
    reader.objects["c"] = time_sliced("c", "u1", "gpu-0")
    assert (await preparer.prepare([ref("c", "u1")]))["u1"].error == ""
    assert calls == [
        ["-i", gpu_uuid(0), "-c", "DEFAULT"],
        ["compute-policy", "-i", gpu_uuid(0), "--set-timeslice", "3"],  # Long
    ]

    plain, plain_reader = make(tmp_path / "defaults")  # the gates' defaults: TimeSlicingSettings off
    plain_reader.objects["c"] = time_sliced("c", "u1", "gpu-0")
    assert (await plain.prepare([ref("c", "u1")]))["u1"].error == (
        '"TimeSlicing" is selected as the GPU sharing strategy, but the "TimeSlicingSettings" feature gate '
        "is not enabled; start the driver with --feature-gates TimeSlicingSettings=true"
    )


class HeldReader(Reader):
    """Reads of the claims named in `held` (all when None) wait for `release`, at most `hold_s`; the other
    reads wait until one of those is in flight. Counts the reads in flight (at most: `most`) and the threads
    they run on."""

    def __init__(self, held: Container[str] | None = None, hold_s: float = 5.0) -> None:
        super().__init__()
        self.held = held
        self.release = threading.Event()
        self.held_started = threading.Event()
        self.hold_s = hold_s
        self.busy = 0
        self.most = 0
        self.threads: set[str] = set()
        self._count = threading.Lock()

    def get(self, namespace: str, name: str, uid: str) -> AllocatedClaim:
        with self._count:
            self.busy += 1
            self.most = max(self.most, self.busy)
            self.threads.add(threading.current_thread().name.rsplit("_", 1)[0])
        try:
            if self.held is None or name in self.held:
                self.held_started.set()
                self.release.wait(self.hold_s)
            else:
                self.held_started.wait(self.hold_s)
            return super().get(namespace, name, uid)
        finally:
            with self._count:
                self.busy -= 1


async def test_the_reads_of_all_calls_together_run_on_at_most_eight_claim_read_threads(
    tmp_path: Path,
) -> None:
    preparer, _ = make(tmp_path)
    reader = HeldReader()
    preparer.reader = reader
    for i in range(12):  # six calls of two claims: twelve reads wanted, two per call at a time
        reader.objects[f"c{i}"] = allocated(f"c{i}", f"u{i}", [])
    calls = [
        asyncio.ensure_future(preparer.prepare([ref(f"c{i}", f"u{i}"), ref(f"c{i + 6}", f"u{i + 6}")]))
        for i in range(6)
    ]
    await eventually(lambda: reader.busy >= 8, timeout=5.0)
    await asyncio.sleep(0.1)  # a ninth read would have started by now
    assert reader.busy == 8
    reader.release.set()
    answers = await asyncio.gather(*calls)
    assert reader.most == 8 and reader.gets == 12
    assert reader.threads == {"claim-read"}  # what a stack dump of a stuck driver shows them as
    assert [sorted(a) for a in answers] == [sorted([f"u{i}", f"u{i + 6}"]) for i in range(6)]
    preparer.close()


async def test_close_drops_the_reads_not_started_and_does_not_wait_for_those_in_flight(
    tmp_path: Path,
) -> None:
    preparer, _ = make(tmp_path)
    reader = HeldReader(hold_s=3.0)
    preparer.reader = reader
    for i in range(12):
        reader.objects[f"c{i}"] = allocated(f"c{i}", f"u{i}", [])
    calls = [
        asyncio.ensure_future(preparer.prepare([ref(f"c{i}", f"u{i}"), ref(f"c{i + 6}", f"u{i + 6}")]))
        for i in range(6)
    ]
    await eventually(lambda: reader.busy >= 8, timeout=5.0)
    started = time.monotonic()
    preparer.close()  # the driver stopping: eight reads in flight, four waiting for a thread
    assert time.monotonic() - started < 1.0
    reader.release.set()
    await asyncio.gather(*calls, return_exceptions=True)
    assert reader.gets == 8  # the four that waited never reached the API server
