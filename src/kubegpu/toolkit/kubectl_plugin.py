"""`kubectl-gpu`: the cluster tools as a kubectl plugin, `kubectl gpu explain|doctor|lint`.

kubectl runs any `kubectl-<name>` on the PATH for `kubectl <name>`, passing the rest of the command line
and its environment (KUBECONFIG among it) but none of its own flags. So the plugin takes kubectl's
`--kubeconfig`, `--context` and `-n/--namespace` itself, before or after the subcommand, and names itself
`kubectl gpu` in its usage whatever argv[0] is. The commands are kubegpu's (same findings, `--json`, exit
codes); as kubectl commands do, they read the cluster by default:

  kubectl gpu explain POD        = kubegpu explain NS/POD (the namespace from -n or the context)
  kubectl gpu doctor             = kubegpu doctor --cluster (node checks run on the node: kubegpu doctor)
  kubectl gpu lint FILE...       = kubegpu lint FILE... checked against the live cluster (--local: offline)
  kubectl gpu top                = kubegpu top (the plugins' /metrics through the API server's pod proxy)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kubegpu import __version__
from kubegpu.toolkit import cli as toolkit_cli
from kubegpu.toolkit.live import KubeTarget
from kubegpu.toolkit.top.cli import run_top, top_options

PROG = "kubectl gpu"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
POD_TYPES = ("pod", "pods", "po")  # kubectl's TYPE/NAME form: pod/train-0
SNAPSHOT = click.option(
    "--snapshot",
    "snapshot_path",
    type=click.Path(dir_okay=False),
    help="Read this snapshot (kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json) instead of the "
    "cluster.",
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@dataclass
class KubeFlags:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None

    def merged(self, kubeconfig: str | None, context: str | None, namespace: str | None) -> KubeFlags:
        """The subcommand's flags over the group's: `kubectl gpu -n a explain -n b POD` reads b."""
        return KubeFlags(
            kubeconfig if kubeconfig is not None else self.kubeconfig,
            context if context is not None else self.context,
            namespace if namespace is not None else self.namespace,
        )

    @property
    def target(self) -> KubeTarget:
        return KubeTarget(self.kubeconfig, self.context)


def kube_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """kubectl's global flags the plugin understands."""
    for option in reversed(
        (
            click.option(
                "--kubeconfig",
                type=click.Path(dir_okay=False),
                help="Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).",
            ),
            click.option("--context", "kube_context", metavar="NAME", help="The kubeconfig context to use."),
            click.option(
                "-n",
                "--namespace",
                metavar="NAMESPACE",
                help="The namespace (default: the context's, else default).",
            ),
        )
    ):
        command = option(command)
    return command


def _flags(
    ctx: click.Context, kubeconfig: str | None, kube_context: str | None, namespace: str | None
) -> KubeFlags:
    group: KubeFlags = ctx.find_object(KubeFlags) or KubeFlags()
    return group.merged(kubeconfig, kube_context, namespace)


@click.group(
    PROG,
    context_settings=CONTEXT_SETTINGS,
    epilog="\b\nExit codes: 0 ok, 1 findings (a pod that cannot schedule, a failed check, a lint error), "
    "2 bad usage or input.\nThe same tools without kubectl: kubegpu explain|doctor|lint.",
)
@kube_flags
@click.version_option(__version__, "--version", prog_name="kubectl-gpu")
@click.pass_context
def kubectl_gpu(
    ctx: click.Context, kubeconfig: str | None, kube_context: str | None, namespace: str | None
) -> None:
    """GPU scheduling and device-plugin diagnostics, from kubegpu.

    Reads the cluster of your kubeconfig, as kubectl does; --snapshot FILE reads a dump instead
    (kubectl get nodes,pods,daemonsets,runtimeclasses -A -o json).
    """
    ctx.obj = KubeFlags(kubeconfig, kube_context, namespace)


@kubectl_gpu.command(
    "explain",
    context_settings=CONTEXT_SETTINGS,
    epilog="\b\nExamples:\n  kubectl gpu explain train-0 -n ml\n  kubectl gpu explain ml/train-0\n"
    "  kubectl gpu explain pod/train-0 --context prod",
)
@click.argument("pod_ref", metavar="POD")
@SNAPSHOT
@click.option("--all-nodes", is_flag=True, help="List every node, not only the first 40.")
@JSON
@kube_flags
@click.pass_context
def explain(
    ctx: click.Context,
    pod_ref: str,
    snapshot_path: str | None,
    all_nodes: bool,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
    namespace: str | None,
) -> None:
    """Why POD (NAME, pod/NAME or NAMESPACE/NAME) is Pending, in kube-scheduler's words, and the fix."""
    flags = _flags(ctx, kubeconfig, kube_context, namespace)
    name = pod_ref
    prefix, sep, rest = pod_ref.partition("/")
    given_ns: str | None = None
    if sep:
        if not prefix or not rest or "/" in rest:
            raise click.UsageError(f"POD must be NAME, pod/NAME or NAMESPACE/NAME, not {pod_ref!r}")
        name = rest
        if prefix not in POD_TYPES:
            given_ns = prefix
    if given_ns and flags.namespace and given_ns != flags.namespace:
        raise click.UsageError(
            f"{pod_ref} names namespace {given_ns!r} but -n says {flags.namespace!r}; give one of them"
        )
    ns = given_ns or flags.namespace or _context_namespace(flags)
    toolkit_cli.explain_pod(ns, name, snapshot_path, all_nodes, as_json, flags.target)


def _context_namespace(flags: KubeFlags) -> str:
    from kubegpu.toolkit.live import LiveError, current_namespace

    try:
        return current_namespace(flags.target)
    except LiveError as exc:
        raise click.UsageError(str(exc)) from exc


@kubectl_gpu.command("top", context_settings=CONTEXT_SETTINGS)
@top_options
@kube_flags
@click.pass_context
def top(
    ctx: click.Context,
    prometheus: str | None,
    idle: str | None,
    selector: str,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
    namespace: str | None,
) -> None:
    """The cluster's GPUs: model, health, holder pod, utilisation, memory, idle time, fragmentation."""
    flags = _flags(ctx, kubeconfig, kube_context, namespace)
    run_top(flags.target, prometheus, idle, selector, as_json)


@kubectl_gpu.command("doctor", context_settings=CONTEXT_SETTINGS)
@SNAPSHOT
@click.option(
    "--preflight",
    "preflight_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Check the device-plugin DaemonSet in this file (helm template output; - for stdin) against the "
    "cluster before applying it.",
)
@JSON
@kube_flags
@click.pass_context
def doctor(
    ctx: click.Context,
    snapshot_path: str | None,
    preflight_path: str | None,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
    namespace: str | None,
) -> None:
    """The cluster's GPU faults: GPU nodes, the device-plugin DaemonSet and its pods, GPU pods.

    The node-side checks (driver, NVML, container runtime) run on the node: kubegpu doctor there, e.g.
    kubectl debug node/NODE --profile=sysadmin --image=YOUR_KUBEGPU_IMAGE -- kubegpu doctor --host-root /host
    """
    flags = _flags(ctx, kubeconfig, kube_context, namespace)
    toolkit_cli.run_doctor(True, snapshot_path, preflight_path, "/", as_json, flags.target)


@kubectl_gpu.command("lint", context_settings=CONTEXT_SETTINGS)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--local",
    is_flag=True,
    help="Do not read the cluster: only the checks that need none (as kubectl's --local).",
)
@SNAPSHOT
@click.option(
    "--plugin-config",
    type=click.Path(dir_okay=False, exists=True),
    help="The device plugin's config file (v1), for its failRequestsGreaterThanOne.",
)
@JSON
@kube_flags
@click.pass_context
def lint(
    ctx: click.Context,
    files: tuple[str, ...],
    local: bool,
    snapshot_path: str | None,
    plugin_config: str | None,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
    namespace: str | None,
) -> None:
    """GPU mistakes in FILES (manifests; - for stdin) before they reach the cluster, checked against its
    nodes, taints and RuntimeClasses. Rules: kubegpu lint --help."""
    flags = _flags(ctx, kubeconfig, kube_context, namespace)
    if local and snapshot_path:
        raise click.UsageError(
            "--local reads no cluster and --snapshot reads a dump of one; give one of them"
        )
    live = None if local or snapshot_path else flags.target
    toolkit_cli.lint_files(files, snapshot_path, plugin_config, as_json, live=live, namespace=flags.namespace)


def main() -> None:
    """The `kubectl-gpu` console script. kubectl passes the plugin's own path as argv[0]; the usage names
    the command as the user typed it."""
    kubectl_gpu.main(prog_name=PROG)
