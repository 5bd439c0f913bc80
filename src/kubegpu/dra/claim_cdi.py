"""One transient CDI spec per prepared claim, as NVIDIA's DRA driver writes them.

Vendor `k8s.<driver>` (k8s.gpu.nvidia.com), class `claim`; a device per prepared device named
`<claim UID>-<device>`, so its fully qualified ID is `k8s.gpu.nvidia.com/claim=<claim UID>-gpu-0`. The file is
`<vendor>-claim_<claim UID>.json` (the CDI library's transient spec name) under the CDI root, written
atomically before Prepare answers: the runtime resolves the IDs the kubelet hands it from this file. The
names are unique per claim, so a runtime's CDI cache never serves a stale device.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubegpu.allocation.cdi import CDI_VERSION, CdiOptions, common_edits
from kubegpu.allocation.resources import gpu_device, mig_device
from kubegpu.common.files import FileProblem, read_bytes, write_atomic
from kubegpu.dra.devices import DraDevice
from kubegpu.node.driverfiles import join
from kubegpu.node.inventory import Inventory

log = logging.getLogger(__name__)

CLAIM_CLASS = "claim"
_SPEC_LIMIT = 4 * 1024 * 1024  # a claim's spec names a few devices; anything bigger is not ours


def vendor(driver_name: str) -> str:
    return f"k8s.{driver_name}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(driver_name: str, claim_uid: str, device: str) -> str:
    return f"{vendor(driver_name)}/{CLAIM_CLASS}={cdi_device_name(claim_uid, device)}"


class ClaimSpecs:
    """Writes and removes the per-claim specs under the CDI root."""

    def __init__(self, root: Path, driver_name: str, options: CdiOptions | None = None) -> None:
        self.root = root
        self.driver_name = driver_name
        self.options = options or CdiOptions()
        self._common: dict[str, Any] | None = None

    def path(self, claim_uid: str) -> Path:
        return self.root / f"{vendor(self.driver_name)}-{CLAIM_CLASS}_{claim_uid}.json"

    def write(
        self,
        claim_uid: str,
        devices: Sequence[DraDevice],
        inventory: Inventory,
        edits: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """The claim's spec; `edits` maps device name -> more container edits (a share's env, an MPS
        daemon's env and mounts: `mps_deployment.cdi_edits`)."""
        minors = self.options.mig_minors
        entries = []
        for device in devices:
            nodes = (
                mig_device(device.gpu, device.mig, minors) if device.mig else gpu_device(device.gpu)
            ).paths
            entry: dict[str, Any] = {
                "deviceNodes": [{"path": p, "hostPath": join(self.options.dev_root, p)} for p in nodes]
            }
            for key, more in (edits or {}).get(device.name, {}).items():
                entry[key] = [*entry.get(key, []), *more]
            entries.append({"name": cdi_device_name(claim_uid, device.name), "containerEdits": entry})
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": f"{vendor(self.driver_name)}/{CLAIM_CLASS}",
            "devices": entries,
            "containerEdits": self._common_edits(inventory),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path(claim_uid), (json.dumps(spec, indent=2) + "\n").encode())

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)

    def on_disk(self, known: Container[str] = ()) -> dict[str, tuple[str, ...]]:
        """The claims whose spec is on disk, except the `known` ones, by UID, with the devices each spec
        names: what was prepared, whatever the checkpoint says. A spec that cannot be read names no devices
        (and is logged)."""
        prefix = f"{vendor(self.driver_name)}-{CLAIM_CLASS}_"
        try:
            names = sorted(os.listdir(self.root))  # the order Prepare looks at them in: the same each time
        except FileNotFoundError:
            return {}
        out = {}
        for name in names:
            if name.startswith(prefix) and name.endswith(".json"):
                uid = name[len(prefix) : -len(".json")]
                if uid not in known:
                    out[uid] = self._devices_in(uid)
        return out

    def _devices_in(self, claim_uid: str) -> tuple[str, ...]:
        path = self.path(claim_uid)
        try:
            spec = json.loads(read_bytes(path, limit=_SPEC_LIMIT, what="CDI spec"))
            names = [str(d["name"]) for d in spec["devices"]]
        except (FileProblem, ValueError, KeyError, TypeError) as err:
            log.warning("cannot read the devices of the CDI spec %s: %s", path, err)
            return ()
        own = f"{claim_uid}-"
        return tuple(n.removeprefix(own) for n in names if n.startswith(own))

    def _common_edits(self, inventory: Inventory) -> dict[str, Any]:
        if self._common is None:  # the driver files do not change while the driver runs
            self._common = common_edits(inventory, self.options)
        return self._common
