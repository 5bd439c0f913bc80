"""`kubegpu kubelet-sim`: run the kubelet simulator on its own, to try a device plugin without a node."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import click

from kubegpu.common import output
from kubegpu.common.click_types import FiniteFloatRange

from .devicesets import ENDPOINT_STOP_GRACE_PERIOD
from .dra import KUBELET_VERSIONS, DraSettings
from .events import SimEvent
from .narrator import Narrator
from .simulator import KubeletSimulator

# Not the kubelet's /var/lib/kubelet/device-plugins: starting there would wipe a real kubelet's sockets.
DEFAULT_DIR = Path("/tmp/kubegpu/device-plugins")


def _print_json(event: SimEvent) -> None:
    print(json.dumps(event.to_json()), flush=True)


async def _serve(plugin_dir: Path, as_json: bool, grace_period: float, dra: DraSettings | None) -> None:
    console = output.console()
    sim = KubeletSimulator(
        plugin_dir,
        on_event=_print_json if as_json else Narrator(console, node_tables=True),
        stop_grace_period=grace_period,
        dra=dra,
    )
    # Handlers first: a signal that arrives right after the "started" event must not kill the process.
    commands: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    handled = {signal.SIGINT: "stop", signal.SIGTERM: "stop", signal.SIGHUP: "restart"}
    for sig, command in handled.items():
        loop.add_signal_handler(sig, commands.put_nowait, command)
    try:
        try:
            await sim.start()
        except (RuntimeError, ValueError, OSError) as err:
            raise click.ClickException(str(err)) from None
        if not as_json:
            pod_resources = (
                f"PodResources API on {sim.pod_resources_socket}. " if sim.pod_resources_socket else ""
            )
            dra_hint = (
                f"DRA drivers register in {sim.dra.registry_dir} (kubelet {sim.dra.settings.kubelet_version}"
                + (
                    f", claims from {sim.dra.settings.api_url}"
                    if sim.dra.settings.api_url
                    else ", no API server"
                )
                + "). "
                if sim.dra is not None
                else ""
            )
            console.print(
                f"Point the plugin at --kubelet-socket {sim.socket_path}. {pod_resources}{dra_hint}"
                "SIGHUP restarts the kubelet, Ctrl-C or SIGTERM stops it.",
                style="dim",
            )
        while await commands.get() == "restart":
            await sim.restart()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await sim.stop()


@click.command("kubelet-sim")
@click.option(
    "--dir",
    "plugin_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Device-plugin directory to serve kubelet.sock in. Like the kubelet, the simulator deletes every "
    "file in it except sub-directories and kubelet_internal_checkpoint when it starts.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per event instead of text.")
@click.option(
    "--grace-period",
    type=FiniteFloatRange(min=0),
    default=ENDPOINT_STOP_GRACE_PERIOD,
    show_default=True,
    help="Seconds a resource whose plugin went away keeps its capacity before it drops to 0.",
)
@click.option(
    "--dra",
    "dra_api",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[API_SERVER_URL]",
    help="Also be the kubelet's DRA side: watch DIR/../plugins_registry for DRA drivers, read their claims "
    "from the API server at this URL (none given: no claims, no ResourceSlice wiping).",
)
@click.option(
    "--node-name",
    default="node-a",
    show_default=True,
    help="With --dra: the node whose ResourceSlices the kubelet deletes when it starts.",
)
@click.option(
    "--kubelet-version",
    type=click.Choice(KUBELET_VERSIONS),
    default="1.34",
    show_default=True,
    help="With --dra: behave as this kubelet (service choice, claim API version, slice wiping; 1.36 reads "
    "the drivers' device-health streams).",
)
def kubelet_sim(
    plugin_dir: Path,
    as_json: bool,
    grace_period: float,
    dra_api: str | None,
    node_name: str,
    kubelet_version: str,
) -> None:
    """Run a simulated kubelet that device plugins can register with.

    It serves the Device Plugin API v1beta1 on DIR/kubelet.sock with the real kubelet's rules (version and
    resource-name checks, dial-back, ListAndWatch, checkpoint) and prints every event: registrations,
    device list updates with capacity and allocatable, streams that end.

    \b
    Signals:
      SIGHUP          simulate a kubelet restart (plugin sockets are deleted, plugins must re-register)
      SIGINT/SIGTERM  stop
    """
    try:
        dra = (
            None
            if dra_api is None
            else DraSettings(node_name=node_name, api_url=dra_api or None, kubelet_version=kubelet_version)
        )
        asyncio.run(_serve(plugin_dir, as_json, grace_period, dra))
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        sys.exit(130)
