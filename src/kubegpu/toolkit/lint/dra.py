"""`kubegpu lint`'s DRA rules: ResourceClaims, ResourceClaimTemplates and DeviceClasses, and pods that
reference claims.

Each selector is compiled with DRA's CEL environment (resourceapi.cel), as the API server does when it
validates the object (KG017). The attributes and capacities it reads are checked against what NVIDIA's
DRA driver publishes and, with a snapshot, what the cluster's ResourceSlices hold (KG018). A request's
DeviceClass must exist in the files, the snapshot, or (without a snapshot that lists classes) be one of
NVIDIA's (KG019). With a snapshot, an ExactCount request must not want more devices than any node has that
pass the class's and the request's selectors (KG020). A pod's claims must exist and its containers must
name claims and requests that do (KG021). With a snapshot, capacity requests must be what some selected
device's request policy allows (KG022, `dra_capacity`); without one, a capacity name NVIDIA's driver never
publishes is a warning. A selector that pins a MIG profile must name one a node can create (KG023,
`dra_profiles`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.resourceapi import ModelError, compile_error, explain, parse_claim, parse_class, parse_slice
from kubegpu.resourceapi import Node as DraNode
from kubegpu.resourceapi.explain import CLASS_SELECTOR, REQUEST_SELECTOR, SELECTOR_ERROR
from kubegpu.resourceapi.model import ResourceClaim, ResourceSlice
from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.dra_facts import (
    NVIDIA_CLASSES,
    NVIDIA_DRIVER,
    RETIRED,
    STANDARD_DOMAIN,
    Reference,
    claim_from_template,
    published,
    references,
    slices_per_node,
)
from kubegpu.toolkit.lint.dra_capacity import capacity_problems
from kubegpu.toolkit.lint.dra_profiles import profile_problems, published_profiles
from kubegpu.toolkit.lint.rules import WARNING, Finding
from kubegpu.toolkit.manifests import DraObject, Manifests, Path, Source, Workload

V1BETA1 = "resource.k8s.io/v1beta1"


@dataclass(frozen=True)
class _Request:
    path: Path  # from the object's root to the exact request (the request, or one firstAvailable entry)
    label: str  # request, or request/subrequest
    exact: Mapping[str, Any]


def _spec_path(obj: DraObject) -> Path:
    return ("spec", "spec") if obj.kind == "ResourceClaimTemplate" else ("spec",)


def _requests(obj: DraObject) -> Iterator[_Request]:
    """Every exact request of a claim or template, with where it sits (v1 `exactly`, v1beta1 inline)."""
    spec: Any = obj.obj
    for part in _spec_path(obj):
        spec = spec.get(part) if isinstance(spec, dict) else None
    devices = spec.get("devices") if isinstance(spec, dict) else None
    raw_requests = devices.get("requests") if isinstance(devices, dict) else None
    base = (*_spec_path(obj), "devices", "requests")
    for i, raw in enumerate(raw_requests if isinstance(raw_requests, list) else []):
        if not isinstance(raw, dict):
            continue
        name = str(raw.get("name") or "")
        alternatives = raw.get("firstAvailable")
        if isinstance(alternatives, list) and alternatives:
            for k, sub in enumerate(alternatives):
                if isinstance(sub, dict):
                    yield _Request((*base, i, "firstAvailable", k), f"{name}/{sub.get('name') or ''}", sub)
        elif obj.api_version == V1BETA1 or "exactly" not in raw:
            yield _Request((*base, i), name, raw)
        elif isinstance(raw.get("exactly"), dict):
            yield _Request((*base, i, "exactly"), name, raw["exactly"])


def _selectors(exact: Any) -> Iterator[tuple[int, str]]:
    """(index, CEL expression) of each selector of a request or a class spec, whatever shape it has."""
    raw = exact.get("selectors") if isinstance(exact, Mapping) else None
    for j, selector in enumerate(raw if isinstance(raw, list) else []):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expression, str) and expression:
            yield j, expression


class _Linter:
    def __init__(self, manifests: Manifests, cluster: ClusterFacts | None, findings: list[Finding]) -> None:
        self.manifests, self.cluster, self.findings = manifests, cluster, findings
        self.cluster_dra = cluster.dra if cluster is not None else {}
        self.slices = self._slices()
        self.seen_names = self._published_names()
        self.profiles = published_profiles(self.slices) if cluster is not None else None

    # --- what is known ---------------------------------------------------------------------------------

    def _slices(self) -> list[ResourceSlice]:
        out = []
        for raw in self.cluster_dra.get("ResourceSlice", []):
            try:
                out.append(parse_slice(raw))
            except ModelError:
                continue  # the API server validated it; a slice we cannot read only counts for nothing
        return out

    def _published_names(self) -> dict[str, set[str]]:
        """Domain -> attribute and capacity names the cluster's slices hold."""
        names: dict[str, set[str]] = {}
        for s in self.slices:
            for device in s.devices:
                for key in (*device.attributes, *device.capacity):
                    domain, _, name = key.rpartition("/")
                    names.setdefault(domain or s.driver, set()).add(name)
        return names

    def classes(self) -> dict[str, tuple[str, ...]]:
        """DeviceClass name -> its selectors, from the files and the snapshot; NVIDIA's when the snapshot
        lists no classes (the cluster's are then unknown)."""
        known: dict[str, tuple[str, ...]] = {}
        if "DeviceClass" not in self.cluster_dra:
            known.update({name: (expression,) for name, expression in NVIDIA_CLASSES.items()})
        for raw in self.cluster_dra.get("DeviceClass", []):
            name = str((raw.get("metadata") or {}).get("name") or "")
            known[name] = tuple(e for _, e in _selectors(raw.get("spec")))
        for obj in self.manifests.dra:
            if obj.kind == "DeviceClass":
                known[obj.name] = tuple(e for _, e in _selectors(obj.obj.get("spec")))
        return known

    # --- findings --------------------------------------------------------------------------------------

    def add(
        self,
        obj: DraObject | Workload,
        rule_id: str,
        path: Path,
        message: str,
        fix: str,
        severity: str | None = None,
        container: str | None = None,
    ) -> None:
        full = (*obj.object_path, *path)
        finding = Finding.at(rule_id, obj.source, obj.ref, full, message, fix, severity, container)
        self.findings.append(finding)

    def check_selector(self, obj: DraObject, path: Path, where: str, expression: str) -> None:
        error = compile_error(expression)
        if error is not None:
            self.add(
                obj,
                "KG017",
                path,
                f"{where} does not compile, so the API server refuses the object: {error}",
                'fix the CEL expression; `device.attributes["<driver>"].<name>` reads an attribute, '
                '`device.capacity["<driver>"].memory` a capacity, quantity("40Gi") a quantity',
            )
            return
        for ref in references(expression):
            if self._unpublished(ref):
                self.add(
                    obj, "KG018", path, self._unpublished_message(where, ref), self._unpublished_fix(ref)
                )

    def _unpublished(self, ref: Reference) -> bool:
        seen = self.seen_names.get(ref.domain)
        if ref.domain in (NVIDIA_DRIVER, STANDARD_DOMAIN):
            return published(ref, NVIDIA_DRIVER, frozenset(seen or ())) is False
        return seen is not None and ref.name not in seen

    def _unpublished_message(self, where: str, ref: Reference) -> str:
        kind = "attribute" if ref.what == "attributes" else "capacity"
        head = f"{where} reads {kind} {ref.name!r} of {ref.domain}, which the driver does not publish"
        if ref.name in RETIRED and ref.what == "attributes":
            head += f": {RETIRED[ref.name]}"
        return head + "; every device fails the selector with a CEL error and the claim never allocates"

    def _unpublished_fix(self, ref: Reference) -> str:
        if ref.name in RETIRED:
            return (
                "select a GPU by `uuid`, `productName`, `resource.kubernetes.io/pciBusID` or its memory "
                "instead; to get a particular GPU, name its uuid"
            )
        if ref.domain == STANDARD_DOMAIN:
            return "the standard attributes are resource.kubernetes.io/pciBusID and .../pcieRoot"
        return "use a name the driver publishes (docs/reference/dra.md lists NVIDIA's: type, uuid, ...)"

    # --- the objects -----------------------------------------------------------------------------------

    def run(self) -> None:
        classes = self.classes()
        for obj in self.manifests.dra:
            if obj.kind == "DeviceClass":
                for j, expression in _selectors(obj.obj.get("spec")):
                    path = ("spec", "selectors", j, "cel", "expression")
                    self.check_selector(obj, path, f"class selector #{j}", expression)
            elif obj.kind in ("ResourceClaim", "ResourceClaimTemplate"):
                self.check_claim(obj, classes)
        for workload in self.manifests.workloads:
            if workload.spec.resource_claims:
                self.check_pod(workload)

    def check_claim(self, obj: DraObject, classes: dict[str, tuple[str, ...]]) -> None:
        for request in _requests(obj):
            for j, expression in _selectors(request.exact):
                path = (*request.path, "selectors", j, "cel", "expression")
                where = f"request {request.label!r} selector #{j}"
                self.check_selector(obj, path, where, expression)
                for problem in profile_problems(where, expression, self.profiles):
                    self.add(obj, "KG023", path, problem.message, problem.fix, severity=problem.severity)
            class_name = request.exact.get("deviceClassName")
            if not isinstance(class_name, str) or not class_name:
                continue
            if class_name not in classes:
                self._unknown_class(obj, request, class_name, classes)
            elif class_name in NVIDIA_CLASSES and not self.slices:
                self.check_nvidia_capacity(obj, request)
        if self.cluster is not None and self.slices:
            self.check_counts(obj, classes)
            self.check_capacity(obj, classes)

    def _unknown_class(
        self, obj: DraObject, request: _Request, class_name: str, classes: dict[str, tuple[str, ...]]
    ) -> None:
        listed = "DeviceClass" in self.cluster_dra
        where = "the cluster" if listed else "these files or NVIDIA's classes"
        names = ", ".join(sorted(classes)) or "none"
        self.add(
            obj,
            "KG019",
            (*request.path, "deviceClassName"),
            f"request {request.label!r} names DeviceClass {class_name!r}, which is not in {where} "
            f"(known: {names}); the scheduler cannot allocate the claim",
            "name an existing class (kubectl get deviceclasses), e.g. gpu.nvidia.com for full GPUs or "
            "mig.nvidia.com for MIG devices, or create the class",
            severity=None if listed else WARNING,
        )

    def _as_claim(self, obj: DraObject) -> ResourceClaim:
        if obj.kind == "ResourceClaimTemplate":
            return parse_claim(claim_from_template(obj.obj, obj.namespace, obj.name))
        return parse_claim(obj.obj)

    def check_counts(self, obj: DraObject, classes: dict[str, tuple[str, ...]]) -> None:
        """KG020: per request, the most devices any node has that pass its class's and its selectors."""
        try:
            claim = self._as_claim(obj)
        except ModelError:
            return
        class_objects = [
            parse_class(
                {"metadata": {"name": n}, "spec": {"selectors": [{"cel": {"expression": e}} for e in s]}}
            )
            for n, s in classes.items()
        ]
        nodes = (
            [DraNode(n.metadata.name, dict(n.metadata.labels or {})) for n in self.cluster.nodes]
            if self.cluster
            else []
        )
        if not nodes:
            return
        best: dict[str, tuple[int, str]] = {}
        accounts = (
            account
            for node, reachable in slices_per_node(self.slices, nodes)
            if reachable
            for account in explain([claim], class_objects, reachable, [node])
        )
        for account in accounts:
            for req in account.requests:
                fitting = sum(
                    v.verdict not in (CLASS_SELECTOR, REQUEST_SELECTOR, SELECTOR_ERROR) for v in req.verdicts
                )
                if fitting > best.get(req.request, (-1, ""))[0]:
                    best[req.request] = (fitting, account.node)
        for request in _requests(obj):
            mode = request.exact.get("allocationMode") or "ExactCount"
            count = request.exact.get("count", 1)
            known_class = request.exact.get("deviceClassName") in classes  # else KG019 says it
            if (
                mode != "ExactCount"
                or not isinstance(count, int)
                or request.label not in best
                or not known_class
            ):
                continue
            most, node = best[request.label]
            if count > most:
                where = f" ({node})" if most else ""
                self.add(
                    obj,
                    "KG020",
                    (*request.path, "count"),
                    f"request {request.label!r} wants {count} device(s) of class "
                    f"{request.exact.get('deviceClassName')!r}"
                    + (" that pass its selectors" if request.exact.get("selectors") else "")
                    + f"; the most any of the {len(nodes)} node(s) has is {most}{where}",
                    "ask for at most that many per claim (several pods, or a node with more GPUs), or "
                    "loosen the selectors",
                )

    def check_nvidia_capacity(self, obj: DraObject, request: _Request) -> None:
        """KG022 without the cluster's slices: capacity names NVIDIA's DRA driver never publishes."""
        capacity = request.exact.get("capacity")
        asked = capacity.get("requests") if isinstance(capacity, dict) else None
        for name in sorted(asked if isinstance(asked, dict) else {}):
            domain, _, ident = str(name).rpartition("/")
            ref = Reference("capacity", domain or NVIDIA_DRIVER, ident)
            if published(ref, NVIDIA_DRIVER) is False:
                self.add(
                    obj,
                    "KG022",
                    (*request.path, "capacity", "requests", name),
                    f"request {request.label!r} asks for capacity {name!r}, which NVIDIA's DRA driver "
                    "does not publish; no device takes the request",
                    "ask for memory (any mode of --consumable-shares) or shares (--consumable-shares=N), or "
                    "lint with --snapshot to check against the cluster's devices",
                    severity=WARNING,
                )

    def check_capacity(self, obj: DraObject, classes: dict[str, tuple[str, ...]]) -> None:
        """KG022: capacity requests against the published request policies (lint.dra_capacity)."""
        try:
            claim = self._as_claim(obj)
        except ModelError:
            return
        nodes = (
            [DraNode(n.metadata.name, dict(n.metadata.labels or {})) for n in self.cluster.nodes]
            if self.cluster
            else []
        )
        class_objects = [
            parse_class(
                {"metadata": {"name": n}, "spec": {"selectors": [{"cel": {"expression": e}} for e in s]}}
            )
            for n, s in classes.items()
        ]
        paths = {request.label: request.path for request in _requests(obj)}
        for problem in capacity_problems(claim, class_objects, self.slices, nodes):
            self.add(
                obj,
                "KG022",
                (*paths.get(problem.request, ()), "capacity", "requests"),
                problem.message,
                problem.fix,
                severity=WARNING if problem.rounded_only else None,
            )

    # --- pods ------------------------------------------------------------------------------------------

    def _find(self, kind: str, namespace: str, name: str) -> tuple[bool, DraObject | dict[str, Any] | None]:
        """(whether the kind is known anywhere, the object) for a claim or template a pod names."""
        for obj in self.manifests.dra:
            if (
                obj.kind == kind
                and obj.name == name
                and (not obj.namespace or not namespace or obj.namespace == namespace)
            ):
                return True, obj
        for raw in self.cluster_dra.get(kind, []):
            meta = raw.get("metadata") or {}
            if meta.get("name") == name and (not namespace or meta.get("namespace") == namespace):
                return True, raw
        listed = kind in self.cluster_dra or any(o.kind == kind for o in self.manifests.dra)
        return listed, None

    def _request_names(self, found: DraObject | dict[str, Any], kind: str) -> set[str] | None:
        obj = found if isinstance(found, DraObject) else None
        if obj is None:
            assert isinstance(found, dict)
            meta = found.get("metadata") or {}
            obj = DraObject(
                Source("<snapshot>", 0), kind, str(meta.get("name") or ""), str(meta.get("namespace") or ""),
                str(found.get("apiVersion") or ""), (), found,
            )  # fmt: skip
        return {r.label.split("/")[0] for r in _requests(obj)}

    def check_pod(self, w: Workload) -> None:
        claims = w.spec.resource_claims or []
        requests_of: dict[str, set[str] | None] = {}
        for i, claim in enumerate(claims):
            kind, name = (
                ("ResourceClaim", claim.resource_claim_name)
                if claim.resource_claim_name
                else ("ResourceClaimTemplate", claim.resource_claim_template_name)
            )
            requests_of[claim.name] = None
            if not name:
                continue
            listed, found = self._find(kind, w.namespace, name)
            if found is not None:
                requests_of[claim.name] = self._request_names(found, kind)
            elif listed:
                field = "resourceClaimName" if kind == "ResourceClaim" else "resourceClaimTemplateName"
                in_cluster = kind in self.cluster_dra
                self.add(
                    w,
                    "KG021",
                    (*w.spec_path[len(w.object_path) :], "resourceClaims", i, field),
                    f"pod claim {claim.name!r} names {kind} {name!r}, which is not in "
                    + ("the cluster" if in_cluster else "these files")
                    + "; the pod stays Pending until it exists",
                    f"create the {kind} in namespace {w.namespace or 'default'} first, or fix the name",
                    severity=None if in_cluster else WARNING,
                )
        names = ", ".join(c.name for c in claims)
        for group, containers in (
            ("initContainers", w.spec.init_containers),
            ("containers", w.spec.containers),
        ):
            for index, c in enumerate(containers or []):
                resources = c.resources
                for k, ref in enumerate((resources.claims if resources is not None else None) or []):
                    path = (*w.spec_path[len(w.object_path) :], group, index, "resources", "claims", k)
                    if ref.name not in requests_of:
                        self.add(
                            w,
                            "KG021",
                            (*path, "name"),
                            f"container claim {ref.name!r} is not one of the pod's spec.resourceClaims "
                            f"({names}); the API server refuses the pod",
                            "name a claim from spec.resourceClaims",
                            container=c.name,
                        )
                        continue
                    known = requests_of[ref.name]
                    if ref.request and known is not None and ref.request not in known:
                        self.add(
                            w,
                            "KG021",
                            (*path, "request"),
                            f"container asks for request {ref.request!r} of claim {ref.name!r}, which has "
                            f"only {', '.join(sorted(known)) or 'no requests'}; the container gets no device",
                            "name one of the claim's requests, or leave request out for all of them",
                            container=c.name,
                        )


def check_dra(manifests: Manifests, cluster: ClusterFacts | None, findings: list[Finding]) -> None:
    """Add the DRA findings of `manifests` (with the snapshot's facts when given) to `findings`."""
    _Linter(manifests, cluster, findings).run()
