"""`kubegpu labels` settings: GFD's flags and env vars, the config file, and their precedence."""

from __future__ import annotations

import re
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
    assert s.use_node_feature_api is True  # GFD's default since v0.19
    assert s.device_discovery_strategy == "auto"
    assert s.driver_root_ctr_path == "/driver-root"
    assert (s.api.namespace, s.api.node_name, s.api.pod_name, s.api.kubeconfig) == ("default", "", "", "")
    assert (s.api.qps, s.api.burst) == (5.0, 10)
    assert not s.removes_output_on_exit  # the NodeFeature object stays, as GFD leaves it
    assert s.warnings == ()


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
            'invalid boolean value "maybe" for -oneshot: parse error',
        ),
        (
            {},
            {"GFD_ONESHOT": "yes"},
            'could not parse "yes" as bool value from environment variable "GFD_ONESHOT" for flag oneshot: '
            'strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        (
            {"sleep-interval": "10"},
            {},
            'invalid value "10" for flag -sleep-interval: time: missing unit in duration "10"',
        ),
        (
            {},
            {"GFD_SLEEP_INTERVAL": "1x"},
            'could not parse "1x" from environment variable "GFD_SLEEP_INTERVAL" as value for flag '
            'sleep-interval: time: unknown unit "x" in duration "1x"',
        ),
    ],
)
def test_unparseable_values(cli: dict[str, str], env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        given_flags(cli, env)
    assert str(caught.value) == error


@pytest.mark.parametrize(
    ("cli", "error"),
    [
        ({"mig-strategy": "both"}, "unknown MIG strategy: both"),
        ({"sleep-interval": "-1s"}, "--sleep-interval -1s is not positive"),
        ({"sleep-interval": "0"}, "--sleep-interval 0s is not positive"),
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
    assert settings(cli={"use-node-feature-api": "false", **cli}).removes_output_on_exit is removes


def test_describe_is_json_with_go_durations() -> None:
    assert '"sleepInterval": "1m30s"' in settings(cli={"sleep-interval": "90s"}).describe()


# ----------------------------------------------------------- the NodeFeature API and GFD's other flags


def with_config_file(tmp_path: Path, cli: dict[str, str], flags: str | None) -> dict[str, str]:
    """`cli` plus --config-file naming a v1 config with these flags (YAML), when there are some."""
    if flags is None:
        return cli
    path = tmp_path / "c.yaml"
    path.write_text(f"version: v1\n{flags}\n")
    return {**cli, "config-file": str(path)}


@pytest.mark.parametrize(
    ("cli", "env", "file", "expected"),
    [
        ({}, {}, None, True),  # GFD's default since v0.19
        ({}, {}, "flags: {useNodeFeatureAPI: false}", False),
        ({}, {"USE_NODE_FEATURE_API": "true"}, "flags: {useNodeFeatureAPI: false}", True),  # env beats file
        (
            {},
            {"GFD_USE_NODE_FEATURE_API": "false", "USE_NODE_FEATURE_API": "true"},
            None,
            False,
        ),  # first wins
        ({}, {"USE_NODE_FEATURE_API": ""}, None, False),  # urfave/cli: an empty bool env var is false
        ({"use-node-feature-api": "false"}, {"USE_NODE_FEATURE_API": "true"}, None, False),  # CLI beats env
    ],
)
def test_use_node_feature_api_precedence(
    tmp_path: Path, cli: dict[str, str], env: dict[str, str], file: str | None, expected: bool
) -> None:
    cli = with_config_file(tmp_path, cli, file)
    assert settings(cli=cli, env=env).use_node_feature_api is expected


def test_node_and_client_settings_from_gfds_env_vars() -> None:
    s = settings(
        env={
            "NODE_NAME": "gpu-node-7",
            "NAMESPACE": "gpu-operator",
            "POD_NAME": "gpu-feature-discovery-x7k2p",
            "KUBECONFIG": "/etc/kubeconfig",
            "KUBE_API_QPS": "2.5",
            "KUBE_API_BURST": "4",
        }
    )
    assert (s.api.node_name, s.api.namespace, s.api.pod_name) == (
        "gpu-node-7",
        "gpu-operator",
        "gpu-feature-discovery-x7k2p",
    )
    assert (s.api.kubeconfig, s.api.qps, s.api.burst) == ("/etc/kubeconfig", 2.5, 4)


@pytest.mark.parametrize(
    ("cli", "env", "error"),
    [
        (
            {},
            {"KUBE_API_QPS": "fast"},
            'could not parse "fast" as float64 value from environment variable "KUBE_API_QPS" for flag '
            'kube-api-qps: strconv.ParseFloat: parsing "fast": invalid syntax',
        ),
        (
            {"kube-api-burst": "-1"},
            {},
            'invalid value "-1" for flag -kube-api-burst: use a whole number of 0 or more',
        ),
    ],
)
def test_client_flag_errors(cli: dict[str, str], env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        given_flags(cli, env)


@pytest.mark.parametrize("strategy", ["auto", "nvml", "tegra", "vfio"])
def test_nvidias_discovery_strategies_are_accepted(strategy: str) -> None:
    s = settings(env={"DEVICE_DISCOVERY_STRATEGY": strategy})
    assert s.device_discovery_strategy == strategy
    noted = [w for w in s.warnings if "--device-discovery-strategy" in w]
    assert len(noted) == (1 if strategy in ("tegra", "vfio") else 0)


def test_what_kubegpu_does_for_tegra_is_said_once() -> None:
    (warning,) = settings(cli={"device-discovery-strategy": "tegra"}).warnings
    assert warning.startswith(
        "--device-discovery-strategy=tegra asks for Tegra (Jetson, integrated GPUs) discovery through CUDA, "
        "which kubegpu does not implement: it discovers GPUs through NVML as with nvml"
    )


@pytest.mark.parametrize(
    ("cli", "env", "file"),
    [
        ({"device-discovery-strategy": "magic"}, {}, None),
        ({}, {"DEVICE_DISCOVERY_STRATEGY": "magic"}, None),
        ({}, {}, "flags: {deviceDiscoveryStrategy: magic}"),
    ],
)
def test_an_unknown_discovery_strategy_is_nvidias_error(
    tmp_path: Path, cli: dict[str, str], env: dict[str, str], file: str | None
) -> None:
    cli = with_config_file(tmp_path, cli, file)
    with pytest.raises(ConfigError) as caught:
        settings(cli=cli, env=env)
    assert str(caught.value) == "unable to validate flags: invalid --device-discovery-strategy option magic"


@pytest.mark.parametrize(
    ("cli", "env", "file", "expected"),
    [
        ({}, {}, None, "/driver-root"),
        ({"driver-root-ctr-path": "/a"}, {"DRIVER_ROOT_CTR_PATH": "/c"}, None, "/a"),
        ({}, {"CONTAINER_DRIVER_ROOT": "/b"}, None, "/b"),
        ({}, {"DRIVER_ROOT_CTR_PATH": "/c", "CONTAINER_DRIVER_ROOT": "/b"}, None, "/c"),
        ({}, {}, "flags: {plugin: {containerDriverRoot: /d}}", "/d"),
    ],
)
def test_driver_root_ctr_path(
    tmp_path: Path, cli: dict[str, str], env: dict[str, str], file: str | None, expected: str
) -> None:
    cli = with_config_file(tmp_path, cli, file)
    assert settings(cli=cli, env=env).driver_root_ctr_path == expected


def test_an_output_file_given_with_the_api_says_it_is_not_written() -> None:
    (warning,) = settings(cli={"output-file": "/x/gfd"}).warnings
    assert warning == (
        "the labels go to this node's NodeFeature object (--use-node-feature-api, GFD's default), so the "
        "output file /x/gfd is not written; set --use-node-feature-api=false (USE_NODE_FEATURE_API=false) "
        "to write it"
    )
    assert settings(cli={"output-file": "/x/gfd", "use-node-feature-api": "false"}).warnings == ()


def test_describe_shows_the_output_choice() -> None:
    described = settings(env={"DEVICE_DISCOVERY_STRATEGY": "nvml"}).describe()
    assert '"useNodeFeatureAPI": true' in described
    assert '"deviceDiscoveryStrategy": "nvml"' in described


def test_gfds_flag_spellings_on_the_command_line() -> None:
    from kubegpu.labels.cli import labels

    argv = [
        "--container-driver-root",
        "/a",
        "--use-node-feature-api=false",
        "--device-discovery-strategy=nvml",
    ]
    params = labels.make_context("labels", argv).params
    assert params["driver_root_ctr_path"] == "/a"
    assert (params["use_node_feature_api"], params["device_discovery_strategy"]) == ("false", "nvml")
    bare = labels.make_context("labels", ["--use-node-feature-api"]).params  # a bare bool flag is true
    assert bare["use_node_feature_api"] == "true"
