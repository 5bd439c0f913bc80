"""The flags of issue 4 (CDI, GDS/MOFED/GDRCopy, IMEX, shared allocation policy): precedence, NVIDIA's
startup texts, and the Allocate options the daemon derives from them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubegpu.allocation.allocate import allocate_container
from kubegpu.allocation.from_settings import allocate_options
from kubegpu.allocation.resources import build_resources
from kubegpu.node.driverfiles import ImexChannelError
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import resolve
from tests.builders import gpu_uuid, make_inventory
from tests.settings.test_plugin_settings import defaults, write


def test_defaults_are_nvidias() -> None:
    settings = resolve(defaults())
    plugin = settings.plugin
    assert plugin.cdiAnnotationPrefix == "cdi.k8s.io/"
    assert plugin.nvidiaCTKPath == "/usr/bin/nvidia-ctk"
    assert plugin.containerDriverRoot == "/driver-root"
    assert plugin.sharedDevicesAllocationPolicy == "distributed"
    assert (settings.flags.gdsEnabled, settings.flags.mofedEnabled, settings.flags.gdrcopyEnabled) == (
        False,
        False,
        False,
    )
    assert settings.config.imex is None  # IMEX flags never write their defaults into the config


@pytest.mark.parametrize(
    "strategies",
    [["cdi-annotations"], ["cdi-cri"], ["envvar", "cdi-annotations", "cdi-cri", "volume-mounts"]],
)
def test_cdi_strategies_are_accepted(strategies: list[str]) -> None:
    assert resolve(defaults(device_list_strategy=strategies)).device_list_strategies == tuple(strategies)


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (
            {"device_list_strategy": ["envvar", "cdi"]},
            "unable to validate flags: invalid --device-list-strategy option: invalid strategy: cdi",
        ),
        (
            {"shared_devices_allocation_policy": "spread"},
            "unable to validate flags: invalid --shared-devices-allocation-policy option: spread",
        ),
        (
            {"imex_channel_ids": ["1", "2"]},
            "unable to validate flags: invalid IMEX channel IDs: invalid IMEX config: "
            "channelIDs must be [] or [0]; found [1 2]",
        ),
    ],
)
def test_startup_validation_texts(flags: dict[str, object], text: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(defaults(**flags))
    assert str(err.value) == text


def test_non_integer_channel_id_is_explained() -> None:
    with pytest.raises(
        ConfigError, match="invalid --imex-channel-ids option: zero: channel IDs are integers"
    ):
        resolve(defaults(imex_channel_ids=["zero"]))


def test_file_values_stand_unless_a_flag_is_given(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "version: v1\nflags:\n  gdsEnabled: true\n  plugin:\n    cdiAnnotationPrefix: custom.io/\n"
        "imex:\n  channelIDs: [0]\n  required: true\n",
    )
    settings = resolve(defaults(config_file=path))
    assert settings.flags.gdsEnabled and settings.plugin.cdiAnnotationPrefix == "custom.io/"
    assert settings.config.imex is not None and settings.config.imex.channelIDs == [0]
    assert settings.config.imex.required
    given = resolve(defaults(config_file=path, imex_channel_ids=[], imex_required=False, gds_enabled=False))
    assert given.config.imex is not None and given.config.imex.channelIDs == []
    assert not given.config.imex.required and not given.flags.gdsEnabled


def test_allocate_options_follow_the_settings(tmp_path: Path) -> None:
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    # A character device (what the IMEX driver creates); a symlink to one counts, as os.Stat follows it.
    (tmp_path / "dev/nvidia-caps-imex-channels/channel0").symlink_to("/dev/null")
    (tmp_path / "dev/gdrdrv").write_text("")
    settings = resolve(
        defaults(
            driver_root=str(tmp_path),
            driver_root_ctr_path=str(tmp_path / "not-mounted"),
            device_list_strategy=["cdi-annotations"],
            cdi_annotation_prefix="nvidia.cdi.k8s.io/",
            gdrcopy_enabled=True,
            gds_enabled=True,
            imex_channel_ids=["0"],
            shared_devices_allocation_policy="packed",
        )
    )
    options = allocate_options(settings)
    assert options.cdi_annotation_prefix == "nvidia.cdi.k8s.io/"
    assert options.enabled_modes == ("gdrcopy", "gds") and options.cdi_modes == ("gdrcopy",)
    assert options.imex_channels == ("0",) and options.shared_allocation_policy == "packed"


def test_missing_imex_channel_is_skipped_or_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    skipped = resolve(defaults(driver_root=str(tmp_path), imex_channel_ids=["0"]))
    assert allocate_options(skipped).imex_channels == ()
    assert "Ignoring requested IMEX channel channel0" in caplog.text
    required = resolve(defaults(driver_root=str(tmp_path), imex_channel_ids=["0"], imex_required=True))
    with pytest.raises(ImexChannelError, match=r"^requested IMEX channel channel0 does not exist"):
        allocate_options(required)


@pytest.mark.parametrize("make", [lambda p: p.write_text(""), lambda p: p.mkdir()], ids=["file", "directory"])
def test_an_imex_channel_that_is_not_a_character_device_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make: Callable[[Path], object]
) -> None:
    """NVIDIA injects only a character device: a regular file named channel0 is no channel."""
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    path = tmp_path / "dev/nvidia-caps-imex-channels/channel0"
    make(path)
    skipped = resolve(defaults(driver_root=str(tmp_path), imex_channel_ids=["0"]))
    options = allocate_options(skipped)
    assert options.imex_channels == ()
    assert f"Ignoring requested IMEX channel channel0 (does not exist: {path} is not a character device)" in (
        caplog.text
    )
    container = allocate_container(build_resources(make_inventory(1))[0], [gpu_uuid(0)], options)
    assert "NVIDIA_IMEX_CHANNELS" not in container.envs
    required = resolve(defaults(driver_root=str(tmp_path), imex_channel_ids=["0"], imex_required=True))
    with pytest.raises(ImexChannelError) as err:
        allocate_options(required)
    assert str(err.value).startswith("requested IMEX channel channel0 does not exist (")
