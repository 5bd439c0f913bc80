"""Click commands of the SRE toolkit: `lint`, `explain` and `doctor`.

The main `kubegpu` group attaches them (`cli.add_command(lint)` ...). Exit codes, for scripts and CI:

  lint     0 no errors (warnings allowed), 1 at least one error finding, 2 bad usage or unreadable input
  explain  0 the pod is scheduled or would fit a node, 1 no node can take it, 2 bad usage or input
  doctor   0 no failed check (warnings allowed), 1 at least one failed check, 2 bad usage or input
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from kubegpu.common import output
from kubegpu.common.files import MIB, FileProblem, decode_text, read_input
from kubegpu.toolkit import render
from kubegpu.toolkit.cluster_facts import ClusterFacts
from kubegpu.toolkit.doctor.findings import exit_code as findings_exit_code
from kubegpu.toolkit.lint.run import RULES, LintOptions, exit_code
from kubegpu.toolkit.lint.run import lint as run_lint
from kubegpu.toolkit.live import CURRENT, KubeTarget
from kubegpu.toolkit.manifests import Manifests, parse_text
from kubegpu.toolkit.model import DaemonSet, Pod
from kubegpu.toolkit.snapshot import Snapshot, SnapshotError, load_snapshot

# A manifest file (or standard input) is read up to this size: all of a cluster's manifests in one file are
# tens of MB; this stops a wrong file, not a real one.
MANIFEST_LIMIT = 256 * MIB


def _fail(message: str) -> NoReturn:
    output.error(message, output.EXIT_USAGE)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """A snapshot is a large tree without cycles that lives until the command ends: the collector would
    only re-scan it over and over. Pause it for the command, and restore it (tests run many commands)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _snapshot_or_live(
    path: str | None, keep: tuple[tuple[str, str], ...] = (), target: KubeTarget = CURRENT
) -> Snapshot:
    """The snapshot file when given, else the live cluster of the kubeconfig `target` names. `keep` names
    pods to hold in full (the one `explain` looks at)."""
    try:
        if path is not None:
            return load_snapshot(path, keep=keep)
        from kubegpu.toolkit.live import LiveError, load_live

        try:
            return load_live(keep=keep, target=target)
        except LiveError as exc:
            _fail(str(exc))
    except SnapshotError as exc:
        _fail(str(exc))
    raise AssertionError("unreachable")


def kube_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """kubectl's --kubeconfig and --context, for the commands that read the live cluster."""
    command = click.option(
        "--context",
        "kube_context",
        metavar="NAME",
        help="The kubeconfig context to read (default: its current-context).",
    )(command)
    return click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        help="The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config; in a pod, its service "
        "account).",
    )(command)


# --- lint --------------------------------------------------------------------------------------------


def _rules_help() -> str:
    lines = [
        f"  {r.id} {r.name} ({r.severity}{', needs --snapshot' if r.needs_snapshot else ''})"
        for r in RULES.values()
    ]
    return "\n".join(lines)


@click.command(
    "lint",
    epilog="\b\nRules:\n" + _rules_help() + "\n\n\b\nExit codes: 0 no errors, 1 errors found, "
    "2 bad usage or unreadable file.",
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--snapshot",
    "snapshot_path",
    type=click.Path(dir_okay=False),
    help="Cluster snapshot (kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json) enabling the "
    "checks against real nodes: taints, RuntimeClass, resource names, node sizes.",
)
@click.option(
    "--plugin-config",
    type=click.Path(dir_okay=False, exists=True),
    help="The device plugin's config file (v1), to know whether shared resources fail requests above 1; "
    "checked as the plugin checks it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON.")
def lint(files: tuple[str, ...], snapshot_path: str | None, plugin_config: str | None, as_json: bool) -> None:
    """Check pod specs for GPU mistakes before they reach the cluster.

    FILES are YAML (multi-document) or JSON manifests, or v1 Lists, holding Pods, Deployments,
    StatefulSets, DaemonSets, Jobs, CronJobs, ReplicaSets, ReplicationControllers or PodTemplates.
    Use - to read standard input.
    """
    lint_files(files, snapshot_path, plugin_config, as_json)


def lint_files(
    files: tuple[str, ...],
    snapshot_path: str | None,
    plugin_config: str | None,
    as_json: bool,
    live: KubeTarget | None = None,
    namespace: str | None = None,
) -> None:
    """Lint `files` and exit: against the snapshot when given, else the live cluster `live` names (if any).
    `namespace` fills in objects that name none (kubectl apply -n)."""
    # The manifests' data and node trees live until the command ends and hold no cycles: the collector would
    # only re-scan them (60,000 pods: 21.6 s of CPU with it, 5 s without).
    with _collector_paused():
        _lint_files(files, snapshot_path, plugin_config, as_json, live, namespace)


def _lint_files(
    files: tuple[str, ...],
    snapshot_path: str | None,
    plugin_config: str | None,
    as_json: bool,
    live: KubeTarget | None,
    namespace: str | None,
) -> None:
    manifests = Manifests()
    for name in files:
        try:
            shown, data = read_input(name, limit=MANIFEST_LIMIT, what="manifest")
            text = decode_text(data, shown, what="manifest")
        except FileProblem as exc:
            _fail(f"cannot read {exc}")
        parse_text(text, shown, manifests)
    if namespace:
        for workload in manifests.workloads:
            workload.namespace = workload.namespace or namespace
        for obj in manifests.dra:
            if obj.kind in ("ResourceClaim", "ResourceClaimTemplate"):
                obj.namespace = obj.namespace or namespace
    options = LintOptions()
    if snapshot_path or live is not None:
        options.cluster = ClusterFacts.of(_snapshot_or_live(snapshot_path, target=live or CURRENT))
    if plugin_config:
        from kubegpu.settings.nvidia_config import ConfigError
        from kubegpu.toolkit.lint.plugin_config import fail_requests_greater_than_one

        try:
            options.fail_requests_greater_than_one = fail_requests_greater_than_one(plugin_config)
        except ConfigError as exc:
            _fail(str(exc))
    findings = run_lint(manifests, options)
    code = exit_code(findings)
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    if as_json:
        render.emit_json(
            {
                "findings": [f.to_json() for f in findings],
                "summary": {
                    "objects": len(manifests.workloads) + len(manifests.dra),
                    "documents": manifests.documents,
                    "errors": errors,
                    "warnings": warnings,
                    "skipped_kinds": manifests.skipped,
                },
                "exit_code": code,
            }
        )
        sys.exit(code)
    out = render.console()
    if findings:
        rows = [
            [
                f"{f.file}:{f.line}" if f.line else f"{f.file} (doc {f.doc})",
                f"{f.object or '-'}" + (f"\n[{f.container}]" if f.container else ""),
                render.styled(f.severity),
                f"{f.rule}\n{f.name}",
                f"{f.message}\n→ {f.fix}",
            ]
            for f in findings
        ]
        output.print_table(
            out, ["Where", "Object", "Severity", "Rule", "Problem → fix"], rows, plain=_finding_line
        )
    skipped = (
        f"; skipped {sum(manifests.skipped.values())} object(s) of other kinds" if manifests.skipped else ""
    )
    out.print(
        f"{len(manifests.workloads) + len(manifests.dra)} object(s) checked: {errors} error(s), "
        f"{warnings} warning(s){skipped}."
    )
    sys.exit(code)


def _check_line(row: Sequence[Any]) -> str:
    """A doctor finding as one line: `status check object: evidence; fault: ...; fix: ...`."""
    status, check, obj, evidence, fault, fix = (output.one_line(getattr(c, "plain", str(c))) for c in row)
    more = "".join(f"; {k}: {v}" for k, v in (("fault", fault), ("fix", fix)) if v != "-")
    return f"{status} {check} {obj}: {evidence}{more}"


def _finding_line(row: Sequence[Any]) -> str:
    """A finding as one line, compiler style: `file:line: severity rule (name): object: problem → fix`."""
    where, obj, severity, rule, problem = (output.one_line(getattr(c, "plain", str(c))) for c in row)
    rule_id, _, name = rule.partition(" ")
    return f"{where}: {severity} {rule_id} ({name}): {obj}: {problem}"


def _pod_hint(snap: Snapshot, namespace: str, name: str) -> str:
    in_ns = [p for p in snap.pods if p.metadata.namespace == namespace]
    if not in_ns:
        return f"the snapshot has no pods in namespace {namespace!r}"
    close = difflib.get_close_matches(name, [p.metadata.name for p in in_ns], n=3)
    if close:
        return f"did you mean {', '.join(close)}?"
    pending = sorted(p.metadata.name for p in in_ns if p.status.phase == "Pending")
    if pending:
        return f"Pending pods in {namespace}: {', '.join(pending[:10])}"
    return f"pods in {namespace}: {', '.join(sorted(p.metadata.name for p in in_ns)[:10])}"


# --- explain -----------------------------------------------------------------------------------------

MAX_NODE_ROWS = 40


@click.command(
    "explain",
    epilog="\b\nExit codes: 0 the pod is scheduled or would fit a node, 1 no node can take "
    "it, 2 bad usage or input.",
)
@click.argument("pod_ref", metavar="NAMESPACE/NAME")
@click.option(
    "--snapshot",
    "snapshot_path",
    type=click.Path(dir_okay=False),
    help="Cluster snapshot (kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json); without it the "
    "live cluster is read from the kubeconfig.",
)
@click.option("--all-nodes", is_flag=True, help=f"List every node, not only the first {MAX_NODE_ROWS}.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the explanation as JSON (summary line under `message`)."
)
@kube_options
def explain(
    pod_ref: str,
    snapshot_path: str | None,
    all_nodes: bool,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Explain why a GPU pod is Pending, in kube-scheduler's words, and what would let it schedule.

    Runs the scheduler's filters (NodeUnschedulable, NodeName, TaintToleration, NodeAffinity,
    NodeResourcesFit) on every node, prints the FailedScheduling summary line, each node's reason,
    and the fixes: nodes that fit once GPUs are freed, unhealthy GPUs hiding capacity, fragmentation.
    """
    namespace, sep, name = pod_ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        _fail(f"pod must be given as NAMESPACE/NAME (e.g. ml/train-0), not {pod_ref!r}")
    explain_pod(namespace, name, snapshot_path, all_nodes, as_json, KubeTarget(kubeconfig, kube_context))


def explain_pod(
    namespace: str,
    name: str,
    snapshot_path: str | None,
    all_nodes: bool,
    as_json: bool,
    target: KubeTarget = CURRENT,
) -> None:
    """Explain pod NAMESPACE/NAME of the snapshot (or the live cluster `target` names) and exit."""
    with _collector_paused():
        _explain(namespace, name, snapshot_path, all_nodes, as_json, target)


def _explain(
    namespace: str, name: str, snapshot_path: str | None, all_nodes: bool, as_json: bool, target: KubeTarget
) -> None:
    from kubegpu.toolkit.explain.run import explain as run_explain

    snap = _snapshot_or_live(snapshot_path, keep=((namespace, name),), target=target)
    pod = snap.find_pod(namespace, name)
    if not isinstance(pod, Pod):  # kept whole by `keep`, so a PodLite here means it was not found
        _fail(
            f"pod {namespace}/{name} is not in {snap.source or 'the cluster'}; "
            f"{_pod_hint(snap, namespace, name)}"
        )
        return
    result = run_explain(snap, pod)
    if as_json:
        render.emit_json(result.to_json())
        sys.exit(result.exit_code)
    render.print_explanation(result, max_rows=None if all_nodes else MAX_NODE_ROWS)
    sys.exit(result.exit_code)


# --- doctor ------------------------------------------------------------------------------------------


@click.command(
    "doctor",
    epilog="\b\nExit codes: 0 no failed check (warnings allowed), 1 at least one failed "
    "check, 2 bad usage or input.\nFaults: 1 container sees no GPU, 2 node shows no/too few GPUs, "
    "3 pod Pending, 4 plugin crash-loops, 5 malformed GPU request.",
)
@click.option(
    "--cluster",
    "cluster_mode",
    is_flag=True,
    help="Check the cluster (nodes, plugin DaemonSet and pods, RuntimeClasses) instead of this node.",
)
@click.option(
    "--snapshot",
    "snapshot_path",
    type=click.Path(dir_okay=False),
    help="With --cluster: a snapshot from kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json; "
    "without it the live cluster is read from the kubeconfig.",
)
@click.option(
    "--preflight",
    "preflight_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="With --cluster: check the device-plugin DaemonSet in this file (`helm template` output or a "
    "static manifest; - for stdin) before applying it: that it lands on every GPU node, with the labels "
    "the nodes keep once NVIDIA's release and its NFD are uninstalled, and pulls a kubegpu image tag.",
)
@click.option(
    "--host-root",
    type=click.Path(file_okay=False),
    default="/",
    show_default=True,
    help="Node mode: where the host's filesystem is mounted (e.g. /host in a debug pod).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@kube_options
def doctor(
    cluster_mode: bool,
    snapshot_path: str | None,
    preflight_path: str | None,
    host_root: str,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Diagnose the classic GPU faults on this node, or across the cluster with --cluster.

    Each finding has a status (ok, warn, fail), the evidence, the fault number it explains, and the fix.
    With --preflight FILE, only the checks of the DaemonSet in FILE against the cluster are run.
    """
    if snapshot_path and not cluster_mode:
        _fail("--snapshot describes a cluster; add --cluster (node checks read --host-root instead)")
    if preflight_path and not cluster_mode:
        _fail("--preflight checks a DaemonSet against the cluster; add --cluster")
    target = KubeTarget(kubeconfig, kube_context)
    if target.explicit and not cluster_mode:
        _fail("--kubeconfig and --context choose a cluster; add --cluster")
    run_doctor(cluster_mode, snapshot_path, preflight_path, host_root, as_json, target)


def run_doctor(
    cluster_mode: bool,
    snapshot_path: str | None,
    preflight_path: str | None,
    host_root: str,
    as_json: bool,
    target: KubeTarget = CURRENT,
) -> None:
    """Run the node checks, the cluster checks or the pre-flight, print the findings and exit."""
    with _collector_paused():
        _doctor(cluster_mode, snapshot_path, preflight_path, host_root, as_json, target)


def _planned(path: str) -> list[DaemonSet]:
    from kubegpu.toolkit.doctor.preflight import PreflightError, read_planned

    try:
        shown, data = read_input(path, limit=MANIFEST_LIMIT, what="manifest")
        return read_planned(decode_text(data, shown, what="manifest"), shown)
    except FileProblem as exc:
        _fail(f"cannot read {exc}")
    except PreflightError as exc:
        _fail(str(exc))


def _doctor(
    cluster_mode: bool,
    snapshot_path: str | None,
    preflight_path: str | None,
    host_root: str,
    as_json: bool,
    target: KubeTarget,
) -> None:
    if cluster_mode and preflight_path:
        from kubegpu.toolkit.doctor.preflight import preflight

        planned = _planned(preflight_path)
        findings = preflight(planned, _snapshot_or_live(snapshot_path, target=target))
    elif cluster_mode:
        from kubegpu.toolkit.doctor.cluster import doctor_cluster

        findings = doctor_cluster(_snapshot_or_live(snapshot_path, target=target))
    else:
        from kubegpu.settings.env import NvmlSelection
        from kubegpu.settings.given import read_given
        from kubegpu.settings.nvidia_config import ConfigError
        from kubegpu.settings.setting import DOCTOR
        from kubegpu.settings.table import for_command
        from kubegpu.toolkit.doctor.node import doctor_node

        if not Path(host_root).is_dir():  # bad input (exit 2), not a finding about the node
            _fail(
                f"--host-root {host_root} is not a directory: pass the directory where the host's filesystem "
                "is mounted, e.g. --host-root /host"
            )
        try:  # the NVML the plugin would use here (KUBEGPU_FAKE_NVML, ...)
            selection = NvmlSelection.from_given(read_given(for_command(DOCTOR)), DOCTOR)
        except ConfigError as err:
            _fail(str(err))
        findings = doctor_node(Path(host_root), nvml_selection=selection)
    code = findings_exit_code(findings)
    if as_json:
        render.emit_json({"findings": [f.to_json() for f in findings], "exit_code": code})
        sys.exit(code)
    out = render.console()
    rows = [
        [
            render.styled(f.status),
            f.check,
            f.object,
            f.evidence,
            str(f.fault) if f.fault else "-",
            f.fix or "-",
        ]
        for f in findings
    ]
    output.print_table(
        out, ["Status", "Check", "Object", "Evidence", "Fault", "Fix"], rows, plain=_check_line
    )
    fails = sum(f.status == "fail" for f in findings)
    warns = sum(f.status == "warn" for f in findings)
    out.print(f"{fails} failed, {warns} warning(s), {len(findings) - fails - warns} ok.")
    sys.exit(code)
