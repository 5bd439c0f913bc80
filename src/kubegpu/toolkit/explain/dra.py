"""`kubegpu explain` for a pod with DRA claims: the scheduler's DynamicResources filter, node by node.

The pod's claims come from the snapshot (a claim by name; for a template, the claim the resourceclaim
controller made, named in the pod's status, or else the claim it would make). On every node that passes
the other filters, the structured allocator (resourceapi) runs for the claims not yet allocated, with the
devices other claims hold taken; a node where it finds no allocation is rejected with the scheduler's words
("cannot allocate all claims"), and the account says, per request, which selector or taint ruled out
which device and how many are left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubegpu.resourceapi import (
    DeviceClass,
    ModelError,
    NodeAccount,
    ResourceClaim,
    ResourceSlice,
    explain,
    holders,
    parse_claim,
    parse_class,
    parse_slice,
)
from kubegpu.resourceapi import Node as DraNode
from kubegpu.resourceapi.explain import AVAILABLE, CAPACITY, COUNTERS, IN_USE
from kubegpu.resourceapi.nodes import selector_matches
from kubegpu.toolkit.dra_facts import NVIDIA_CLASSES, claim_from_template, slices_per_node
from kubegpu.toolkit.model import Node, Pod
from kubegpu.toolkit.scheduling import Outcome, Rejection
from kubegpu.toolkit.snapshot import Snapshot

DYNAMIC_RESOURCES = "DynamicResources"
MAX_DEVICES_LISTED = 8  # per request and node, in the human output; JSON has them all
SNAPSHOT_HINT = (
    "add them to the snapshot: kubectl get nodes,pods,daemonsets,runtimeclasses,resourceslices,"
    "resourceclaims,resourceclaimtemplates,deviceclasses -A -o json"
)


@dataclass
class DraRequestRow:
    claim: str
    request: str
    device_class: str
    wanted: str
    available: int
    ruled_out: dict[str, int]  # verdict -> devices
    devices: list[str]  # one line per device that is not available: "<device>: <verdict> (<detail>)"


@dataclass
class DraNodeRow:
    node: str
    fits: bool
    summary: str
    pools: list[str]
    requests: list[DraRequestRow]
    allocation: list[str] = field(default_factory=list)  # where it fits: "<claim> <request>: <device>"


@dataclass
class DraExplanation:
    claims: list[dict[str, str]]  # pod claim name, ResourceClaim, state (allocated, pending, from template)
    nodes: list[DraNodeRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # nodes where the claims would fit if the claims holding devices there released them
    free_to_fit: list[dict[str, Any]] = field(default_factory=list)

    def merged(self, other: DraExplanation) -> DraExplanation:
        """Both explanations in one (a pod with claims that also asks a bridged extended resource)."""
        return DraExplanation(
            self.claims + other.claims,
            self.nodes + other.nodes,
            self.notes + other.notes,
            self.free_to_fit + other.free_to_fit,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "claims": self.claims,
            "free_to_fit": self.free_to_fit,
            "nodes": [
                {
                    "node": n.node,
                    "fits": n.fits,
                    "summary": n.summary,
                    "pools": n.pools,
                    "requests": [vars(r) for r in n.requests],
                    "allocation": n.allocation,
                }
                for n in self.nodes
            ],
            "notes": self.notes,
        }


def parse_all(raw: Iterable[dict[str, Any]], parse: Any, notes: list[str], what: str) -> list[Any]:
    out = []
    for obj in raw:
        try:
            out.append(parse(obj))
        except ModelError as err:
            notes.append(f"a {what} in the snapshot cannot be read and is left out: {err}")
    return out


def _find(snapshot: Snapshot, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    for obj in snapshot.dra_objects(kind):
        meta = obj.get("metadata") or {}
        if meta.get("name") == name and meta.get("namespace", "") == namespace:
            return obj
    return None


def pod_claims(
    snapshot: Snapshot, pod: Pod, notes: list[str]
) -> tuple[list[ResourceClaim], list[dict[str, str]]]:
    """The pod's claims (allocated or not) and a line per pod claim saying where it came from."""
    namespace = pod.metadata.namespace
    generated = {s.name: s.resource_claim_name for s in pod.status.resource_claim_statuses or []}
    claims: list[ResourceClaim] = []
    rows: list[dict[str, str]] = []
    for pod_claim in pod.spec.resource_claims or []:
        raw: dict[str, Any] | None = None
        if pod_claim.resource_claim_name:
            claim_name, state = pod_claim.resource_claim_name, "claim"
            raw = _find(snapshot, "ResourceClaim", namespace, claim_name)
        elif generated.get(pod_claim.name):
            claim_name, state = str(generated[pod_claim.name]), "from template"
            raw = _find(snapshot, "ResourceClaim", namespace, claim_name)
        else:
            template_name = pod_claim.resource_claim_template_name or ""
            template = _find(snapshot, "ResourceClaimTemplate", namespace, template_name)
            claim_name, state = f"{pod.metadata.name}-{pod_claim.name}", "to be made from template"
            if template is not None:
                # named as the controller's generateName starts: the pod's name and the claim's
                raw = claim_from_template(template, namespace, claim_name)
                notes.append(
                    f"pod claim {pod_claim.name!r}: no ResourceClaim was made from template "
                    f"{template_name!r} yet; explained as the claim the resourceclaim controller would make"
                )
            else:
                claim_name = template_name
        if raw is None:
            what = "ResourceClaim" if state != "to be made from template" else "ResourceClaimTemplate"
            rows.append({"name": pod_claim.name, "claim": claim_name, "state": "missing", "kind": what})
            notes.append(
                f"pod claim {pod_claim.name!r}: {what} {namespace}/{claim_name} is not in the snapshot; the "
                f"scheduler waits for it ({SNAPSHOT_HINT} if it exists)"
            )
            continue
        try:
            claim = parse_claim(raw)
        except ModelError as err:
            rows.append({"name": pod_claim.name, "claim": claim_name, "state": "unreadable"})
            notes.append(f"pod claim {pod_claim.name!r}: {err}")
            continue
        allocated = claim.allocation is not None
        rows.append(
            {
                "name": pod_claim.name,
                "claim": claim.ref,
                "state": "allocated" if allocated else f"pending ({state})",
            }
        )
        claims.append(claim)
    return claims, rows


def device_classes(snapshot: Snapshot, notes: list[str]) -> list[DeviceClass]:
    if "DeviceClass" in snapshot.dra:
        return parse_all(snapshot.dra_objects("DeviceClass"), parse_class, notes, "DeviceClass")
    notes.append(
        "the snapshot lists no DeviceClasses, so NVIDIA's gpu.nvidia.com and mig.nvidia.com are assumed; "
        + SNAPSHOT_HINT
    )
    return [
        parse_class({"metadata": {"name": n}, "spec": {"selectors": [{"cel": {"expression": e}}]}})
        for n, e in NVIDIA_CLASSES.items()
    ]


def _share(result: dict[str, Any]) -> str:
    """A shared device's part of an allocation result: what the claim would consume of it."""
    consumed = result.get("consumedCapacity")
    if not result.get("shareID"):
        return ""
    return " (shared" + "".join(f", {k} {v}" for k, v in sorted((consumed or {}).items())) + ")"


def node_row(account: NodeAccount, pending: list[ResourceClaim]) -> DraNodeRow:
    requests = []
    for r in account.requests:
        ruled_out: dict[str, int] = {}
        for v in r.verdicts:
            if v.verdict != AVAILABLE:
                ruled_out[v.verdict] = ruled_out.get(v.verdict, 0) + 1
        requests.append(
            DraRequestRow(
                r.claim,
                r.request,
                r.device_class,
                r.wanted,
                r.matching,
                ruled_out,
                [str(v) for v in r.verdicts if v.verdict != AVAILABLE],
            )
        )
    pools = [
        f"{p.id} (generation {p.generation}, {p.devices} device(s)"
        + (", incomplete" if p.incomplete else "")
        + (f", invalid: {p.invalid_reason}" if p.invalid_reason else "")
        + ")"
        for p in account.pools
    ]
    allocation = [
        f"{claim.ref} {r.get('request')}: {r.get('driver')}/{r.get('pool')}/{r.get('device')}" + _share(r)
        for claim, result in zip(pending, account.allocation or [], strict=False)
        for r in (result.get("devices") or {}).get("results") or []
    ]
    return DraNodeRow(account.node, account.fits, account.summary, pools, requests, allocation)


# The scheduler's Filter words for a node outside an allocated claim's node selector.
NOT_ON_THIS_NODE = "resourceclaim not available on the node"


def _keep_nodes_of_allocated_claims(
    allocated: list[ResourceClaim], outcome: Outcome, nodes: dict[str, Node]
) -> None:
    """An allocated claim can only be used where its allocation's nodeSelector points (none: anywhere)."""
    selectors = [
        c.allocation["nodeSelector"] for c in allocated if c.allocation and c.allocation.get("nodeSelector")
    ]
    if not selectors:
        return
    kept = []
    for name in outcome.feasible:
        node = DraNode(name, dict(nodes[name].metadata.labels or {}))
        if all(selector_matches(s, node) for s in selectors):
            kept.append(name)
        else:
            outcome.rejections[name] = Rejection(DYNAMIC_RESOURCES, (NOT_ON_THIS_NODE,))
    outcome.feasible = kept


def dra_filter(
    snapshot: Snapshot, pod: Pod, outcome: Outcome, nodes: dict[str, Node]
) -> DraExplanation | None:
    """Run DynamicResources on the nodes `outcome` still finds feasible, moving those where the claims
    cannot be allocated into its rejections; None for a pod without claims."""
    if not pod.spec.resource_claims:
        return None
    notes: list[str] = []
    claims, rows = pod_claims(snapshot, pod, notes)
    result = DraExplanation(claims=rows, notes=notes)
    missing = [r for r in rows if r["state"] == "missing"]
    if missing:
        # The scheduler's PreFilter stops at the first pod claim it cannot get: a named claim with the
        # lister's NotFound error, a template's claim the controller has not made (it cannot, without
        # the template) with resourceclaim.Name's error.
        first = missing[0]
        message = (
            f'resourceclaim.resource.k8s.io "{first["claim"]}" not found'
            if first["kind"] == "ResourceClaim"
            else f'pod "{pod.metadata.namespace}/{pod.metadata.name}": ResourceClaim not created yet'
        )
        if outcome.prefilter_message is None:  # an earlier PreFilter (NodeAffinity) failed first
            outcome.prefilter_message = message
        for name in outcome.feasible:
            outcome.rejections[name] = Rejection(DYNAMIC_RESOURCES, (message,))
        outcome.feasible = []
    if any(r["state"] in ("missing", "unreadable") for r in rows):
        return result  # nothing to allocate against
    allocated = [c for c in claims if c.allocation is not None]
    _keep_nodes_of_allocated_claims(allocated, outcome, nodes)
    pending = [c for c in claims if c.allocation is None]
    if not pending:
        notes.append("every claim of the pod is allocated already; the scheduler only checks their nodes")
        return result
    if "ResourceSlice" not in snapshot.dra:
        notes.append(f"the snapshot lists no ResourceSlices, so no node offers a device; {SNAPSHOT_HINT}")
    slices: list[ResourceSlice] = parse_all(
        snapshot.dra_objects("ResourceSlice"), parse_slice, notes, "ResourceSlice"
    )
    classes = device_classes(snapshot, notes)
    mine = {c.ref for c in claims}
    others = parse_all(
        (
            o
            for o in snapshot.dra_objects("ResourceClaim")
            if f"{(o.get('metadata') or {}).get('namespace', '')}/{(o.get('metadata') or {}).get('name', '')}"
            not in mine
        ),
        parse_claim,
        notes,
        "ResourceClaim",
    )
    # Every allocated claim holds its devices, the pod's own included (a pending claim of the pod cannot
    # be given a device its other claim holds); only other pods' claims can let go in the what-if below.
    own = holders(allocated)
    held = holders(others).merged(own)
    candidates = [DraNode(name, dict(nodes[name].metadata.labels or {})) for name in outcome.feasible]
    feasible = []
    accounts = {}
    per_node = list(slices_per_node(slices, candidates))
    reachable_of = {node.name: reachable for node, reachable in per_node}
    for account in (
        a for node, reachable in per_node for a in explain(pending, classes, reachable, [node], held)
    ):
        accounts[account.node] = account
        result.nodes.append(node_row(account, pending))
        if account.fits:
            feasible.append(account.node)
        else:
            outcome.rejections[account.node] = Rejection(
                DYNAMIC_RESOURCES, (account.summary,), resolvable=True
            )
    outcome.feasible = feasible
    by_name = {node.name: node for node, _ in per_node}
    rejected = [by_name[a.node] for a in result.nodes if not a.fits]
    if not feasible and rejected and len(held) > len(own):
        # What if the other pods' claims let go: the nodes that fit then, and who holds what there.
        for account in (
            a for node in rejected for a in explain(pending, classes, reachable_of[node.name], [node], own)
        ):
            if account.fits:
                verdicts = (v for r in accounts[account.node].requests for v in r.verdicts)
                holding = sorted(
                    {c for v in verdicts if v.verdict in (IN_USE, COUNTERS, CAPACITY) for c in v.holders}
                    - {c for d in list(own.exclusive) + list(own.shares) for c in own.holders(d)}
                )
                result.free_to_fit.append({"node": account.node, "held_by": holding})
    return result
