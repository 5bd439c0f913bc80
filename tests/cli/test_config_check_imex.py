"""`kubegpu config check` says when the plugin would refuse to start for a required IMEX channel."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_config_check import run

REQUIRED = "version: v1\nimex:\n  channelIDs: [0]\n  required: true\n"


def test_a_required_channel_that_is_missing_or_a_regular_file_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(REQUIRED)
    channels = tmp_path / "root/dev/nvidia-caps-imex-channels"
    channels.mkdir(parents=True)
    args = (str(config), "--profile", "t4-pcie", "--driver-root", str(tmp_path / "root"))
    code, report = run(*args)
    assert code == 1 and report["resources"] == {}
    assert report["errors"] == [
        f"requested IMEX channel channel0 does not exist (no {channels}/channel0); create it (the IMEX "
        "daemon or nvidia-modprobe does) or drop --imex-required"
    ]
    (channels / "channel0").write_text("")  # a file, not the IMEX driver's character device
    code, report = run(*args)
    assert code == 1
    assert report["errors"] == [
        f"requested IMEX channel channel0 does not exist ({channels}/channel0 is not a character device); "
        "create it (the IMEX daemon or nvidia-modprobe does) or drop --imex-required"
    ]
    (channels / "channel0").unlink()
    (channels / "channel0").symlink_to("/dev/null")  # a character device
    code, report = run(*args)
    assert code == 0 and report["errors"] == [] and "nvidia.com/gpu" in report["resources"]


def test_a_missing_required_channel_is_an_error_on_a_node_without_gpus_too(tmp_path: Path) -> None:
    """The daemon finds no GPUs (failOnInitError=false: it stays up), then refuses the missing channel."""
    config = tmp_path / "config.yaml"
    config.write_text(REQUIRED + "flags:\n  failOnInitError: false\n")
    channels = tmp_path / "root/dev/nvidia-caps-imex-channels"
    code, report = run(str(config), "--profile", "no-driver", "--driver-root", str(tmp_path / "root"))
    assert code == 1
    assert report["errors"] == [
        f"requested IMEX channel channel0 does not exist (no {channels}/channel0); create it (the IMEX "
        "daemon or nvidia-modprobe does) or drop --imex-required"
    ]
