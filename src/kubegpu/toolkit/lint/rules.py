"""The lint rules (ids, severities, summaries), the findings they produce and what every check shares."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.manifests import Path, Source, Workload, path_text
from kubegpu.toolkit.model import Container

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str
    summary: str
    needs_snapshot: bool = False


RULES = {
    r.id: r
    for r in (
        Rule("KG000", "invalid-manifest", ERROR, "the document is not a readable Kubernetes object"),
        Rule("KG001", "gpu-only-in-requests", ERROR, "a GPU is in requests but not in limits"),
        Rule("KG002", "gpu-requests-not-limits", ERROR, "GPU requests differ from GPU limits"),
        Rule("KG003", "gpu-not-integer", ERROR, "a GPU quantity is fractional (0.5, 500m)"),
        Rule("KG004", "invalid-quantity", ERROR, "a resource quantity does not parse"),
        Rule(
            "KG005",
            "shared-gpu-above-one",
            WARNING,
            "more than one replica of a shared (time-sliced/MPS) GPU; an error where the plugin rejects it",
        ),
        Rule(
            "KG006", "mixed-mig-types", WARNING, "one container asks for two MIG types, or MIG and full GPUs"
        ),
        Rule("KG007", "init-container-holds-gpu", WARNING, "an init container or sidecar holds GPUs"),
        Rule(
            "KG008", "visible-devices-env", WARNING, "NVIDIA_VISIBLE_DEVICES set by hand bypasses accounting"
        ),
        Rule(
            "KG009",
            "unknown-gpu-resource",
            ERROR,
            "a GPU resource name no NVIDIA plugin serves (or, with a snapshot, no node offers)",
        ),
        Rule(
            "KG010",
            "missing-toleration",
            ERROR,
            "every node offering the GPU has a taint the pod does not tolerate",
            True,
        ),
        Rule(
            "KG011", "missing-runtime-class", ERROR, "GPU pods must name the nvidia RuntimeClass here", True
        ),
        Rule("KG012", "gpu-exceeds-any-node", ERROR, "no single node has as many GPUs as requested", True),
        Rule(
            "KG013",
            "selector-excludes-gpu-nodes",
            ERROR,
            "nodeSelector/affinity excludes every node offering the GPU",
            True,
        ),
        Rule(
            "KG014",
            "device-plugin-and-dra",
            WARNING,
            "one container uses both DRA claims and device-plugin GPUs",
        ),
        Rule("KG015", "negative-quantity", ERROR, "a resource quantity is negative"),
        Rule(
            "KG016",
            "invalid-pod-count",
            ERROR,
            "replicas, parallelism or completions is not a whole number of 0 or more",
        ),
        Rule("KG017", "dra-cel-invalid", ERROR, "a DRA selector (claim, template or class) does not compile"),
        Rule(
            "KG018",
            "dra-unpublished-attribute",
            ERROR,
            "a DRA selector reads an attribute the driver does not publish (index, minor, typos)",
        ),
        Rule(
            "KG019",
            "dra-unknown-device-class",
            ERROR,
            "a DRA request names a DeviceClass that does not exist (a warning without --snapshot)",
        ),
        Rule(
            "KG020", "dra-exceeds-any-node", ERROR, "a DRA request wants more devices than any node has", True
        ),
        Rule(
            "KG021",
            "dra-claim-reference",
            ERROR,
            "a pod names a claim, template or request that does not exist",
        ),
        Rule(
            "KG022",
            "dra-capacity-request-policy",
            ERROR,
            "a DRA request asks for capacity no device's requestPolicy allows (a warning when rounded up)",
            True,
        ),
        Rule(
            "KG023",
            "dra-unknown-mig-profile",
            ERROR,
            "a DRA selector pins a MIG profile no node can create (a warning without --snapshot)",
        ),
    )
}

LOOKS_LIKE_GPU = re.compile(r"gpu|mig-|nvidia", re.IGNORECASE)


@dataclass
class Finding:
    rule: str
    name: str
    severity: str
    file: str
    line: int | None
    doc: int
    object: str
    container: str | None
    path: str
    message: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def at(
        cls,
        rule_id: str,
        source: Source,
        ref: str,
        full: Path,
        message: str,
        fix: str,
        severity: str | None = None,
        container: str | None = None,
    ) -> Finding:
        """A finding of `rule_id` on the object `ref`, at `full` (a path from the document's root)."""
        rule = RULES[rule_id]
        return cls(
            rule=rule.id,
            name=rule.name,
            severity=severity or rule.severity,
            file=source.file,
            line=source.line(full),
            doc=source.doc,
            object=ref,
            container=container,
            path=path_text(full),
            message=message,
            fix=fix,
        )


@dataclass
class LintOptions:
    cluster: ClusterFacts | None = None
    fail_requests_greater_than_one: bool | None = None  # from --plugin-config, when given


@dataclass
class LintContext:
    workload: Workload
    options: LintOptions
    findings: list[Finding]

    def add(
        self,
        rule_id: str,
        path: Path,
        message: str,
        fix: str,
        container: str | None = None,
        severity: str | None = None,
        *,
        from_object: bool = False,
    ) -> None:
        """Record a finding at `path`, taken from the pod spec (or from the object with `from_object`)."""
        w = self.workload
        full = (*w.object_path, *path) if from_object else (*w.spec_path, *path)
        self.findings.append(Finding.at(rule_id, w.source, w.ref, full, message, fix, severity, container))

    def api_path(self, path: Path) -> Path:
        """`path` (from the pod spec) from the object's root, as the API server names fields."""
        w = self.workload
        return (*w.spec_path[len(w.object_path) :], *path)


def all_containers(w: Workload) -> Iterator[tuple[str, int, Container]]:
    for index, c in enumerate(w.spec.init_containers or []):
        yield "initContainers", index, c
    for index, c in enumerate(w.spec.containers or []):
        yield "containers", index, c
