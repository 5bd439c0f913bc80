"""The kubelet's DRA manager (pkg/kubelet/cm/dra/manager.go, v1.32-1.34): Prepare and Unprepare per pod.

Prepare, before a pod's containers start:
1. every pod claim is resolved to its ResourceClaim name (claims from templates must be owned by the
   pod) and fetched from the API server; it must be allocated and reserved for the pod;
2. a claim-info entry records the claim, the pod and the drivers of its allocation; the checkpoint is
   written before any driver is called;
3. claims already prepared are skipped; the rest are batched into one NodePrepareResources per driver
   (each call limited to `call_timeout`, 45 s);
4. a failed call, a claim with an error, an unknown claim UID or a claim left out fails the pod start
   (retried by a later sync); otherwise the devices are stored, the claims marked prepared and the
   checkpoint written again.
Each container then gets the CDI IDs of the devices whose request names match its `resources.claims`.
Unprepare, when a pod is gone: claims still used by another pod only lose the reference; the rest are
batched into one NodeUnprepareResources per driver and forgotten once the driver succeeded. A claim the
kubelet has no entry for (checkpoint lost) is never unprepared by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubegpu.api.dra.v1 import api_pb2 as dra_v1

from .dra_api import ApiEndpoint, ApiRequestError
from .dra_checkpoint import ClaimInfo, PreparedDevice, read_checkpoint, write_checkpoint
from .dra_plugins import DraPluginError, PluginStore
from .events import EventKind, EventLog
from .pods import Container, Pod


class DraError(Exception):
    """Why Prepare or Unprepare failed, in the kubelet's words."""


@dataclass(frozen=True, slots=True)
class _Request:
    namespace: str
    uid: str
    name: str


class DraManager:
    def __init__(
        self,
        root: Path,
        api: ApiEndpoint,
        plugins: PluginStore,
        events: EventLog,
        *,
        checkpoint: bool = True,
    ) -> None:
        self.root = root
        self._api = api
        self._plugins = plugins
        self._events = events
        self._use_checkpoint = checkpoint
        self._claims: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name) -> info

    # ---- state ------------------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the checkpoint (claims come back unprepared: every one is prepared again)."""
        if not self._use_checkpoint:
            return 0
        claims = read_checkpoint(self.root) or []
        self._claims = {(c.namespace, c.claim_name): c for c in claims}
        return len(claims)

    def _sync(self) -> None:
        if self._use_checkpoint:
            write_checkpoint(self.root, self._claims.values())

    def claim_info(self, namespace: str, name: str) -> ClaimInfo | None:
        return self._claims.get((namespace, name))

    def claims(self) -> list[ClaimInfo]:
        return list(self._claims.values())

    # ---- prepare ----------------------------------------------------------------------------------

    async def prepare(self, pod: Pod) -> None:
        """DraError when the pod cannot start yet."""
        batches: dict[str, list[_Request]] = {}
        fetched: dict[str, Mapping[str, Any]] = {}  # claim uid -> the claim, for claims to prepare now
        for claim_name, from_template in pod.claim_names():
            try:
                claim = await self._api.get_claim(pod.namespace, claim_name)
            except ApiRequestError as err:
                name = claim_name
                raise DraError(
                    f"failed to fetch ResourceClaim {name} referenced by pod {pod.name}: {err}"
                ) from None
            meta = claim.get("metadata") or {}
            if from_template and not any(
                ref.get("uid") == pod.uid for ref in meta.get("ownerReferences") or []
            ):
                raise DraError(
                    f"ResourceClaim {pod.namespace}/{claim_name} was not created for pod "
                    f"{pod.namespace}/{pod.name} (pod is not owner)"
                )
            status = claim.get("status") or {}
            if not any(ref.get("uid") == pod.uid for ref in status.get("reservedFor") or []):
                raise DraError(
                    f"pod {pod.name}({pod.uid}) is not allowed to use resource claim "
                    f"{claim_name}({meta.get('uid', '')})"
                )
            key = (pod.namespace, claim_name)
            info = self._claims.get(key)
            if info is None:
                allocation = status.get("allocation")
                if not allocation:
                    raise DraError(
                        f"locked cache operation: claim {pod.namespace}/{claim_name}: not allocated"
                    )
                drivers = {
                    r.get("driver", "") for r in (allocation.get("devices") or {}).get("results") or []
                }
                info = ClaimInfo(
                    meta.get("uid", ""), claim_name, pod.namespace, set(), {d: [] for d in drivers}
                )
                self._claims[key] = info
            info.pod_uids.add(pod.uid)
            self._sync()
            if info.prepared:
                continue
            fetched[info.claim_uid] = claim
            for driver in sorted(info.drivers):
                batches.setdefault(driver, []).append(
                    _Request(info.namespace, info.claim_uid, info.claim_name)
                )
        prepared: list[str] = []
        for driver, claims in batches.items():
            devices = await self._prepare_batch(pod, driver, claims)
            for uid, found in devices.items():
                info = self._by_uid(uid)
                info.drivers[driver] = found
            prepared += [f"{c.namespace}/{c.name}" for c in claims]
        for uid in fetched:
            self._by_uid(uid).prepared = True
        self._sync()
        if batches:
            self._events.emit(
                EventKind.CLAIMS_PREPARED,
                f"pod {pod.name}: prepared {', '.join(sorted(set(prepared)))} "
                f"({', '.join(f'{d}: {len(c)} claim(s)' for d, c in sorted(batches.items()))})",
                pod=pod.name,
                claims=sorted(set(prepared)),
                drivers=sorted(batches),
            )

    def _by_uid(self, uid: str) -> ClaimInfo:
        for info in self._claims.values():
            if info.claim_uid == uid:
                return info
        raise DraError(f"unable to get claim info for claim UID {uid}")

    async def _prepare_batch(
        self, pod: Pod, driver: str, claims: list[_Request]
    ) -> dict[str, list[PreparedDevice]]:
        answers = await self._call(driver, "NodePrepareResources", claims)
        return {
            uid: [
                PreparedDevice(d.pool_name, d.device_name, tuple(d.request_names), tuple(d.cdi_device_ids))
                for d in cast(dra_v1.NodePrepareResourceResponse, answer).devices
            ]
            for uid, answer in answers.items()
        }

    async def _call(self, driver: str, method: str, claims: list[_Request]) -> dict[str, Any]:
        """One batched call to the driver's plugin, checked as the kubelet checks it: every claim
        answered, none with an error, no unknown UID. Returns the answers by claim UID."""
        try:
            plugin = self._plugins.get(driver)
        except DraPluginError as err:
            raise DraError(f"failed to get gRPC client for driver {driver}: {err}") from None
        messages: Any = plugin.messages
        request = getattr(messages, f"{method}Request")(
            claims=[messages.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        try:
            response: Any = await plugin.call(method, request, getattr(messages, f"{method}Response"))
        except DraPluginError as err:
            raise DraError(f"{method} failed: {err}") from None
        for uid, answer in response.claims.items():
            asked = next((c for c in claims if c.uid == uid), None)
            if asked is None:
                raise DraError(f"{method} returned result for unknown claim UID {uid}")
            if answer.error:
                raise DraError(f"{method} failed for claim {asked.namespace}/{asked.name}: {answer.error}")
        unfinished = len(claims) - len(response.claims)
        if unfinished:
            raise DraError(f"{method} left out {unfinished} claims")
        return dict(response.claims)

    # ---- unprepare --------------------------------------------------------------------------------

    async def unprepare(self, pod: Pod) -> None:
        await self.unprepare_claims(pod.uid, pod.namespace, [name for name, _ in pod.claim_names()])

    async def unprepare_claims(self, pod_uid: str, namespace: str, claim_names: Iterable[str | None]) -> None:
        batches: dict[str, list[_Request]] = {}
        done: list[tuple[str, str]] = []
        for name in claim_names:
            if name is None:
                continue
            info = self._claims.get((namespace, name))
            if info is None:
                continue
            if len(info.pod_uids) > 1:
                info.pod_uids.discard(pod_uid)
                continue
            done.append((namespace, name))
            for driver in sorted(info.drivers):
                batches.setdefault(driver, []).append(
                    _Request(info.namespace, info.claim_uid, info.claim_name)
                )
        for driver, claims in batches.items():
            await self._call(driver, "NodeUnprepareResources", claims)
        for key in done:
            self._claims.pop(key, None)
        self._sync()
        if batches:
            names = sorted({f"{ns}/{n}" for ns, n in done})
            self._events.emit(
                EventKind.CLAIMS_UNPREPARED,
                f"unprepared {', '.join(names)} ({', '.join(sorted(batches))})",
                claims=names,
                drivers=sorted(batches),
            )

    # ---- containers and reconciliation ------------------------------------------------------------

    def cdi_devices(self, pod: Pod, container: Container) -> list[str]:
        """The CDI IDs the runtime gets for `container` (GetResources), or DraError."""
        ids: list[str] = []
        for pod_claim in pod.resource_claims:
            if pod_claim.claim_name is None:
                continue
            for claim in container.claims:
                if claim.name != pod_claim.name:
                    continue
                info = self._claims.get((pod.namespace, pod_claim.claim_name))
                if info is None:
                    name = pod_claim.claim_name
                    raise DraError(f"unable to get claim info for claim {name} in namespace {pod.namespace}")
                ids.extend(info.cdi_devices(claim.request))
        extended = pod.extended_claim
        if extended is not None:  # the bridge's claim: the requests the scheduler mapped to this container
            requests = [
                m.request_name for m in extended.request_mappings if m.container_name == container.name
            ]
            if requests:
                info = self._claims.get((pod.namespace, extended.claim_name))
                if info is None:
                    name = extended.claim_name
                    raise DraError(f"unable to get claim info for claim {name} in namespace {pod.namespace}")
                for request in dict.fromkeys(requests):
                    ids.extend(info.cdi_devices(request))
        return ids

    async def reconcile(self, active_pod_uids: Callable[[], set[str]]) -> None:
        """Unprepare claims whose pods are all gone (the kubelet's 60 s reconcile loop)."""
        active = active_pod_uids()
        for info in list(self._claims.values()):
            stale = info.pod_uids - active
            if not stale:
                continue
            for uid in sorted(stale):
                started = time.monotonic()
                try:
                    await self.unprepare_claims(uid, info.namespace, [info.claim_name])
                except DraError as err:
                    self._events.emit(
                        EventKind.UNPREPARE_FAILED,
                        f"unpreparing {info.namespace}/{info.claim_name} for a pod that is gone: {err}",
                        claim=f"{info.namespace}/{info.claim_name}",
                        error=str(err),
                        after_s=time.monotonic() - started,
                    )
                    break
