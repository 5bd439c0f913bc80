"""Which XIDs make a GPU unhealthy: NVIDIA's defaults and its DP_DISABLE/ENABLE_HEALTHCHECKS env vars."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Application-level XIDs NVIDIA ignores by default: the fault is the workload's, not the GPU's.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
_ALL_KEYS = ("all", "xids")


@dataclass(frozen=True, slots=True)
class XidPolicy:
    disabled: frozenset[int] = DEFAULT_IGNORED_XIDS
    disable_all: bool = False
    enabled: frozenset[int] = frozenset()
    enable_all: bool = False

    def is_critical(self, xid: int) -> bool:
        """True when this XID marks the GPU unhealthy."""
        if self.enable_all or xid in self.enabled:
            return True
        if self.disable_all:
            return False
        return xid not in self.disabled

    @property
    def checks_enabled(self) -> bool:
        """Whether any XID is checked at all.

        NVIDIA skips health checking entirely for DISABLE=all even when ENABLE lists specific XIDs (only
        ENABLE=all re-enables it); we check the listed XIDs instead, which is what the user asked for.
        """
        return not self.disable_all or self.enable_all or bool(self.enabled)


def _parse(raw: str, variable: str) -> tuple[bool, set[int]]:
    """(all requested, ids) from a comma list; `all`/`xids` discards ids listed before it, as NVIDIA does."""
    want_all, ids = False, set()
    for item in raw.split(","):
        token = item.strip().lower()
        if not token:
            continue
        if token in _ALL_KEYS:
            want_all, ids = True, set()
            continue
        try:
            xid = int(token)
        except ValueError:
            log.warning("%s: ignoring %r, which is not an XID number (use e.g. 79 or all)", variable, item)
            continue
        if xid < 0:
            log.warning("%s: ignoring negative XID %d", variable, xid)
            continue
        ids.add(xid)
    return want_all, ids


def policy_from_env(env: Mapping[str, str]) -> XidPolicy:
    disable_all, disabled = _parse(env.get(DISABLE_ENV, ""), DISABLE_ENV)
    enable_all, enabled = _parse(env.get(ENABLE_ENV, ""), ENABLE_ENV)
    return XidPolicy(
        disabled=DEFAULT_IGNORED_XIDS | disabled,
        disable_all=disable_all,
        enabled=frozenset(enabled),
        enable_all=enable_all,
    )


XID_MEANINGS: Mapping[int, str] = {
    13: "graphics engine exception (application fault)",
    31: "GPU memory page fault (application fault)",
    43: "GPU stopped processing (application fault)",
    45: "preemptive cleanup after an application fault",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout (application fault)",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def describe_xid(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid)
    return f"XID {xid} ({meaning})" if meaning else f"XID {xid}"
