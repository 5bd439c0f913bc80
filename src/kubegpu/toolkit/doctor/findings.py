"""What both doctors report: one finding per check and object, with evidence, fault number and fix.

The five classic faults: 1 the container sees no GPU, 2 the node shows no or too few GPUs, 3 the pod
is Pending, 4 the device plugin crash-loops, 5 the GPU request is malformed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"
MAX_LISTED = 10  # names shown in one finding's evidence


@dataclass
class Finding:
    check: str
    status: str  # ok, warn, fail
    object: str
    evidence: str
    fault: int | None
    fix: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ordered(findings: list[Finding]) -> list[Finding]:
    """Failures first, then warnings, then what is fine; stable within each."""
    order = {FAIL: 0, WARN: 1, OK: 2}
    return sorted(findings, key=lambda f: order[f.status])


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.status == FAIL for f in findings) else 0


def listed(names: list[str]) -> str:
    """Names for a finding's evidence: the first MAX_LISTED, then how many more."""
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more
