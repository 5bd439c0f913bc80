"""Which XIDs make a GPU unhealthy, and what each calls for.

Two layers: NVIDIA's rules (default ignored XIDs, DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS) decide
whether an XID is acted on at all, exactly as NVIDIA's plugin does; the XID catalog (xid_catalog.yaml, which a
user can extend) says what an acted-on XID calls for, which decides whether the GPU may recover by itself.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kubegpu.common.files import MIB, FileProblem, read_text_file
from kubegpu.common.quoting import VALUE_LIMIT, plain_id
from kubegpu.settings.env import DaemonEnv
from kubegpu.settings.gotext import preview
from kubegpu.settings.table import DISABLE_HEALTHCHECKS_ENV, ENABLE_HEALTHCHECKS_ENV, XID_ACTIONS_ENV
from kubegpu.settings.values import XidList

log = logging.getLogger(__name__)

# Application-level XIDs NVIDIA ignores by default: the fault is the workload's, not the GPU's.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


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


def _warn_malformed(variable: str, xids: XidList) -> None:
    for item in xids.malformed:
        log.warning("%s: ignoring %r, which is not an XID number (use e.g. 79 or all)", variable, item)


def xid_policy(disable: XidList, enable: XidList) -> XidPolicy:
    """NVIDIA's rule from DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS; malformed entries are skipped
    with a warning, as NVIDIA does."""
    _warn_malformed(DISABLE_HEALTHCHECKS_ENV, disable)
    _warn_malformed(ENABLE_HEALTHCHECKS_ENV, enable)
    return XidPolicy(
        disabled=DEFAULT_IGNORED_XIDS | disable.ids,
        disable_all=disable.all,
        enabled=enable.ids,
        enable_all=enable.all,
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


DEFAULT_ACTION = XidAction.RESET_GPU  # unknown XIDs: NVIDIA marks every XID it does not ignore


@dataclass(frozen=True, slots=True)
class _CatalogEntry:
    action: XidAction
    meaning: str = ""


class XidCatalogError(ValueError):
    pass


XID_CATALOG_LIMIT = MIB  # mounted from a ConfigMap, like the config file
_ACTIONS = ", ".join(a.value for a in XidAction)


class _Invalid(ValueError):
    """The catalog's problems, each `where: what`, all of them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))


def _parse_catalog(data: Any) -> dict[int, _CatalogEntry]:
    """`{xids: {<XID>: {action: <action>, meaning: <text>}}}`, checked; _Invalid lists every problem."""
    if not isinstance(data, dict):
        raise _Invalid([f"the file must be a mapping with the key xids (got {preview(data)})"])
    problems = [f"{key}: unknown key (the file has only xids)" for key in data if key != "xids"]
    xids = data.get("xids")
    if not isinstance(xids, dict):
        what = "missing" if "xids" not in data else f"must be a mapping of XID numbers (got {preview(xids)})"
        raise _Invalid([f"xids: {what}", *problems])
    out: dict[int, _CatalogEntry] = {}
    for key, raw in xids.items():
        where = f"xids.{key}"
        xid = _xid_number(key)
        if xid is None:
            problems.append(f"{where}: {preview(key)} is not an XID number (e.g. 48)")
            continue
        if not isinstance(raw, dict):
            problems.append(f"{where}: must be a mapping with action and meaning (got {preview(raw)})")
            continue
        problems.extend(
            f"{where}.{k}: unknown key (an entry has action and meaning)"
            for k in raw
            if k not in ("action", "meaning")
        )
        action = raw.get("action")
        known = isinstance(action, str) and action in XidAction._value2member_map_
        if not known:
            what = "missing" if "action" not in raw else f"must be one of {_ACTIONS} (got {preview(action)})"
            problems.append(f"{where}.action: {what}")
        meaning = raw.get("meaning", "")
        if not isinstance(meaning, str):
            problems.append(f"{where}.meaning: must be text (got {preview(meaning)})")
        if known and isinstance(meaning, str):
            out[xid] = _CatalogEntry(XidAction(str(action)), meaning)
    if problems:
        raise _Invalid(problems)
    return out


def _xid_number(key: Any) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


# One entry of the built-in catalog as it is written: `  48: {action: reset_gpu, meaning: "..."}`.
_BUILTIN_ENTRY = re.compile(r'\s+(\d+):\s*\{action:\s*(\w+),\s*meaning:\s*"([^"\\]*)"\}\s*')


@functools.cache
def _builtin() -> dict[int, _CatalogEntry]:
    """The shipped catalog, read line by line: its entries have one fixed form (a test checks that the YAML
    reader reads the file the same), so a daemon with no config or XID file never loads a YAML reader."""
    text = resources.files("kubegpu.node").joinpath("xid_catalog.yaml").read_text()
    entries: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#") or line == "xids:":
            continue
        match = _BUILTIN_ENTRY.fullmatch(line)
        if match is None:
            raise RuntimeError(f"xid_catalog.yaml: {line!r} is not in the built-in catalog's one-line form")
        entries[match[1]] = {"action": match[2], "meaning": match[3]}
    return _parse_catalog({"xids": entries})


def load_catalog(path: Path | None = None) -> dict[int, _CatalogEntry]:
    """The built-in catalog, or a user's file in the same shape (which extends and overrides it)."""
    builtin = _builtin()
    if path is None:
        return dict(builtin)
    from kubegpu.settings.goyaml import GoYamlError
    from kubegpu.settings.goyaml import load as load_yaml

    try:
        text = read_text_file(path, limit=XID_CATALOG_LIMIT, what="XID actions file")
        user = _parse_catalog(load_yaml(text).value or {"xids": {}})
    except (FileProblem, GoYamlError, _Invalid) as err:
        raise XidCatalogError(
            f"invalid XID actions file {plain_id(str(path), VALUE_LIMIT)} ({XID_ACTIONS_ENV}): "
            f"{_one_line(err)}; expected e.g. "
            "'xids: {48: {action: reset_gpu, meaning: double-bit ECC error}}' with actions "
            f"{_ACTIONS}"
        ) from err
    return {**builtin, **user}


def _one_line(err: Exception) -> str:
    line, column = getattr(err, "line", 0), getattr(err, "column", 0)  # a GoYamlError's place
    if line:
        return f"{err} (line {line}, column {column})"
    return str(err)


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


def xid_classifier(env: DaemonEnv) -> XidClassifier:
    """NVIDIA's ignore rules with the catalog (KUBEGPU_XID_ACTIONS's file, if any). Raises XidCatalogError."""
    policy = xid_policy(env.disable_healthchecks, env.enable_healthchecks)
    return XidClassifier(policy, load_catalog(env.xid_actions))


_DEFAULT: XidClassifier | None = None


def describe_xid(xid: int) -> str:
    """`XID 79 (GPU has fallen off the bus)`, from the built-in catalog."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = XidClassifier(XidPolicy(), load_catalog())
    return _DEFAULT.describe(xid)
