"""The FaultBook: what makes a GPU unhealthy, kept until the GPU itself recovers."""

from __future__ import annotations

from kubegpu.node.faults import Fault, FaultBook, Recorded
from kubegpu.node.inventory import Health
from kubegpu.node.xids import XidAction

GPU0, GPU1 = "GPU-0", "GPU-1"


def test_a_fault_is_new_then_repeated_then_worse() -> None:
    book = FaultBook()
    assert book.record(GPU0, XidAction.RESET_GPU, "XID 48", 48, now=1.0) == (
        Recorded.NEW,
        Fault(XidAction.RESET_GPU, "XID 48", 48, 1.0),
    )
    # A repeat keeps what the fault is and restarts its quiet period.
    assert book.record(GPU0, XidAction.RESET_GPU, "XID 79", 79, now=2.0) == (
        Recorded.REPEATED,
        Fault(XidAction.RESET_GPU, "XID 48", 48, 2.0),
    )
    # Worse: what the fault is changes, and its quiet period starts over from this event.
    assert book.record(GPU0, XidAction.REBOOT_NODE, "XID 154", 154, now=3.0) == (
        Recorded.WORSE,
        Fault(XidAction.REBOOT_NODE, "XID 154", 154, 3.0),
    )
    assert book.get(GPU0) == Fault(XidAction.REBOOT_NODE, "XID 154", 154, 3.0)
    # Nothing is milder than a reboot: a reset-class XID now only restarts the clock.
    assert book.record(GPU0, XidAction.RESET_GPU, "XID 48", 48, now=4.0)[0] is Recorded.REPEATED
    assert book.get(GPU0) == Fault(XidAction.REBOOT_NODE, "XID 154", 154, 4.0)


def test_a_recovery_clears_only_the_fault_it_checked() -> None:
    book = FaultBook()
    _, seen = book.record(GPU0, XidAction.RESET_GPU, "XID 48", 48, now=1.0)
    book.record(GPU0, XidAction.RESET_GPU, "XID 48", 48, now=5.0)  # a new XID while the probe ran
    assert not book.clear(GPU0, seen) and GPU0 in book
    assert book.clear(GPU0, book.snapshot()[GPU0]) and GPU0 not in book


def test_health_of_the_faulty_gpus_asked_for() -> None:
    book = FaultBook()
    book.record(GPU0, XidAction.RESET_GPU, "XID 79 (GPU has fallen off the bus)", 79, now=1.0)
    book.record(GPU1, XidAction.REBOOT_NODE, "XID 154", 154, now=1.0)
    assert book.health([GPU0, "GPU-2"]) == {
        GPU0: Health.failed("XID 79 (GPU has fallen off the bus); action: reset_gpu", 79)
    }
    assert set(book.health()) == {GPU0, GPU1}
