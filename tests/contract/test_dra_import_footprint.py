"""What `kubegpu dra`'s process imports: never the official `kubernetes` client (its models cost the driver
about 25 MB of resident memory), nor urllib3, nor the test and tool stack. The light client speaks HTTP
through the standard library's `http.client` (which brings the `email` package, 1.7 MB: within the
driver's memory budget).

A behaviour test on the real process: the driver runs with Python's import log on (PYTHONPROFILEIMPORTTIME)
through registration, publication, and the Prepare and Unprepare of a claim, so every import of the paths
it walks (the CLI, the kubeconfig, the claim reader, the publisher and its watch) is in its log. The
resident memory is measured in bench/dra_bench.py.
"""

from __future__ import annotations

import re

from kubegpu.demo.dranode import DRIVER, claim_pod
from kubegpu.demo.dranode import SimulatedDraNode as DraNode
from tests.dra_objects import claim, request

NEVER_IN_THE_DRIVER = (
    "kubernetes",
    "urllib3",
    "pydantic",
    "rich",
    "kubegpu.apisim",
    "kubegpu.kubeletsim",
    "kubegpu.toolkit",
    "kubegpu.demo",
)


def imported_modules(log: str) -> set[str]:
    # "import time:       123 |        456 |   package.module" (indented by nesting)
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$", log, re.M)}


async def test_the_driver_never_imports_the_kubernetes_client() -> None:
    async with DraNode("t4-pcie", env={"PYTHONPROFILEIMPORTTIME": "1"}) as node:
        node.start_driver()
        await node.wait_registered()  # the kubelet prepares only through a registered driver
        await node.wait_published(4)  # the T4 node's four GPUs
        assert node.sim is not None
        pod = claim_pod("train", "c1")
        c1 = node.allocate(claim("c1", [request("gpu")]), pod)
        allocation = await node.sim.admit(pod)
        uid = c1["metadata"]["uid"]
        assert allocation.containers["main"].run_options is not None
        (cdi_id,) = allocation.containers["main"].run_options.cdi_devices
        assert cdi_id.startswith(f"k8s.{DRIVER}/claim={uid}-gpu-")
        await node.sim.terminate_pod("train")
        assert await node.stop_driver() == 0
        modules = imported_modules(node.log())
    assert {"kubegpu.dra.claims", "kubegpu.dra.publisher", "http.client"} <= modules  # the log is complete
    held = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER_IN_THE_DRIVER))
    assert held == []
