"""The settings table: its public surface (NVIDIA's and ours, unchanged), its consistency, and the CLI built
from it."""

from __future__ import annotations

import click
import pytest

from kubegpu.cli.main import main
from kubegpu.settings.given import read_given
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.plugin import resolve
from kubegpu.settings.setting import COMMANDS, DOCTOR, Setting
from kubegpu.settings.table import SETTINGS, for_command
from kubegpu.settings.values import default_text, text_of

# Every flag with its aliases, env vars and default, as the commands had them before the table existed
# (NVIDIA's from k8s-device-plugin v0.20): the public surface must not change.
SURFACE = [
    ("plugin", "--mig-strategy", (), ("MIG_STRATEGY",), "none"),
    ("plugin", "--fail-on-init-error", (), ("FAIL_ON_INIT_ERROR",), "true"),
    ("plugin", "--driver-root", ("--nvidia-driver-root",), ("NVIDIA_DRIVER_ROOT",), "/"),
    ("plugin", "--dev-root", ("--nvidia-dev-root",), ("NVIDIA_DEV_ROOT",), ""),
    ("plugin", "--pass-device-specs", (), ("PASS_DEVICE_SPECS",), "false"),
    ("plugin", "--device-list-strategy", (), ("DEVICE_LIST_STRATEGY",), "envvar"),
    ("plugin", "--device-id-strategy", (), ("DEVICE_ID_STRATEGY",), "uuid"),
    ("plugin", "--cdi-annotation-prefix", (), ("CDI_ANNOTATION_PREFIX",), "cdi.k8s.io/"),
    (
        "plugin",
        "--nvidia-cdi-hook-path",
        ("--nvidia-ctk-path",),
        ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
        "/usr/bin/nvidia-ctk",
    ),
    (
        "plugin",
        "--driver-root-ctr-path",
        ("--container-driver-root",),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        "/driver-root",
    ),
    ("plugin", "--gdrcopy-enabled", (), ("GDRCOPY_ENABLED",), "false"),
    ("plugin", "--gds-enabled", (), ("GDS_ENABLED",), "false"),
    ("plugin", "--mofed-enabled", (), ("MOFED_ENABLED",), "false"),
    ("plugin", "--imex-channel-ids", (), ("IMEX_CHANNEL_IDS",), ""),
    ("plugin", "--imex-required", (), ("IMEX_REQUIRED",), "false"),
    (
        "plugin",
        "--shared-devices-allocation-policy",
        (),
        ("SHARED_DEVICES_ALLOCATION_POLICY",),
        "distributed",
    ),
    ("plugin", "--kubelet-socket", (), ("KUBELET_SOCKET",), "/var/lib/kubelet/device-plugins/kubelet.sock"),
    ("plugin", "--config-file", (), ("CONFIG_FILE",), ""),
    ("plugin", "--mps-root", (), ("MPS_ROOT",), ""),
    ("plugin", "--device-discovery-strategy", (), ("DEVICE_DISCOVERY_STRATEGY",), "auto"),
    ("plugin", "--cdi-disable-hooks", (), ("CDI_DISABLE_HOOKS",), ""),
    ("plugin", "--cdi-feature-flags", (), ("CDI_FEATURE_FLAGS",), ""),
    ("plugin", "--allow-resource-customization", (), ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",), "false"),
    ("plugin", "--http-port", (), ("KUBEGPU_HTTP_PORT",), "0"),
    ("plugin", "--http-address", (), ("KUBEGPU_HTTP_ADDRESS",), ""),
    (
        "plugin",
        "--pod-resources-socket",
        (),
        ("KUBEGPU_POD_RESOURCES_SOCKET",),
        "/var/lib/kubelet/pod-resources/kubelet.sock",
    ),
    ("plugin", "--metrics-interval", (), ("KUBEGPU_METRICS_INTERVAL_SECONDS",), "10"),
    ("plugin", "--idle-threshold", (), ("KUBEGPU_IDLE_THRESHOLD",), "5"),
    ("plugin", "--dra-gpus", (), ("KUBEGPU_DRA_GPUS",), "none"),
    ("plugin", "--health-grace-period", (), ("KUBEGPU_HEALTH_GRACE_SECONDS",), "60"),
    ("plugin", "--mps-client-limits", (), ("KUBEGPU_MPS_CLIENT_LIMITS",), "true"),
    ("plugin", "--strict-config", (), ("KUBEGPU_STRICT_CONFIG",), "false"),
    ("mps-daemon run", "--mig-strategy", (), ("MIG_STRATEGY",), "none"),
    ("mps-daemon run", "--config-file", (), ("CONFIG_FILE",), ""),
    (
        "mps-daemon run",
        "--allow-resource-customization",
        (),
        ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",),
        "false",
    ),
    ("mps-daemon run", "--strict-config", (), ("KUBEGPU_STRICT_CONFIG",), "false"),
    ("mps-daemon run", "--root", (), ("KUBEGPU_MPS_DAEMON_ROOT",), "/mps"),
    ("mps-daemon run", "--retry-interval", (), ("KUBEGPU_MPS_RETRY_SECONDS",), "30"),
    ("mps-daemon run", "--selinux-fs", (), ("KUBEGPU_SELINUX_FS",), "/sys/fs/selinux"),
    ("mps-daemon mount-shm", "--root", (), ("KUBEGPU_MPS_DAEMON_ROOT",), "/mps"),
    ("labels", "--mig-strategy", (), ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), "none"),
    ("labels", "--fail-on-init-error", (), ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"), "true"),
    ("labels", "--oneshot", (), ("GFD_ONESHOT",), "false"),
    ("labels", "--no-timestamp", (), ("GFD_NO_TIMESTAMP",), "false"),
    ("labels", "--sleep-interval", (), ("GFD_SLEEP_INTERVAL",), "1m0s"),
    (
        "labels",
        "--output-file",
        ("--output", "-o"),
        ("GFD_OUTPUT_FILE",),
        "/etc/kubernetes/node-feature-discovery/features.d/gfd",
    ),
    ("labels", "--machine-type-file", (), ("GFD_MACHINE_TYPE_FILE",), "/sys/class/dmi/id/product_name"),
    # GFD's default since v0.19 (NVIDIA/k8s-device-plugin#1504)
    ("labels", "--use-node-feature-api", (), ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"), "true"),
    ("labels", "--device-discovery-strategy", (), ("DEVICE_DISCOVERY_STRATEGY",), "auto"),
    (
        "labels",
        "--driver-root-ctr-path",
        ("--container-driver-root",),
        ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
        "/driver-root",
    ),
    ("labels", "--allow-resource-customization", (), ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",), "false"),
    ("labels", "--config-file", (), ("GFD_CONFIG_FILE", "CONFIG_FILE"), ""),
    # GFD's KubeClientConfig and NodeConfig flags
    ("labels", "--kubeconfig", (), ("KUBECONFIG",), ""),
    ("labels", "--kube-api-qps", (), ("KUBE_API_QPS",), "5"),
    ("labels", "--kube-api-burst", (), ("KUBE_API_BURST",), "10"),
    ("labels", "--namespace", (), ("NAMESPACE",), "default"),
    ("labels", "--node-name", (), ("NODE_NAME",), ""),
    ("labels", "--pod-name", (), ("POD_NAME",), ""),
    ("config-manager", "--oneshot", (), ("ONESHOT",), "false"),
    ("config-manager", "--kubeconfig", (), ("KUBECONFIG",), ""),
    ("config-manager", "--node-name", (), ("NODE_NAME",), ""),
    ("config-manager", "--node-label", (), ("NODE_LABEL",), "nvidia.com/device-plugin.config"),
    ("config-manager", "--config-file-srcdir", (), ("CONFIG_FILE_SRCDIR",), ""),
    ("config-manager", "--config-file-dst", (), ("CONFIG_FILE_DST",), ""),
    ("config-manager", "--default-config", (), ("DEFAULT_CONFIG",), ""),
    ("config-manager", "--fallback-strategies", (), ("FALLBACK_STRATEGIES",), ""),
    ("config-manager", "--send-signal", (), ("SEND_SIGNAL",), "true"),
    ("config-manager", "--signal", (), ("SIGNAL",), "1"),
    ("config-manager", "--process-to-signal", (), ("PROCESS_TO_SIGNAL",), "kubegpu"),
    ("fake-nvml inject", "--state-dir", (), ("KUBEGPU_FAKE_NVML_STATE",), ""),
]
# The env vars read without a flag, before the table existed: NVIDIA's health-check variables and ours.
ENV_ONLY = {
    "plugin": {
        "DP_DISABLE_HEALTHCHECKS": "",
        "DP_ENABLE_HEALTHCHECKS": "",
        "KUBEGPU_HEALTH_RECOVERY": "true",
        "KUBEGPU_RECOVERY_QUIET_SECONDS": "60",
        "KUBEGPU_HEALTH_PROBE_SECONDS": "5",
        "KUBEGPU_XID_ACTIONS": "",
        "KUBEGPU_DISCOVERY_RETRY_SECONDS": "30",
        "KUBEGPU_MPS_RETRY_SECONDS": "30",
        "KUBEGPU_MPS_CONTAINER_ROOT": "/mps",
        "KUBEGPU_PROC_ROOT": "/proc",
        "KUBEGPU_NODE_NAME": "",
        "KUBEGPU_CDI_ROOT": "/var/run/cdi",
        "KUBEGPU_FAKE_NVML": "",
        "KUBEGPU_FAKE_NVML_STATE": "",
        "KUBEGPU_SYSFS_ROOT": "/sys",
    },
    "labels": {"KUBEGPU_FAKE_NVML": "", "KUBEGPU_FAKE_NVML_STATE": "", "KUBEGPU_SYSFS_ROOT": "/sys"},
    "mps-daemon run": {"KUBEGPU_FAKE_NVML": "", "KUBEGPU_FAKE_NVML_STATE": "", "KUBEGPU_SYSFS_ROOT": "/sys"},
    "doctor": {"KUBEGPU_FAKE_NVML": "", "KUBEGPU_FAKE_NVML_STATE": "", "KUBEGPU_SYSFS_ROOT": "/sys"},
}


def _click_command(path: str) -> click.Command:
    ctx = click.Context(main)
    command: click.Command | None = main
    for word in path.split():
        assert isinstance(command, click.Group)
        command = command.get_command(ctx, word)
    assert command is not None
    return command


def _flags(setting: Setting) -> tuple:
    return (setting.option, setting.aliases, setting.envvars, default_text(setting))


@pytest.mark.parametrize("command", sorted({row[0] for row in SURFACE}))
def test_every_flag_keeps_its_names_env_vars_and_default(command: str) -> None:
    expected = [row[1:] for row in SURFACE if row[0] == command]
    assert [_flags(s) for s in for_command(command) if s.flag] == expected


def test_config_check_takes_the_plugins_flags_and_env_vars() -> None:
    assert [_flags(s) for s in for_command("config check")] == [_flags(s) for s in for_command("plugin")]


@pytest.mark.parametrize("command", sorted(ENV_ONLY))
def test_env_only_settings(command: str) -> None:
    found = {s.envvars[0]: default_text(s) for s in for_command(command) if not s.flag}
    assert found == ENV_ONLY[command]


@pytest.mark.parametrize("command", sorted({row[0] for row in SURFACE} | {"config check"}))
def test_each_command_has_exactly_the_tables_flags(command: str) -> None:
    """The click options are built from the table: each flag, with its aliases, and its env vars in --help."""
    params = {opt: p for p in _click_command(command).params if isinstance(p, click.Option) for opt in p.opts}
    for setting in for_command(command):
        if not setting.flag:
            continue
        param = params[setting.option]
        assert sorted(param.opts) == sorted([setting.option, *setting.aliases])
        assert param.name == setting.key and param.default is None  # the settings package fills defaults
        assert param.envvar is None  # ...and reads the env vars
        assert isinstance(param, click.Option) and all(e in (param.help or "") for e in setting.envvars)
    taken = {s.option for s in for_command(command)} | {a for s in for_command(command) for a in s.aliases}
    own = {"-v", "--verbose", "--help", "--timeout", "--follow-logs", "--profile", "--json", "--key"}
    own |= {"--gpu", "--xid", "--lost", "--ecc", "--wait-error", "--flaky", "--recover", "--gi", "--ci"}
    own |= {"--meminfo", "--mountinfo", "--dry-run", "--no-follow-logs"}
    own |= {"--utilization", "--memory-util", "--memory-used", "--power", "--temperature", "--sm-clock"}
    own |= {"--process", "--mps"}
    assert set(params) - taken <= own  # anything else with an env var would be outside the table


def test_names_are_unique_within_each_command_and_every_command_is_known() -> None:
    for command in COMMANDS:
        names = [s.name for s in for_command(command)]
        assert len(names) == len(set(names)), command
        envvars = [e for s in for_command(command) for e in s.envvars]
        assert len(envvars) == len(set(envvars)), command
    assert all(s.commands and set(s.commands) <= set(COMMANDS) for s in SETTINGS)
    assert for_command(DOCTOR)


def test_owners_spell_their_env_vars_their_way() -> None:
    for s in SETTINGS:
        assert s.envvars, s.name
        if s.owner == "kubegpu":
            assert all(e.startswith("KUBEGPU_") for e in s.envvars), s.name
        else:
            assert not any(e.startswith("KUBEGPU_") for e in s.envvars), s.name


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.commands[0]}:{s.name}")
def test_every_default_is_valid_for_its_own_setting(setting: Setting) -> None:
    """The default written as a user would write it parses back to the default."""
    text = default_text(setting)
    if not text:
        return
    parsed = read_given([setting], {}, {setting.envvars[0]: text})[setting.name].value
    assert text_of(setting, parsed) == text
    assert parsed == (list(setting.default) if setting.kind == "list" else setting.default)


@pytest.mark.parametrize("setting", [s for s in for_command("plugin") if s.choices], ids=lambda s: s.name)
def test_nvidias_choices_are_what_nvidias_validation_accepts(setting: Setting) -> None:
    """NVIDIA's choices are checked after the merge with the config file, with NVIDIA's texts."""
    for choice in setting.choices:
        resolve(read_given(for_command("plugin"), {setting.name: choice}, {}))
    with pytest.raises(ConfigError, match=r"^unable to validate flags: "):
        resolve(read_given(for_command("plugin"), {setting.name: "bogus"}, {}))
    assert {s.name: s.choices for s in for_command("plugin") if s.choices} == {
        "mig-strategy": ("none", "single", "mixed"),
        "device-list-strategy": ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"),
        "device-id-strategy": ("uuid", "index"),
        "shared-devices-allocation-policy": ("distributed", "packed"),
        "device-discovery-strategy": ("auto", "nvml", "tegra"),
    }
