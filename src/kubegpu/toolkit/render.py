"""Output for people (rich tables on a terminal, plain lines when piped) and for scripts (JSON), shared by
the toolkit commands; the convention itself is kubegpu.common.output's."""

from __future__ import annotations

import sys
from typing import Any

import msgspec
from rich.console import Console
from rich.text import Text

from kubegpu.common import output
from kubegpu.toolkit.scheduling import same_summary

SEVERITY_STYLE = {
    "error": "bold red",
    "fail": "bold red",
    "warning": "yellow",
    "warn": "yellow",
    "ok": "green",
    "info": "cyan",
    "skip": "dim",
}


def console() -> Console:
    return output.console()


def emit_json(data: Any) -> None:
    # msgspec writes a 5,000-node explanation ~10x faster than json.dumps(indent=2).
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(data), indent=2).decode() + "\n")


def styled(label: str) -> Text:
    return Text(label, style=SEVERITY_STYLE.get(label, ""))


def table(out: Console, title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    output.print_table(out, columns, rows, title=title)


def print_explanation(result: Any, max_rows: int | None = None) -> None:
    """Human output of `explain`: the scheduler's line, fixes, fragmentation, then node by node."""
    out = console()
    wants = ", ".join(f"{n}: {v}" for n, v in result.requests.items())
    if result.dra is not None and result.dra.claims:  # a bridged extended resource brings no pod claims
        claims = ", ".join(c["name"] for c in result.dra.claims)
        wants = f"{wants}, DRA claims {claims}" if wants else f"DRA claims {claims}"
    wants = wants or "nothing"
    out.print(f"[bold]Pod {result.pod}[/bold] ({result.phase}) requests {wants}")
    if result.message:
        out.print(Text("Scheduler: ", style="bold") + Text(result.message, style="red"))
    elif result.feasible_nodes:
        out.print(
            Text(
                f"Fits {len(result.feasible_nodes)} node(s): "
                + ", ".join(result.feasible_nodes[:10])
                + (" ..." if len(result.feasible_nodes) > 10 else ""),
                style="green",
            )
        )
    if result.recorded_message and not (
        result.message and same_summary(result.recorded_message, result.message)
    ):
        out.print(Text("Last recorded by the scheduler: ", style="bold") + Text(result.recorded_message))
    for note in result.notes:
        out.print(Text("Note: ", style="yellow") + Text(note))
    if result.fixes:
        out.print()
        rows = [[fix.kind, fix.summary] for fix in result.fixes]
        table(out, "What would fix it", ["Kind", "Fix"], rows)
        for fix in result.fixes:
            if fix.kind == "free-gpus":
                detail = [
                    [
                        r["node"],
                        ", ".join(f"{v} {n}" for n, v in r["free"].items()),
                        ", ".join(r["holders"]) or "-",
                    ]
                    for r in fix.nodes[:10]
                ]
                table(out, "Free these to fit the pod", ["Node", "Free", "Pods holding GPUs there"], detail)
            elif fix.kind == "unhealthy-gpus":
                detail = [
                    [
                        r["node"],
                        r["resource"],
                        r["unhealthy"],
                        r["free_now"],
                        r["free_if_healthy"],
                        "yes" if r["would_fit"] else "no",
                    ]
                    for r in fix.nodes[:10]
                ]
                table(
                    out,
                    "Unhealthy GPUs hiding capacity",
                    ["Node", "Resource", "Unhealthy", "Free now", "Free if healthy", "Pod fits then"],
                    detail,
                )
    if result.dra is not None:
        print_dra(out, result.dra)
    for name, rows in result.fragmentation.items():
        frag = [[r.size, r.free, r.fits, r.stranded, f"{r.percent:.0f}%", r.largest_block] for r in rows]
        table(
            out,
            f"Cluster-wide fragmentation of {name} (schedulable nodes)",
            ["Request size", "Free", "Pods that fit", "Stranded", "Fragmentation", "Largest free block"],
            frag,
        )
    verdicts = result.nodes if max_rows is None else result.nodes[:max_rows]
    gpu_cols = [f"{n} free/alloc/cap" for n in result.gpu_resources]
    rows = []
    for v in verdicts:
        counts = [f"{c.free}/{c.allocatable}/{c.capacity}" for c in v.gpus.values()]
        verdict = styled("ok") if v.fits else Text(v.plugin or "", style="red")
        rows.append([v.node, v.pool, *counts, verdict, "; ".join(v.reasons) or "fits"])
    table(out, "Node by node", ["Node", "Pool", *gpu_cols, "Filter", "Why"], rows)
    if max_rows is not None and len(result.nodes) > max_rows:
        out.print(f"... and {len(result.nodes) - max_rows} more node(s); use --all-nodes or --json.")


def print_dra(out: Console, dra: Any, max_devices: int = 8) -> None:
    """The pod's DRA claims, then per node and request: devices left and what ruled out the others."""
    claims = [[c["name"], c["claim"], c["state"]] for c in dra.claims]
    table(out, "DRA claims", ["Pod claim", "ResourceClaim", "State"], claims)
    if not dra.nodes:
        return
    rows = []
    for n in dra.nodes:
        verdict = styled("ok") if n.fits else Text(n.summary, style="red")
        if not n.requests:
            rows.append([n.node, "-", "-", "-", "-", verdict, "; ".join(n.pools) or "no pools"])
        for r in n.requests:
            ruled = ", ".join(f"{count} {why}" for why, count in r.ruled_out.items()) or "none"
            shown = r.devices[:max_devices]
            more = f" ... and {len(r.devices) - max_devices} more" if len(r.devices) > max_devices else ""
            detail = "\n".join(shown) + more if shown else "; ".join(n.pools) or "no pools"
            rows.append(
                [
                    n.node,
                    f"{r.claim} {r.request}",
                    r.device_class,
                    r.wanted,
                    r.available,
                    verdict,
                    ruled + "\n" + detail,
                ]
            )
    table(
        out,
        "DynamicResources, node by node (nodes that pass the other filters)",
        ["Node", "Claim request", "Class", "Wants", "Available", "Verdict", "Ruled out"],
        rows,
    )
