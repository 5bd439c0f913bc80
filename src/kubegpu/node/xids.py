"""Which XIDs make a GPU unhealthy, and what each calls for.

Two layers: NVIDIA's rules (default ignored XIDs, DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS) decide
whether an XID is acted on at all, exactly as NVIDIA's plugin does; the XID catalog (xid_catalog.yaml, which a
user can extend) says what an acted-on XID calls for, which decides whether the GPU may recover by itself.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

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


class XidAction(enum.StrEnum):
    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"

    @property
    def marks_unhealthy(self) -> bool:
        return self in (XidAction.RESET_GPU, XidAction.REBOOT_NODE)

    @property
    def recoverable(self) -> bool:
        """Whether recovery probes may bring the GPU back (a reboot-class fault needs a human)."""
        return self is XidAction.RESET_GPU

    @property
    def advice(self) -> str:
        return {
            XidAction.IGNORE: "nothing to do",
            XidAction.RESTART_APP: "restart the application; the GPU stays Healthy",
            XidAction.RESET_GPU: "reset the GPU (nvidia-smi -r) or let recovery probes bring it back",
            XidAction.REBOOT_NODE: "drain and reboot the node",
        }[self]


ACTIONS_ENV = "KUBEGPU_XID_ACTIONS"
DEFAULT_ACTION = XidAction.RESET_GPU  # unknown XIDs: NVIDIA marks every XID it does not ignore


class _CatalogEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: XidAction
    meaning: str = ""


class _Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    xids: dict[int, _CatalogEntry]


class XidCatalogError(ValueError):
    pass


def load_catalog(path: Path | None = None) -> dict[int, _CatalogEntry]:
    """The built-in catalog, or a user's file in the same shape (which extends and overrides it)."""
    builtin = _Catalog.model_validate(
        yaml.safe_load(resources.files("kubegpu.node").joinpath("xid_catalog.yaml").read_text())
    )
    if path is None:
        return builtin.xids
    try:
        user = _Catalog.model_validate(yaml.safe_load(path.read_text()) or {"xids": {}})
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise XidCatalogError(
            f"invalid XID actions file {path} ({ACTIONS_ENV}): {err}; expected e.g. "
            "'xids: {48: {action: reset_gpu, meaning: double-bit ECC error}}' with actions "
            f"{', '.join(a.value for a in XidAction)}"
        ) from err
    return {**builtin.xids, **user.xids}


@dataclass(frozen=True, slots=True)
class XidClassifier:
    """The action an XID calls for: the catalog, with NVIDIA's env vars deciding what is ignored.

    NVIDIA's ignore list (defaults plus DP_DISABLE_HEALTHCHECKS) wins over the catalog, so migrated nodes
    behave the same; an XID listed in DP_ENABLE_HEALTHCHECKS marks the GPU even where the catalog would not.
    """

    policy: XidPolicy
    catalog: Mapping[int, _CatalogEntry]

    def action(self, xid: int) -> XidAction:
        if not self.policy.is_critical(xid):
            entry = self.catalog.get(xid)
            return entry.action if entry and not entry.action.marks_unhealthy else XidAction.IGNORE
        if self.policy.enable_all or xid in self.policy.enabled:
            entry = self.catalog.get(xid)
            return entry.action if entry and entry.action.marks_unhealthy else DEFAULT_ACTION
        entry = self.catalog.get(xid)
        return entry.action if entry else DEFAULT_ACTION

    def meaning(self, xid: int) -> str:
        entry = self.catalog.get(xid)
        return entry.meaning if entry else ""

    def describe(self, xid: int) -> str:
        meaning = self.meaning(xid)
        return f"XID {xid} ({meaning})" if meaning else f"XID {xid}"


def classifier_from_env(env: Mapping[str, str]) -> XidClassifier:
    path = env.get(ACTIONS_ENV, "").strip()
    return XidClassifier(policy_from_env(env), load_catalog(Path(path) if path else None))


_DEFAULT: XidClassifier | None = None


def describe_xid(xid: int) -> str:
    """`XID 79 (GPU has fallen off the bus)`, from the built-in catalog."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = XidClassifier(XidPolicy(), load_catalog())
    return _DEFAULT.describe(xid)
