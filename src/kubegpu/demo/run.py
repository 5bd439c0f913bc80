"""`kubegpu demo`: the plugin at work on a simulated GPU node, narrated like an SRE's terminal.

Everything is real except the hardware and the kubelet: the plugin is `kubegpu plugin` in its own process
on the fake NVML (`dgx-a100` unless told otherwise), talking v1beta1 over unix sockets to the kubelet
simulator, which applies the real kubelet's rules. Faults are injected through the fake's state directory,
exactly what `kubegpu fake-nvml inject` does. It all lives in a temp dir that is removed at the end.

Every shipped profile works: the GPUs used are the profile's own (a 4-GPU node gets its XID on GPU 3); on
a node whose driver or NVML library is missing (`no-driver`, `no-library`) the demo shows what the plugin
does there instead: it stops with NVIDIA's error, or, with failOnInitError=false, stays up advertising
nothing.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from kubegpu.allocation.preferred import pair_score
from kubegpu.api.v1beta1 import api_pb2
from kubegpu.common import output
from kubegpu.demo.dra_act import dra_act
from kubegpu.demo.dranode import SimulatedDraNode
from kubegpu.demo.mig_act import mig_act, mig_node, start_mig_driver
from kubegpu.demo.sharing_act import SHARES_FLAGS
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from kubegpu.demo.usage_act import usage_act, usage_node
from kubegpu.kubeletsim import Container, EventKind, Pod, SimEvent
from kubegpu.node.discovery import discover, nvml_session
from kubegpu.node.inventory import Inventory
from kubegpu.node.nvml.backend import load_nvml
from kubegpu.node.nvml.fake_state import StateDir
from kubegpu.settings.env import NvmlSelection

PREFERRED_XID_GPU = 5  # on the 8-GPU profiles; smaller nodes use their last GPU
# Short enough to watch: in production the quiet period is 60 s (KUBEGPU_RECOVERY_QUIET_SECONDS).
DEMO_HEALTH_ENV = {"KUBEGPU_RECOVERY_QUIET_SECONDS": "1.5", "KUBEGPU_HEALTH_PROBE_SECONDS": "0.25"}


class Narrator:
    def __init__(self, console: Console, quiet: bool) -> None:
        self.console = console
        self.quiet = quiet
        self.step = 0

    def section(self, title: str) -> None:
        self.step += 1
        if self.quiet:
            return
        self.console.print()
        if self.console.is_terminal:
            self.console.rule(Text(f"{self.step}. {title}", style="bold"), align="left")
        else:  # piped: a rule would be as wide as the unlimited line
            self.console.print(Text(f"== {self.step}. {title}"))

    def command(self, text: str) -> None:
        if not self.quiet:
            self.console.print(Text.assemble(("$ ", "green"), (text, "bold")))

    def say(self, *parts: Any) -> None:
        if self.quiet:
            return
        for part in parts:
            if isinstance(part, Rows):
                output.print_table(self.console, part.columns, part.rows, title=part.title)
            else:
                self.console.print(part)


@dataclass(frozen=True)
class Rows:
    """A table for the narration: drawn on a terminal, plain lines when piped (kubegpu.common.output)."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


def _node_table(node: SimulatedNode) -> Rows:
    sim = node.sim
    rows: list[list[Any]] = []
    for resource, cap in sorted(sim.capacity().items()):
        alloc = sim.allocatable().get(resource, 0)
        rows.append([resource, str(cap), Text(str(alloc), style="red" if alloc < cap else "green")])
    return Rows(
        "kubectl describe node (Capacity / Allocatable)", ["resource", "capacity", "allocatable"], rows
    )


def _gpu_table(node: SimulatedNode, inventory: Inventory, holders: dict[str, str]) -> Rows:
    devices = node.sim.devices(GPU_RESOURCE)
    rows: list[list[Any]] = []
    for gpu in inventory.gpus:
        state = devices.get(gpu.uuid)
        health = state.health if state else "-"
        rows.append(
            [
                str(gpu.index),
                gpu.uuid,
                "-" if gpu.numa_node is None else str(gpu.numa_node),
                Text(health, style="green" if health == "Healthy" else "red"),
                holders.get(gpu.uuid, "") or "-",
            ]
        )
    columns = ["GPU", "device ID (UUID)", "NUMA", "health", "held by"]
    return Rows(f"{GPU_RESOURCE} devices as the kubelet sees them", columns, rows)


def _link_text(inventory: Inventory, a_uuid: str, b_uuid: str) -> str:
    a, b = inventory.gpu_by_uuid(a_uuid), inventory.gpu_by_uuid(b_uuid)
    assert a is not None and b is not None
    link = inventory.link_map().get((a.index, b.index))
    if link is None:
        return f"GPU {a.index} and GPU {b.index}: no link information"
    kind = f"NVLink x{link.nvlinks}" if link.nvlinks else f"PCIe ({link.level.name.lower()})"
    return f"GPU {a.index} <-> GPU {b.index}: {kind}, link score {pair_score(link)}"


async def run_demo(profile: str, console: Console, quiet: bool) -> dict[str, Any]:
    say = Narrator(console, quiet)
    backend = load_nvml(NvmlSelection.fake(profile))  # ValueError for an unknown or broken profile
    try:
        with nvml_session(backend.nvml):
            inventory = discover(backend)
    except backend.nvml.NVMLError as err:
        return await _without_gpus(profile, say, f"NVML cannot start here: {err}")
    if not inventory.gpus:
        return await _without_gpus(profile, say, "NVML finds no GPU")
    results: dict[str, Any] = {"profile": profile, "gpus": len(inventory.gpus)}
    say.say(
        Text.assemble(
            ("kubegpu demo: ", "bold"),
            f"a simulated {profile} node ({len(inventory.gpus)} x {inventory.gpus[0].name}), "
            "its kubelet and the kubegpu plugin. No GPU, no cluster.",
        )
    )
    async with (
        SimulatedDraNode(profile) as dra_node,
        mig_node() as dynamic_mig_node,
        SimulatedNode(profile, env=DEMO_HEALTH_ENV) as node,
        usage_node(profile, inventory) as use_node,  # its plugin starts now: its start-up overlaps
    ):
        say.say(Text(f"work dir {node.root} (removed at the end)", style="dim"))
        xid_gpu = min(PREFERRED_XID_GPU, len(inventory.gpus) - 1)
        demo = _Demo(profile, node, inventory, say, results, xid_gpu=xid_gpu)
        await demo.start()
        # once the plugin is up: its start-up overlaps the waits of the next acts
        dra_node.start_driver(*SHARES_FLAGS)
        start_mig_driver(dynamic_mig_node)
        await demo.allocate()
        await demo.xid()
        await demo.kubelet_restart()
        await demo.recovery()
        await demo.clean_exit()
        await usage_act(use_node, inventory, say, results)
        await dra_act(dra_node, say, results)
        await mig_act(dynamic_mig_node, say, results)
    say.say(
        Text("work dir removed. Try: kubegpu kubelet-sim --help, kubegpu fake-nvml profiles", style="dim")
    )
    return results


async def _without_gpus(profile: str, say: Narrator, why: str) -> dict[str, Any]:
    """A node without a working driver: what the plugin does there, with and without failOnInitError."""
    results: dict[str, Any] = {"profile": profile, "gpus": 0, "why": why}
    say.say(
        Text.assemble(
            ("kubegpu demo: ", "bold"),
            f"a simulated {profile} node: {why}. What the plugin does without a working driver:",
        )
    )
    async with SimulatedNode(profile, env=DEMO_HEALTH_ENV) as node:
        say.section("Start the plugin (failOnInitError=true, NVIDIA's default)")
        say.command(f"KUBEGPU_FAKE_NVML={profile} kubegpu plugin --kubelet-socket {node.kubelet_socket}")
        node.start_plugin()
        code = await node.wait_plugin_exit()
        error = next((line for line in node.plugin_log().splitlines() if " ERROR " in line), "")
        results["exit_code"] = code
        results["error"] = error.split(" ERROR ", 1)[-1]
        say.say(f"the plugin exits with code {code} and says why; the DaemonSet restarts it (CrashLoop)")
        say.say(Text(error, style="red"))
        node.plugin = None
        say.section("The same with failOnInitError=false: the plugin stays up and waits")
        say.command(f"kubegpu plugin --fail-on-init-error=false --kubelet-socket {node.kubelet_socket}")
        node.start_plugin("--fail-on-init-error=false")
        await node.wait_log("No devices found. Waiting indefinitely.")
        results["capacity_without_driver"] = node.sim.capacity()
        say.say(
            "it logs 'No devices found. Waiting indefinitely.', registers nothing and retries discovery; "
            f"the node's capacity stays {results['capacity_without_driver'] or 'empty'}"
        )
        say.section("Clean exit")
        results["exit_code_waiting"] = await node.stop_plugin(signal.SIGTERM)
        say.say(f"plugin exited with code {results['exit_code_waiting']}")
    return results


@dataclass
class _Demo:
    """The demo's steps, in order; each narrates itself and records what it measured in `results`."""

    profile: str
    node: SimulatedNode
    inventory: Inventory
    say: Narrator
    results: dict[str, Any]
    holders: dict[str, str] = field(default_factory=dict)  # device ID -> pod/container holding it
    xid_seen: SimEvent | None = None  # when the kubelet saw the XID GPU turn Unhealthy
    restart_mark: int = 0  # the simulator's event sequence number just before the kubelet restart
    xid_gpu: int = PREFERRED_XID_GPU  # the position in the inventory of the GPU that gets the XID

    async def start(self) -> None:
        node, say, results = self.node, self.say, self.results
        say.section("Start the kubelet and the device plugin")
        say.command(f"kubegpu kubelet-sim --dir {node.plugin_dir}")
        say.command(f"KUBEGPU_FAKE_NVML={self.profile} kubegpu plugin --kubelet-socket {node.kubelet_socket}")
        started = time.monotonic()
        node.start_plugin()
        await node.wait_allocatable(len(self.inventory.gpus))
        registered = node.sim.events(EventKind.REGISTERED, resource=GPU_RESOURCE)[-1]
        results["cold_start_ms"] = round((registered.time - started) * 1e3, 1)
        results["cold_start_to_devices_ms"] = round((time.monotonic() - started) * 1e3, 1)
        say.say(
            f"plugin pid {node.plugin.pid if node.plugin else '?'} registered {GPU_RESOURCE} "
            f"{results['cold_start_ms']:.0f} ms after its process started (Python start-up included)"
        )
        say.say(_node_table(node))

    async def allocate(self) -> None:
        node, say, inventory = self.node, self.say, self.inventory
        count = min(2, len(inventory.gpus))
        say.section(f"A pod asks for {count} GPU{'s' if count > 1 else ''}")
        say.say(f"pod train, container main: resources.limits: {{nvidia.com/gpu: {count}}}")
        allocation = await node.sim.admit(Pod("train", containers=[Container("main", {GPU_RESOURCE: count})]))
        main = allocation.containers["main"]
        chosen = list(main.devices[GPU_RESOURCE])
        preferred = node.sim.rpc_calls("GetPreferredAllocation")[-1]
        asked, answered = preferred.request, preferred.response
        if not isinstance(asked, api_pb2.PreferredAllocationRequest) or not isinstance(
            answered, api_pb2.PreferredAllocationResponse
        ):
            raise RuntimeError(f"the kubelet recorded no answered GetPreferredAllocation: {preferred}")
        request = asked.container_requests[0]
        answer = [inventory.gpu_by_uuid(u) for u in answered.container_responses[0].deviceIDs]
        say.say(
            f"kubelet -> plugin GetPreferredAllocation({len(request.available_deviceIDs)} available, size "
            f"{request.allocation_size}) -> " + ", ".join(f"GPU {g.index}" for g in answer if g is not None)
        )
        if len(chosen) > 1:
            say.say(_link_text(inventory, chosen[0], chosen[1]))
        envs = main.run_options.envs if main.run_options else {}
        say.say(
            Text.assemble(
                "container env: ",
                ("NVIDIA_VISIBLE_DEVICES", "bold"),
                "=",
                envs.get("NVIDIA_VISIBLE_DEVICES", ""),
            )
        )
        self.results["allocated"] = chosen
        self.results["visible_devices"] = envs.get("NVIDIA_VISIBLE_DEVICES")
        self.holders = {uuid: "train/main" for uuid in chosen}

    async def xid(self) -> None:
        node, say, results = self.node, self.say, self.results
        gpu = self.inventory.gpus[self.xid_gpu].index
        say.section(f"GPU {gpu} reports XID 79: it has fallen off the bus")
        say.command(f"kubegpu fake-nvml inject --gpu {gpu} --xid 79")
        mark = node.sim.last_seq
        injected = time.monotonic()
        StateDir(node.state_dir).inject_xid(gpu, 79)
        bad = self._xid_uuid
        self.xid_seen = seen = await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED,
            resource=GPU_RESOURCE,
            after=mark,
            where=lambda e: bad in e.data["unhealthy"],
            timeout=10,
        )
        results["xid_to_unhealthy_ms"] = round((seen.time - injected) * 1e3, 1)
        say.say(
            f"the kubelet saw GPU {gpu} Unhealthy {results['xid_to_unhealthy_ms']} ms after the XID; "
            f"allocatable drops to {node.sim.allocatable()[GPU_RESOURCE]}"
        )
        say.say(_node_table(node))
        results["allocatable_after_xid"] = node.sim.allocatable()[GPU_RESOURCE]

    async def kubelet_restart(self) -> None:
        node, say, results = self.node, self.say, self.results
        say.section("The kubelet restarts and wipes the device-plugin directory")
        say.command("systemctl restart kubelet")
        self.restart_mark = mark = node.sim.last_seq
        restarted = time.monotonic()
        await node.sim.restart()
        await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=mark, timeout=10
        )
        back = node.sim.events(EventKind.DEVICES_UPDATED, resource=GPU_RESOURCE, after=mark)[0]
        results["kubelet_restart_to_registered_ms"] = round((back.time - restarted) * 1e3, 1)
        results["allocatable_after_restart"] = node.sim.allocatable()[GPU_RESOURCE]
        say.say(
            f"plugin noticed (inotify), served a fresh socket and registered again: devices listed "
            f"{results['kubelet_restart_to_registered_ms']} ms after the restart, GPU {self._xid_index} "
            f"still Unhealthy (allocatable {results['allocatable_after_restart']})"
        )

    async def recovery(self) -> None:
        node, say, results = self.node, self.say, self.results
        assert self.xid_seen is not None
        say.section(f"GPU {self._xid_index} recovers by itself")
        quiet = DEMO_HEALTH_ENV["KUBEGPU_RECOVERY_QUIET_SECONDS"]
        say.say(
            f"XID 79 calls for a GPU reset, so the plugin probes the GPU once no critical XID has arrived "
            f"for {quiet} s (60 s by default): handle and memory readable, no pending page retirement "
            "or row remap"
        )
        bad = self._xid_uuid
        recovered = await node.sim.wait_for_event(
            EventKind.DEVICES_UPDATED,
            resource=GPU_RESOURCE,
            after=self.restart_mark,
            where=lambda e: bad not in e.data["unhealthy"],
            timeout=15,
        )
        results["recovered_after_s"] = round(recovered.time - self.xid_seen.time, 2)
        results["allocatable_after_recovery"] = node.sim.allocatable()[GPU_RESOURCE]
        say.say(
            f"GPU {self._xid_index} is Healthy again {results['recovered_after_s']} s after the XID: "
            f"allocatable {results['allocatable_after_recovery']}. NVIDIA's plugin keeps it out until "
            "someone restarts the plugin."
        )
        say.say(_gpu_table(node, self.inventory, self.holders))

    async def clean_exit(self) -> None:
        node, say, results = self.node, self.say, self.results
        say.section("Clean exit")
        pid = node.plugin.pid if node.plugin else 0
        say.command(f"kill -TERM {pid}")
        code = await node.stop_plugin(signal.SIGTERM)
        results["exit_code"] = code
        results["sockets_left"] = node.plugin_sockets()
        say.say(
            f"plugin exited with code {code}; plugin sockets left: {results['sockets_left'] or 'none'}; "
            "the kubelet marks the resource unavailable"
        )

    @property
    def _xid_uuid(self) -> str:
        return self.inventory.gpus[self.xid_gpu].uuid

    @property
    def _xid_index(self) -> int:
        return self.inventory.gpus[self.xid_gpu].index


@click.command("demo")
@click.option(
    "--profile",
    default="dgx-a100",
    show_default=True,
    help="Fake node profile (see `kubegpu fake-nvml profiles`).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the measured results as JSON.")
def demo_cmd(profile: str, as_json: bool) -> None:
    """Show the plugin on a simulated GPU node: registration, an allocation, an XID, a kubelet restart.

    Needs no GPU and no cluster and takes a few seconds. The plugin runs as its own process on the fake
    NVML and talks to the kubelet simulator over unix sockets in a temp dir, which is removed afterwards.
    Then the DRA driver: a claim prepared, one GPU shared by memory, and (on a second node, profile
    mig-dynamic) a 1g MIG partition made on demand and destroyed with its claim.
    """
    console = output.console()
    try:
        load_nvml(NvmlSelection.fake(profile))
    except ValueError as err:  # an unknown profile, or a profile file that cannot be used
        raise click.BadParameter(str(err), param_hint="--profile") from None
    results = asyncio.run(run_demo(profile, console, quiet=as_json))
    if as_json:
        click.echo(json.dumps(results, indent=2))
