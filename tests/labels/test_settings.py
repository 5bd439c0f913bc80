"""`kubegpu labels` settings: GFD's flags and env vars, the config file, and their precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.labels.settings import LabelSettings, given_flags, resolve_settings
from kubegpu.settings.choices import DEFAULT_GFD_OUTPUT_FILE as DEFAULT_OUTPUT_FILE
from kubegpu.settings.choices import DEFAULT_MACHINE_TYPE_FILE
from kubegpu.settings.goduration import INFINITE
from kubegpu.settings.nvidia_config import ConfigError

S = 1_000_000_000


def settings(cli: dict[str, str] | None = None, env: dict[str, str] | None = None) -> LabelSettings:
    return resolve_settings(given_flags(cli or {}, env or {}))


def test_defaults_are_gfds() -> None:
    s = settings()
    assert (s.mig_strategy, s.fail_on_init_error, s.oneshot, s.no_timestamp) == ("none", True, False, False)
    assert s.sleep_interval == 60 * S
    assert s.output_file == DEFAULT_OUTPUT_FILE == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert s.machine_type_file == DEFAULT_MACHINE_TYPE_FILE == "/sys/class/dmi/id/product_name"
    assert s.removes_output_on_exit


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({"GFD_MIG_STRATEGY": "mixed"}, "mig_strategy", "mixed"),
        ({"MIG_STRATEGY": "single"}, "mig_strategy", "single"),
        ({"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single"}, "mig_strategy", "mixed"),  # first wins
        ({"GFD_FAIL_ON_INIT_ERROR": "false"}, "fail_on_init_error", False),
        ({"FAIL_ON_INIT_ERROR": "0"}, "fail_on_init_error", False),
        ({"GFD_ONESHOT": "true"}, "oneshot", True),
        ({"GFD_ONESHOT": ""}, "oneshot", False),  # urfave/cli: an empty bool env var is false
        ({"GFD_NO_TIMESTAMP": "T"}, "no_timestamp", True),
        ({"GFD_SLEEP_INTERVAL": "1m30s"}, "sleep_interval", 90 * S),
        ({"GFD_SLEEP_INTERVAL": "infinite"}, "sleep_interval", INFINITE),
        ({"GFD_SLEEP_INTERVAL": ""}, "sleep_interval", 60 * S),  # ignored when empty
        ({"GFD_OUTPUT_FILE": ""}, "output_file", ""),  # empty means stdout, unlike click's envvar handling
        ({"GFD_OUTPUT_FILE": "-"}, "output_file", ""),
        ({"GFD_OUTPUT_FILE": "/x/gfd"}, "output_file", "/x/gfd"),
        ({"GFD_MACHINE_TYPE_FILE": "/m"}, "machine_type_file", "/m"),
    ],
)
def test_env_vars(env: dict[str, str], field: str, value: object) -> None:
    assert getattr(settings(env=env), field) == value


@pytest.mark.parametrize(
    ("cli", "field", "value"),
    [
        ({"oneshot": "true"}, "oneshot", True),
        ({"sleep-interval": "500ms"}, "sleep_interval", S // 2),
        ({"output-file": "-"}, "output_file", ""),
        ({"output-file": ""}, "output_file", ""),
    ],
)
def test_cli_values(cli: dict[str, str], field: str, value: object) -> None:
    assert getattr(settings(cli=cli), field) == value


def test_cli_beats_env() -> None:
    s = settings(
        cli={"mig-strategy": "single", "oneshot": "false"}, env={"MIG_STRATEGY": "mixed", "GFD_ONESHOT": "1"}
    )
    assert (s.mig_strategy, s.oneshot) == ("single", False)


CONFIG = """
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  gfd:
    oneshot: true
    noTimestamp: true
    sleepInterval: 10s
    outputFile: /from/file
    machineTypeFile: /from/file/product_name
"""


def test_config_file_fills_what_flags_and_env_leave_unset(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    s = settings(
        env={"CONFIG_FILE": str(path), "GFD_OUTPUT_FILE": "/from/env"}, cli={"no-timestamp": "false"}
    )
    assert s.config_file == str(path)
    assert s.output_file == "/from/env"  # env beats file
    assert s.no_timestamp is False  # CLI beats file
    assert (s.mig_strategy, s.fail_on_init_error, s.oneshot) == ("mixed", False, True)
    assert s.sleep_interval == 10 * S
    assert s.machine_type_file == "/from/file/product_name"


def test_gfd_config_file_env_var_comes_first(tmp_path: Path) -> None:
    gfd, plugin = tmp_path / "gfd.yaml", tmp_path / "plugin.yaml"
    gfd.write_text("flags: {migStrategy: single}\n")
    plugin.write_text("flags: {migStrategy: mixed}\n")
    assert settings(env={"GFD_CONFIG_FILE": str(gfd), "CONFIG_FILE": str(plugin)}).mig_strategy == "single"


@pytest.mark.parametrize(
    ("raw", "nanoseconds"),
    [("30", 30), ("1.5e+9", 1_500_000_000), ('"2m"', 120 * S), ("infinite", INFINITE)],
)
def test_config_sleep_interval(tmp_path: Path, raw: str, nanoseconds: int) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"flags:\n  gfd:\n    sleepInterval: {raw}\n")
    assert settings(cli={"config-file": str(path)}).sleep_interval == nanoseconds


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("true", "invalid duration"),
        # sigs.k8s.io/yaml turns the document into JSON before NVIDIA's Duration sees it: that fails first.
        (".inf", r"json: unsupported value: \+Inf"),
        ('"60"', "missing unit"),
        ("-5s", "is not positive"),
        ("0", "is not positive"),
    ],
)
def test_config_sleep_interval_errors(tmp_path: Path, raw: str, error: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"flags:\n  gfd:\n    sleepInterval: {raw}\n")
    with pytest.raises(ConfigError, match=error):
        settings(cli={"config-file": str(path)})


def test_sharing_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "sharing:\n  mps:\n    renameByDefault: true\n    resources:\n    - {name: gpu, replicas: 4}\n"
    )
    s = settings(cli={"config-file": str(path)})
    assert s.sharing.strategy == "mps"
    r = s.sharing.replication("nvidia.com/gpu")
    assert r is not None and (r.replicas, r.renamed) == (4, True)


def test_invalid_sharing_is_nvidias_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 1}\n")
    with pytest.raises(ConfigError, match="number of replicas must be >= 2"):
        settings(cli={"config-file": str(path)})


@pytest.mark.parametrize(
    ("cli", "env", "error"),
    [
        (
            {"oneshot": "maybe"},
            {},
            "could not parse 'maybe' as bool value from the command line for flag oneshot",
        ),
        ({}, {"GFD_ONESHOT": "yes"}, "from environment variable 'GFD_ONESHOT' for flag oneshot"),
        ({"sleep-interval": "60"}, {}, 'time: missing unit in duration "60"'),
        ({}, {"GFD_SLEEP_INTERVAL": "1x"}, 'time: unknown unit "x" in duration "1x"'),
    ],
)
def test_unparseable_values(cli: dict[str, str], env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        given_flags(cli, env)


@pytest.mark.parametrize(
    ("cli", "error"),
    [
        ({"mig-strategy": "both"}, "unknown MIG strategy: both"),
        ({"sleep-interval": "-1s"}, "--sleep-interval -1s is not positive"),
        ({"sleep-interval": "0"}, "--sleep-interval 0s is not positive"),
        (
            {"use-node-feature-api": "true"},
            "publishing labels through NFD's NodeFeature API .* not available in kubegpu yet",
        ),
    ],
)
def test_validation(cli: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=f"unable to validate flags: {error}"):
        settings(cli=cli)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match=r"unable to read config file /nonexistent/c\.yaml"):
        settings(cli={"config-file": "/nonexistent/c.yaml"})


@pytest.mark.parametrize(
    ("cli", "removes"),
    [
        ({}, True),
        ({"oneshot": "true"}, False),
        ({"sleep-interval": "infinite"}, False),
        ({"output-file": "-"}, False),
    ],
)
def test_when_the_file_is_removed_on_exit(cli: dict[str, str], removes: bool) -> None:
    assert settings(cli=cli).removes_output_on_exit is removes


def test_describe_is_json_with_go_durations() -> None:
    assert '"sleepInterval": "1m30s"' in settings(cli={"sleep-interval": "90s"}).describe()
