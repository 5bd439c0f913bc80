"""Every setting read from the command line and the environment once, validated, with one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.settings.env import DaemonEnv, NvmlSelection
from kubegpu.settings.given import FlagValue, read_given
from kubegpu.settings.setting import CONFIG_MANAGER, LABELS, MPS_DAEMON, PLUGIN
from kubegpu.settings.table import for_command
from kubegpu.settings.values import SettingError, XidList


def plugin(env: dict[str, str], cli: dict[str, str] | None = None) -> dict[str, FlagValue]:
    return read_given(for_command(PLUGIN), cli or {}, env)


def error_of(command: str, env: dict[str, str], cli: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingError) as info:
        read_given(for_command(command), cli or {}, env)
    return str(info.value)


# --- kubegpu's intervals: finite, > 0 where 0 would busy-loop, at most a day ------------------------------

POSITIVE_SECONDS = [
    ("KUBEGPU_DISCOVERY_RETRY_SECONDS", "30"),
    ("KUBEGPU_MPS_RETRY_SECONDS", "30"),
    ("KUBEGPU_HEALTH_PROBE_SECONDS", "5"),
]


@pytest.mark.parametrize(("variable", "default"), POSITIVE_SECONDS)
@pytest.mark.parametrize("bad", ["abc", "inf", "-inf", "nan", "0", "-1", "0.0", "1_0", "5s", "٣"])
def test_positive_seconds_refuse_what_would_kill_or_spin_the_task(
    variable: str, default: str, bad: str
) -> None:
    assert error_of(PLUGIN, {variable: bad}) == (
        f"{variable}={bad!r} is not a valid number of seconds: use a finite number greater than 0, "
        f"e.g. {default} (the default)"
    )


@pytest.mark.parametrize(
    ("variable", "default"),
    [*POSITIVE_SECONDS, ("KUBEGPU_RECOVERY_QUIET_SECONDS", "60"), ("KUBEGPU_HEALTH_GRACE_SECONDS", "60")],
)
def test_seconds_longer_than_a_day_overflow_timers(variable: str, default: str) -> None:
    assert error_of(PLUGIN, {variable: "86401"}) == (
        f"{variable}='86401' is not a valid number of seconds: use at most 86400, "
        f"e.g. {default} (the default)"
    )
    assert error_of(PLUGIN, {variable: "1e300"}).startswith(f"{variable}='1e300' is not a valid number")


@pytest.mark.parametrize(
    ("variable", "default"),
    [("KUBEGPU_RECOVERY_QUIET_SECONDS", "60"), ("KUBEGPU_HEALTH_GRACE_SECONDS", "60")],
)
@pytest.mark.parametrize("bad", ["abc", "inf", "nan", "-1", "-0.5"])
def test_seconds_that_may_be_zero(variable: str, default: str, bad: str) -> None:
    assert error_of(PLUGIN, {variable: bad}) == (
        f"{variable}={bad!r} is not a valid number of seconds: use a finite number of 0 or more, "
        f"e.g. {default} (the default)"
    )


def test_good_seconds_are_typed() -> None:
    env = DaemonEnv.from_environ(
        {
            "KUBEGPU_DISCOVERY_RETRY_SECONDS": "2.5",
            "KUBEGPU_MPS_RETRY_SECONDS": " 7 ",
            "KUBEGPU_HEALTH_PROBE_SECONDS": "1e-1",
            "KUBEGPU_RECOVERY_QUIET_SECONDS": "0",
        }
    )
    assert (env.discovery_retry_s, env.mps_retry_s, env.health_probe_s, env.recovery_quiet_s) == (
        2.5,
        7,
        0.1,
        0,
    )


def test_empty_env_vars_count_as_unset() -> None:
    """Kubernetes manifests often carry `value: ""`; as with click, that means the default."""
    names = [e for s in for_command(PLUGIN) if s.owner == "kubegpu" for e in s.envvars]
    assert len(names) == 23
    assert DaemonEnv.from_environ(dict.fromkeys(names, "")) == DaemonEnv.default()
    given = plugin(dict.fromkeys(names, ""))
    explicit = {name: v for name, v in given.items() if v.explicit}
    # The one exception: the PodResources socket's help says "" turns the pod metric off.
    assert {name: (v.value, v.origin) for name, v in explicit.items()} == {
        "pod-resources-socket": ("", "KUBEGPU_POD_RESOURCES_SOCKET")
    }


def test_an_empty_pod_resources_socket_turns_the_pod_metric_off() -> None:
    assert plugin({})["pod-resources-socket"].value == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert plugin({"KUBEGPU_POD_RESOURCES_SOCKET": ""})["pod-resources-socket"].value == ""


def test_empty_value_on_the_command_line_is_an_error() -> None:
    assert error_of(PLUGIN, {}, {"health-grace-period": ""}) == (
        "--health-grace-period='' is not a valid number of seconds: use a finite number of 0 or more, "
        "e.g. 60 (the default)"
    )
    assert error_of(PLUGIN, {}, {"http-port": ""}) == (
        "--http-port='' is not a valid whole number: use a whole number from 0 to 65535, e.g. 0 (the default)"
    )


def test_defaults() -> None:
    env = DaemonEnv.default()
    assert env == DaemonEnv(
        nvml=NvmlSelection("", None, Path("/sys")),
        discovery_retry_s=30,
        mps_retry_s=30,
        mps_container_root=Path("/mps"),
        cdi_root=Path("/var/run/cdi"),
        health_recovery=True,
        recovery_quiet_s=60,
        health_probe_s=5,
        xid_actions=None,
        disable_healthchecks=XidList(),
        enable_healthchecks=XidList(),
    )


# --- ports, booleans, paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["abc", "-1", "65536", "80.5", "0x50", "1e3", "8_080"])
def test_http_port(bad: str) -> None:
    assert error_of(PLUGIN, {"KUBEGPU_HTTP_PORT": bad}) == (
        f"KUBEGPU_HTTP_PORT={bad!r} is not a valid whole number: use a whole number from 0 to 65535, "
        "e.g. 0 (the default)"
    )
    assert plugin({"KUBEGPU_HTTP_PORT": "8080"})["http-port"] == FlagValue(8080, True, "KUBEGPU_HTTP_PORT")


@pytest.mark.parametrize(
    ("variable", "default"),
    [
        ("KUBEGPU_HEALTH_RECOVERY", "true"),
        ("KUBEGPU_MPS_CLIENT_LIMITS", "true"),
        ("KUBEGPU_STRICT_CONFIG", "false"),
        ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION", "false"),
    ],
)
@pytest.mark.parametrize("bad", ["maybe", "yes", "no", "on", "2", "tRUE"])
def test_kubegpu_booleans(variable: str, default: str, bad: str) -> None:
    assert error_of(PLUGIN, {variable: bad}) == (
        f"{variable}={bad!r} is not a valid boolean: use true or false, e.g. {default} (the default)"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", True), ("t", True), ("TRUE", True), ("0", False), ("F", False), ("False", False)],
)
def test_booleans_are_gos(text: str, value: bool) -> None:
    assert DaemonEnv.from_environ({"KUBEGPU_HEALTH_RECOVERY": text}).health_recovery is value


def test_nvidias_booleans_keep_urfave_clis_words() -> None:
    assert error_of(PLUGIN, {"FAIL_ON_INIT_ERROR": "yes"}) == (
        'could not parse "yes" as bool value from environment variable "FAIL_ON_INIT_ERROR" for flag '
        'fail-on-init-error: strconv.ParseBool: parsing "yes": invalid syntax'
    )
    assert error_of(PLUGIN, {"PASS_DEVICE_SPECS": 'y\n"es'}) == (
        'could not parse "y\\n\\"es" as bool value from environment variable "PASS_DEVICE_SPECS" for flag '
        'pass-device-specs: strconv.ParseBool: parsing "y\\n\\"es": invalid syntax'
    )
    # On the command line, Go's flag package words it.
    assert error_of(PLUGIN, {}, {"fail-on-init-error": "nope"}) == (
        'invalid boolean value "nope" for -fail-on-init-error: parse error'
    )


def test_paths_and_the_nvml_selection() -> None:
    env = DaemonEnv.from_environ(
        {
            "KUBEGPU_CDI_ROOT": "/run/cdi",
            "KUBEGPU_MPS_CONTAINER_ROOT": "/m",
            "KUBEGPU_XID_ACTIONS": " /etc/xids.yaml ",
            "KUBEGPU_FAKE_NVML": "t4-pcie ",
            "KUBEGPU_FAKE_NVML_STATE": "/tmp/state",
            "KUBEGPU_SYSFS_ROOT": "/host/sys",
        }
    )
    assert (env.cdi_root, env.mps_container_root, env.xid_actions) == (
        Path("/run/cdi"),
        Path("/m"),
        Path("/etc/xids.yaml"),
    )
    assert env.nvml == NvmlSelection("t4-pcie", Path("/tmp/state"), Path("/host/sys"))


def test_xid_lists_are_nvidias_and_never_fail() -> None:
    env = DaemonEnv.from_environ(
        {"DP_DISABLE_HEALTHCHECKS": "48, abc,-4,79", "DP_ENABLE_HEALTHCHECKS": "ALL"}
    )
    assert env.disable_healthchecks == XidList(False, frozenset({48, 79}), (" abc", "-4"))
    assert env.enable_healthchecks.all


# --- where values come from ------------------------------------------------------------------------------


def test_flag_beats_env_beats_default_and_each_says_where_it_came_from() -> None:
    given = plugin({"KUBEGPU_HTTP_PORT": "9000", "KUBEGPU_HTTP_ADDRESS": "127.0.0.1"}, {"http-port": "8080"})
    assert given["http-port"] == FlagValue(8080, True, "--http-port")
    assert given["http-port"].source == "flag"
    assert given["http-address"] == FlagValue("127.0.0.1", True, "KUBEGPU_HTTP_ADDRESS")
    assert given["http-address"].source == "env"
    assert given["kubelet-socket"] == FlagValue("/var/lib/kubelet/device-plugins/kubelet.sock", False)
    assert given["kubelet-socket"].source == "default"


def test_first_set_env_var_wins_and_an_empty_one_is_skipped() -> None:
    given = plugin({"NVIDIA_CDI_HOOK_PATH": "", "NVIDIA_CTK_PATH": "/usr/local/bin/nvidia-ctk"})
    assert given["nvidia-cdi-hook-path"] == FlagValue("/usr/local/bin/nvidia-ctk", True, "NVIDIA_CTK_PATH")
    given = plugin({"NVIDIA_CDI_HOOK_PATH": "/a", "NVIDIA_CTK_PATH": "/b"})
    assert given["nvidia-cdi-hook-path"].value == "/a"


def test_every_bad_value_is_reported_at_once() -> None:
    with pytest.raises(SettingError) as info:
        read_given(
            for_command(PLUGIN),
            {"http-port": "x"},
            {"KUBEGPU_HEALTH_PROBE_SECONDS": "inf", "KUBEGPU_DISCOVERY_RETRY_SECONDS": "abc"},
        )
    assert info.value.problems == [
        "--http-port='x' is not a valid whole number: use a whole number from 0 to 65535, "
        "e.g. 0 (the default)",
        "KUBEGPU_HEALTH_PROBE_SECONDS='inf' is not a valid number of seconds: use a finite number greater "
        "than 0, e.g. 5 (the default)",
        "KUBEGPU_DISCOVERY_RETRY_SECONDS='abc' is not a valid number of seconds: use a finite number greater "
        "than 0, e.g. 30 (the default)",
    ]
    assert str(info.value) == "; ".join(info.value.problems)  # one line


def test_a_command_reads_only_its_own_settings() -> None:
    """The labeller does not refuse to start over a plugin-only variable."""
    given = read_given(for_command(LABELS), {}, {"KUBEGPU_HEALTH_PROBE_SECONDS": "inf", "GFD_ONESHOT": "1"})
    assert given["oneshot"] == FlagValue(True, True, "GFD_ONESHOT")
    assert "health-probe-seconds" not in given


def test_the_mps_daemons_retry_interval() -> None:
    assert error_of(MPS_DAEMON, {"KUBEGPU_MPS_RETRY_SECONDS": "0"}) == (
        "KUBEGPU_MPS_RETRY_SECONDS='0' is not a valid number of seconds: use a finite number greater than 0, "
        "e.g. 30 (the default)"
    )
    given = read_given(for_command(MPS_DAEMON), {"retry-interval": "2"}, {"KUBEGPU_MPS_RETRY_SECONDS": "9"})
    assert given["retry-interval"] == FlagValue(2.0, True, "--retry-interval")


def test_config_managers_signal_and_repeated_fallbacks() -> None:
    assert error_of(CONFIG_MANAGER, {"SIGNAL": "HUP"}) == (
        'could not parse "HUP" as int value from environment variable "SIGNAL" for flag signal: '
        'strconv.ParseInt: parsing "HUP": invalid syntax'
    )
    # A number Go takes but kubegpu's bounds refuse: kubegpu's fix in Go's frame.
    assert error_of(CONFIG_MANAGER, {"SIGNAL": "0"}) == (
        'could not parse "0" as int value from environment variable "SIGNAL" for flag signal: '
        "use a whole number from 1 to 64"
    )
    assert error_of(CONFIG_MANAGER, {}, {"signal": "0"}) == (
        'invalid value "0" for flag -signal: use a whole number from 1 to 64'
    )
    assert (
        error_of(CONFIG_MANAGER, {}, {"signal": "HUP"}) == 'invalid value "HUP" for flag -signal: parse error'
    )
    given = read_given(for_command(CONFIG_MANAGER), {}, {"FALLBACK_STRATEGIES": "named, single empty"})
    assert given["fallback-strategies"].value == ["named", "single", "empty"]
    given = read_given(for_command(CONFIG_MANAGER), {"fallback-strategies": ("single", "named,empty")}, {})
    assert given["fallback-strategies"].value == ["single", "named", "empty"]


def test_repeated_flags_given_and_not_given_and_their_env_var() -> None:
    manager = for_command(CONFIG_MANAGER)
    env = {"FALLBACK_STRATEGIES": "named single"}  # click's split of a repeatable flag's env var
    # click hands an unrepeated repeatable flag over as (): not given, so the env var stands.
    assert read_given(manager, {"fallback-strategies": ()}, env)["fallback-strategies"] == FlagValue(
        ["named", "single"], True, "FALLBACK_STRATEGIES"
    )
    assert read_given(manager, {"fallback-strategies": ("empty",)}, env)["fallback-strategies"] == FlagValue(
        ["empty"], True, "--fallback-strategies"
    )
    assert read_given(manager, {}, {})["fallback-strategies"] == FlagValue([], False)


def test_a_list_that_is_not_repeatable_splits_on_commas_only() -> None:
    # NVIDIA's string-slice env vars split on commas: "envvar cdi-cri" is one (invalid) strategy.
    assert plugin({"DEVICE_LIST_STRATEGY": "envvar cdi-cri"})["device-list-strategy"] == FlagValue(
        ["envvar cdi-cri"], True, "DEVICE_LIST_STRATEGY"
    )
    default = plugin({})["device-list-strategy"]
    assert default == FlagValue(["envvar"], False) and type(default.value) is list


def test_gfds_empty_env_vars_are_explicit_and_name_their_variable() -> None:
    given = read_given(for_command(LABELS), {}, {"GFD_ONESHOT": "", "GFD_OUTPUT_FILE": ""})
    assert given["oneshot"] == FlagValue(False, True, "GFD_ONESHOT")
    assert given["output-file"] == FlagValue("", True, "GFD_OUTPUT_FILE")
    assert given["oneshot"].source == given["output-file"].source == "env"


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEGPU_HTTP_PORT", "9400")
    assert read_given(for_command(PLUGIN))["http-port"] == FlagValue(9400, True, "KUBEGPU_HTTP_PORT")
