"""Cold start: `kubegpu plugin` process start -> registered, and -> devices listed at the kubelet.

Method: the kubelet simulator in this process; each run starts `python -m kubegpu plugin` on the fake NVML
(as on a node: its own process, discovery, serving, registering) and times from just before the process is
spawned to the kubelet's REGISTERED event and to the first DEVICES_UPDATED after it (the kubelet processed
the first ListAndWatch message). Then the plugin is stopped with SIGTERM and the next run starts. Python
start-up and imports are included: that is what a node pays.

Baselines, measured in the same run and interleaved with the plugin runs, spawn to exit:
- `python -c "import grpc"`: the floor for any Python gRPC plugin;
- `python -m kubegpu --help`: our own CLI's imports, without discovery or serving.
One untimed warm-up of each comes first, so every run finds the same warm page cache and bytecode.

Target: none is set in the design or the issues (informational); the ratios show what start-up costs
beyond interpreter + grpc and beyond our CLI's imports.

    python -m bench.cold_start [--runs 10] [--profile dgx-a100]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

from bench.common import REPO_ROOT, Result, Row, interruptible, ms, ratio, summary_ms
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.kubeletsim import EventKind

BASELINES = {
    "python -c 'import grpc'": [sys.executable, "-c", "import grpc"],
    "python -m kubegpu --help": [sys.executable, "-m", "kubegpu", "--help"],
}


def _time_process(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, env=env, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


async def _plugin_start(node: SimulatedNode) -> tuple[float, float]:
    mark = node.sim.last_seq
    started = time.monotonic()
    node.start_plugin()
    try:
        registered = await node.sim.wait_for_event(
            EventKind.REGISTERED, resource=GPU_RESOURCE, after=mark, timeout=30
        )
        listed = await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=registered.seq, timeout=30
        )
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n--- plugin log ---\n{node.plugin_log()}") from None
    await node.stop_plugin()
    return registered.time - started, listed.time - started


async def _run(runs: int, profile: str) -> Result:
    registered: list[float] = []
    listed: list[float] = []
    base: dict[str, list[float]] = {name: [] for name in BASELINES}
    async with SimulatedNode(profile) as node:
        await _plugin_start(node)  # warm-up, not counted
        for argv in BASELINES.values():
            await asyncio.to_thread(_time_process, argv, node.env)
        for _ in range(runs):
            reg, lst = await _plugin_start(node)
            registered.append(reg)
            listed.append(lst)
            for name, argv in BASELINES.items():
                base[name].append(await asyncio.to_thread(_time_process, argv, node.env))
    reg_s, lst_s = summary_ms(registered), summary_ms(listed)
    base_s = {name: summary_ms(samples) for name, samples in base.items()}
    grpc_name, cli_name = BASELINES
    grpc_p50, cli_p50 = base_s[grpc_name]["p50_ms"], base_s[cli_name]["p50_ms"]
    ratios = {
        "registered_vs_import_grpc": ratio(reg_s["p50_ms"], grpc_p50),
        "registered_vs_kubegpu_help": ratio(reg_s["p50_ms"], cli_p50),
        "listed_vs_import_grpc": ratio(lst_s["p50_ms"], grpc_p50),
    }
    target = "none set (informational)"
    return Result(
        "cold_start",
        {
            "registered": reg_s,
            "devices_listed": lst_s,
            "import_grpc": base_s[grpc_name],
            "kubegpu_help": base_s[cli_name],
            **ratios,
            "profile": profile,
        },
        target=target,
        passed=None,
        rows=[
            Row(
                "Cold start -> registered, p50",
                ms(reg_s["p50_ms"]),
                f"{ms(grpc_p50)} (`python -c 'import grpc'`)",
                ratios["registered_vs_import_grpc"],
                target,
            ),
            Row(
                "Cold start -> registered, p50 (vs our CLI's imports)",
                ms(reg_s["p50_ms"]),
                f"{ms(cli_p50)} (`kubegpu --help`)",
                ratios["registered_vs_kubegpu_help"],
                target,
            ),
            Row(
                "Cold start -> devices listed, p50 / max",
                f"{ms(lst_s['p50_ms'])} / {ms(lst_s['max_ms'])}",
                f"{ms(grpc_p50)} (`python -c 'import grpc'`)",
                ratios["listed_vs_import_grpc"],
                target,
            ),
        ],
    )


def run(runs: int = 10, profile: str = "dgx-a100") -> Result:
    return asyncio.run(_run(runs, profile))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="plugin starts (and of each baseline)")
    parser.add_argument("--profile", default="dgx-a100", help="fake NVML profile")
    args = parser.parse_args()
    interruptible()
    run(args.runs, args.profile).save()
