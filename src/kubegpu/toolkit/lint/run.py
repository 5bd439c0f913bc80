"""`kubegpu lint`: GPU mistakes in pod specs, found before they reach the cluster.

Each rule has a stable id (KG0xx) and a severity. "error" means the object will be rejected by the
API server, never schedule, or fail at admission; "warning" means it runs but not as intended.
Rules marked (snapshot) need `--snapshot`, a dump of the target cluster.

The rules and their findings are in `lint.rules`; the per-container rules in `lint.containers`, the
workload's pod counts in `lint.workload`, the snapshot rules in `lint.cluster`, the rules for DRA claims,
templates, classes and the pods that use them in `lint.dra`.
"""

from __future__ import annotations

from kubegpu.toolkit.lint.cluster import check_cluster
from kubegpu.toolkit.lint.containers import check_container
from kubegpu.toolkit.lint.rules import ERROR, RULES, Finding, LintContext, LintOptions, all_containers
from kubegpu.toolkit.lint.workload import check_counts
from kubegpu.toolkit.manifests import Manifests, path_text

__all__ = ["RULES", "Finding", "LintOptions", "exit_code", "lint"]


def lint(manifests: Manifests, options: LintOptions | None = None) -> list[Finding]:
    """Every finding in the manifests, in file order."""
    options = options or LintOptions()
    findings: list[Finding] = []
    for problem in manifests.problems:
        rule = RULES["KG000"]
        findings.append(
            Finding(
                rule=rule.id,
                name=rule.name,
                severity=rule.severity,
                file=problem.source.file,
                line=problem.line or problem.source.line(problem.path),
                doc=problem.source.doc,
                object=problem.object,
                container=None,
                path=path_text(problem.path),
                message=problem.message,
                fix="fix the document so that `kubectl apply --dry-run=server -f` accepts it",
            )
        )
    for workload in manifests.workloads:
        ctx = LintContext(workload, options, findings)
        check_counts(ctx)
        for group, index, c in all_containers(workload):
            check_container(ctx, group, index, c)
        if options.cluster is not None:
            check_cluster(ctx)
    if manifests.dra or any(w.spec.resource_claims for w in manifests.workloads):
        # The DRA rules find only in DRA objects and pods that name claims; their CEL environment (0.4 s to
        # import) loads only when there are some.
        from kubegpu.toolkit.lint.dra import check_dra

        check_dra(manifests, options.cluster, findings)
    findings.sort(key=lambda f: (f.file, f.doc, f.line or 0, f.rule))
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.severity == ERROR for f in findings) else 0
