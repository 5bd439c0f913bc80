"""What the daemon's process imports: nothing of pydantic, the fake NVML, the simulators, rich or the
kubernetes client on a real node, and prometheus-client only when /metrics is served.

A behaviour test (which modules a fresh interpreter holds), not a timing or memory test: the resident
memory these imports cost is measured in bench/rss.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The daemon's path as `kubegpu plugin` walks it: the CLI group, the lazily imported command, the settings
# (flags, env vars, a config file), the NVML backend, the XID catalog, and the daemon with its servers.
DAEMON_PATH = """
import json, sys
import click
from kubegpu.cli.main import main
command = main.get_command(click.Context(main), "plugin")
assert command is not None and command.name == "plugin"
from kubegpu.settings.given import read_given
from kubegpu.settings.plugin import resolve
from kubegpu.settings.setting import PLUGIN
from kubegpu.settings.table import for_command
settings = resolve(read_given(for_command(PLUGIN)))
from kubegpu.plugin.daemon import Daemon
daemon = Daemon(settings, reload_settings=lambda: settings)
print(json.dumps({"modules": sorted(sys.modules), "nvml": daemon.nvml.__name__ if not
                  daemon._backend.is_fake else "fake", "metrics": type(daemon.metrics).__name__}))
"""

NEVER_ON_A_NODE = (
    "pydantic",
    "pydantic_core",
    "rich",
    "kubernetes",
    "kubegpu.node.nvml.fake",
    "kubegpu.node.nvml.fake_profile",
    "kubegpu.kubeletsim",
    "kubegpu.apisim",
    "kubegpu.demo",
    "kubegpu.toolkit",
    "importlib.metadata",
)


def imported(tmp_path: object, *, config_file: bool = True, **env: str) -> dict[str, object]:
    config = os.path.join(str(tmp_path), "config.yaml")
    with open(config, "w") as f:
        f.write(
            "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, replicas: 2}\n"
        )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "NVIDIA_"))}
    environ.update({"KUBEGPU_POD_RESOURCES_SOCKET": "", **env})
    if config_file:
        environ["CONFIG_FILE"] = config
    out = subprocess.run(
        [sys.executable, "-c", DAEMON_PATH], env=environ, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def held(modules: object, names: tuple[str, ...]) -> list[str]:
    assert isinstance(modules, list)
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


def test_the_real_nvml_path_imports_none_of_the_test_and_tool_stack(tmp_path: object) -> None:
    result = imported(tmp_path)
    assert (result["nvml"], result["metrics"]) == ("pynvml", "NoMetrics")
    assert held(result["modules"], NEVER_ON_A_NODE) == []
    assert held(result["modules"], ("prometheus_client", "msgspec", "kubegpu.plugin.metrics")) == []
    assert held(result["modules"], ("yaml", "kubegpu.settings.goyaml")) == ["yaml", "kubegpu.settings.goyaml"]


def test_without_a_config_file_no_yaml_reader_is_loaded(tmp_path: object) -> None:
    # The built-in XID catalog is read without one; only a config or XID actions file needs YAML.
    result = imported(tmp_path, config_file=False)
    assert held(result["modules"], ("yaml", "kubegpu.settings.goyaml", *NEVER_ON_A_NODE)) == []


def test_prometheus_client_comes_with_the_http_endpoint(tmp_path: object) -> None:
    result = imported(tmp_path, KUBEGPU_HTTP_PORT="9400")
    assert result["metrics"] == "PluginMetrics"
    assert held(result["modules"], ("prometheus_client",)) == ["prometheus_client"]
    assert held(result["modules"], NEVER_ON_A_NODE) == []


@pytest.mark.parametrize("profile", ["dgx-a100"])
def test_a_fake_profile_loads_the_fake_and_still_no_pydantic(tmp_path: object, profile: str) -> None:
    result = imported(tmp_path, KUBEGPU_FAKE_NVML=profile)
    assert result["nvml"] == "fake"
    fake_only = ("kubegpu.node.nvml.fake", "kubegpu.node.nvml.fake_profile")
    assert held(result["modules"], NEVER_ON_A_NODE) == list(fake_only)
