"""The real daemon process and `kubegpu config check` accept and refuse the same config files, with the
same words (the corpus in tests/settings/test_hostile_configs.py checks hundreds of files against the
daemon's start-up path in-process; these run `kubegpu plugin` itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubegpu.configcheck.check import config_group
from kubegpu.demo.simnode import GPU_RESOURCE, SimulatedNode
from tests.settings.hostile_corpus import SHARED, laughs

REFUSED = {
    "replicas-quoted": (SHARED.format("'4'"), ()),
    "replicas-past-the-kubelet-limit": (SHARED.format(100_000), ()),
    "alias-bomb-under-an-unknown-key": (laughs(10, 9, "unknown"), ()),
    "latin1": ("version: v1\n# caf\xe9\n", ()),
    "imex-required-without-a-channel": (
        "version: v1\n",
        ("--imex-channel-ids", "0", "--imex-required", "true"),
    ),
}
ACCEPTED = {
    "replicas-4.0": (SHARED.format("4.0"), 32),
    "replicas-0x10": (SHARED.format("0x10"), 128),
    "failOnInitError-yes": ("version: v1\nflags:\n  failOnInitError: yes\n", 8),
    "alias-reuse": ("r: &r {name: gpu, replicas: 4}\nsharing:\n  timeSlicing:\n    resources: [*r]\n", 32),
}


def config_check(path: Path, *flags: str) -> tuple[int, dict]:
    result = CliRunner().invoke(config_group, ["check", str(path), "--profile", "dgx-a100", "--json", *flags])
    return result.exit_code, json.loads(result.stdout)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_bytes(text.encode("latin-1") if "\xe9" in text else text.encode())
    return path


@pytest.mark.parametrize("name", REFUSED)
async def test_the_daemon_refuses_what_config_check_refuses(tmp_path: Path, name: str) -> None:
    text, flags = REFUSED[name]
    path = write(tmp_path, text)
    code, report = config_check(path, *flags)
    assert code == 1 and report["errors"]
    async with SimulatedNode("dgx-a100") as node:
        node.start_plugin("--config-file", str(path), *flags)
        assert await node.wait_plugin_exit() == 1
        log = node.plugin_log()
    (line,) = [line for line in log.splitlines() if " ERROR " in line]  # one line says why
    for error in report["errors"]:
        assert error in line
    assert "Traceback" not in log


@pytest.mark.parametrize("name", ACCEPTED)
async def test_the_daemon_serves_what_config_check_accepts(tmp_path: Path, name: str) -> None:
    text, devices = ACCEPTED[name]
    path = write(tmp_path, text)
    code, report = config_check(path)
    assert code == 0 and sum(len(ids) for ids in report["resources"].values()) == devices
    async with SimulatedNode("dgx-a100") as node:
        node.start_plugin("--config-file", str(path))
        await node.wait_allocatable(devices, resource=next(iter(report["resources"])))
        assert await node.stop_plugin() == 0
    assert GPU_RESOURCE in report["resources"]


async def test_a_reload_to_replicas_past_the_kubelet_limit_keeps_the_last_good_config(tmp_path: Path) -> None:
    path = write(tmp_path, SHARED.format(4))
    async with SimulatedNode("dgx-a100") as node:
        node.start_plugin("--config-file", str(path))
        await node.wait_allocatable(32)
        path.write_text(SHARED.format(100_000))  # 800,000 devices: 52 MiB in one ListAndWatch message
        await node.wait_log("over the 4 MiB the kubelet reads")  # refused before any device is built
        assert node.sim.allocatable()[GPU_RESOURCE] == 32
        assert node.plugin is not None and node.plugin.poll() is None
        assert await node.stop_plugin() == 0


async def test_the_config_watcher_keeps_watching_after_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\n")
    async with SimulatedNode("dgx-a100") as node:
        node.start_plugin("--config-file", str(path))
        await node.wait_allocatable(8)
        path.write_bytes(bytes(range(256)))  # garbage.bin over the watched file
        await node.wait_log("is not UTF-8 text: byte 0x80 at offset 128")
        path.write_text(SHARED.format(4))  # a valid file afterwards is picked up
        await node.wait_allocatable(32)
        assert "Traceback" not in node.plugin_log()
        assert await node.stop_plugin() == 0
