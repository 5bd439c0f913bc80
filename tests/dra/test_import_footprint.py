"""What `kubegpu dra`'s process imports for metrics: prometheus-client only with --http-endpoint, as the
device plugin (tests/plugin/test_import_footprint.py). A behaviour test of a fresh interpreter's modules."""

from __future__ import annotations

import json
import subprocess
import sys

# The driver's path as `kubegpu dra` walks it: the command, its settings, the daemon and its servers, the
# metrics sink chosen without an endpoint.
DRIVER_PATH = """
import json, sys
import click
from kubegpu.cli.main import main
command = main.get_command(click.Context(main), "dra")
assert command is not None and command.name == "dra"
from kubegpu.dra.daemon import DraDaemon
from kubegpu.dra.events import NoMetrics
from kubegpu.dra.metrics_server import parse_endpoint
parse_endpoint(":8080")
print(json.dumps(sorted(sys.modules)))
"""


def test_the_driver_without_an_endpoint_does_not_import_prometheus_client() -> None:
    out = subprocess.run([sys.executable, "-c", DRIVER_PATH], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout.splitlines()[-1])
    assert [m for m in modules if m.split(".")[0] == "prometheus_client" or m == "kubegpu.dra.metrics"] == []
    assert "kubegpu.dra.daemon" in modules
