"""`kubegpu top` (and `kubectl gpu top`): the cluster's GPUs, who holds them, how much they are used."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from kubegpu.common import output
from kubegpu.settings.goduration import parse_go_duration
from kubegpu.toolkit.live import CURRENT, KubeTarget, LiveError, api_client
from kubegpu.toolkit.top.model import (
    Fragmentation,
    GpuRow,
    NodeMetrics,
    PendingPod,
    fragmentation,
    gpu_rows,
    idle_over,
    nvlink_groups,
)
from kubegpu.toolkit.top.sources import PLUGIN_SELECTOR, from_pod_proxy, from_prometheus, pending_gpu_pods

COLUMNS = ("Node", "GPU", "Model", "Health", "Pod", "Util", "Memory", "Idle for")


def top_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options `kubegpu top` and `kubectl gpu top` share."""
    for option in reversed(
        (
            click.option(
                "--prometheus",
                metavar="URL",
                help="Read the metrics from this Prometheus (e.g. http://prometheus:9090) instead of from "
                "each device-plugin pod through the API server.",
            ),
            click.option(
                "--idle",
                metavar="DURATION",
                help="Only GPUs held by a pod and idle at least this long (Go duration: 30m, 1h, 2h30m).",
            ),
            click.option(
                "--selector",
                default=PLUGIN_SELECTOR,
                show_default=True,
                help="Label selector of the device-plugin pods.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        )
    ):
        command = option(command)
    return command


@click.command("top")
@top_options
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="The kubeconfig to use.")
@click.option("--context", "kube_context", metavar="NAME", help="The kubeconfig context to use.")
def top(
    prometheus: str | None,
    idle: str | None,
    selector: str,
    as_json: bool,
    kubeconfig: str | None,
    kube_context: str | None,
) -> None:
    """Show the cluster's GPUs: model, health, holder pod, utilisation, memory, idle time, fragmentation.

    Reads each device-plugin pod's /metrics through the API server's pod proxy with your kubeconfig (the
    plugin needs the chart's health.port), or a Prometheus that scrapes them with --prometheus.

    \b
    Examples:
      kubegpu top
      kubegpu top --idle 1h
      kubegpu top --prometheus http://prometheus.monitoring:9090 --json
    """
    run_top(KubeTarget(kubeconfig, kube_context), prometheus, idle, selector, as_json)


def run_top(
    target: KubeTarget, prometheus: str | None, idle: str | None, selector: str, as_json: bool
) -> None:
    idle_s = None
    if idle is not None:
        try:
            idle_s = parse_go_duration(idle) / 1e9
        except ValueError as err:
            raise click.BadParameter(f"{err} (e.g. 30m, 1h)", param_hint="--idle") from None
    try:
        nodes, pending = _read(target, prometheus, selector)
    except LiveError as err:
        output.error(str(err), output.EXIT_USAGE)
    rows = gpu_rows(nodes)
    frag = fragmentation(rows, pending, nvlink_groups(nodes))
    shown = idle_over(rows, idle_s) if idle_s is not None else rows
    errors = [n.error for n in nodes if n.error]
    if as_json:
        body = {"gpus": [r.to_json() for r in shown], "fragmentation": frag.to_json(), "errors": errors}
        click.echo(json.dumps(body, indent=2))
        return
    out = output.console()
    title = f"GPUs held and idle for at least {idle}" if idle else "GPUs"
    output.print_table(out, COLUMNS, [_cells(r) for r in shown], title=title)
    if not shown:
        output.print_line(out, "no GPU held that long" if idle else "no GPU found in the plugins' metrics")
    for line in _summary(frag) + [f"warning: {e}" for e in errors]:
        output.print_line(out, line)


def _read(
    target: KubeTarget, prometheus: str | None, selector: str
) -> tuple[Sequence[NodeMetrics], Sequence[PendingPod]]:
    if prometheus:
        nodes = from_prometheus(prometheus)
        try:  # pending pods need the API; without a cluster the summary leaves them out
            pending = pending_gpu_pods(api_client(target))
        except LiveError:
            pending = []
        return nodes, pending
    api = api_client(target)
    return from_pod_proxy(api, selector), pending_gpu_pods(api)


def _cells(row: GpuRow) -> list[str]:
    memory = "-"
    if row.memory_used_mib is not None and row.memory_total_mib:
        memory = f"{row.memory_used_mib / 1024:.1f}/{row.memory_total_mib / 1024:.0f} GiB"
    util = "-" if row.utilization is None else f"{row.utilization:.0f}%"
    return [
        row.node,
        row.gpu,
        row.model,
        row.health or "-",
        row.holder or "-",
        util,
        memory,
        _duration(row.idle_seconds),
    ]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _summary(frag: Fragmentation) -> list[str]:
    lines = [
        "free GPUs: "
        + (", ".join(f"{node} {free}" for node, free in sorted(frag.free_by_node.items())) or "none")
        + f" (largest request a node can take: {max(frag.free_by_node.values(), default=0)})"
    ]
    for group in frag.split_nvlink_groups:
        lines.append(
            f"NVLink group {group.node} GPUs {','.join(group.gpus)}: {group.held} held, {group.free} free "
            f"(no {len(group.gpus)}-GPU job fits it)"
        )
    for pod in frag.only_together:
        lines.append(
            f"pending {pod.namespace}/{pod.name} asks for {pod.gpus} GPUs: {frag.total_free} are free, "
            "but no node has that many"
        )
    return lines


__all__ = ["CURRENT", "run_top", "top", "top_options"]
