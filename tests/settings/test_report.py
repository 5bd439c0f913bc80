"""The effective settings as the start-up log and `kubegpu config check` show them."""

from __future__ import annotations

from kubegpu.settings.given import read_given
from kubegpu.settings.plugin import resolve
from kubegpu.settings.report import effective, render_block
from kubegpu.settings.setting import LABELS, PLUGIN
from kubegpu.settings.table import for_command


def test_the_start_up_block_names_each_setting_its_value_and_source() -> None:
    given = read_given(
        for_command(PLUGIN),
        {"http-port": "8080", "kubelet-socket": ""},
        {"KUBEGPU_HEALTH_PROBE_SECONDS": "2", "DP_DISABLE_HEALTHCHECKS": "all", "MIG_STRATEGY": "mixed"},
    )
    assert resolve(given).log_settings().splitlines() == [
        '  flag     KUBELET_SOCKET="" (--kubelet-socket)',
        '  default  CONFIG_FILE=""',
        '  default  CDI_DISABLE_HOOKS=""',
        '  default  CDI_FEATURE_FLAGS=""',
        "  env      DP_DISABLE_HEALTHCHECKS=all",
        '  default  DP_ENABLE_HEALTHCHECKS=""',
        "  default  KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION=false",
        "  flag     KUBEGPU_HTTP_PORT=8080 (--http-port)",
        '  default  KUBEGPU_HTTP_ADDRESS=""',
        "  default  KUBEGPU_POD_RESOURCES_SOCKET=/var/lib/kubelet/pod-resources/kubelet.sock",
        "  default  KUBEGPU_METRICS_INTERVAL_SECONDS=10",
        "  default  KUBEGPU_IDLE_THRESHOLD=5",
        "  default  KUBEGPU_DRA_GPUS=none",
        "  default  KUBEGPU_HEALTH_GRACE_SECONDS=60",
        "  default  KUBEGPU_MPS_CLIENT_LIMITS=true",
        "  default  KUBEGPU_STRICT_CONFIG=false",
        "  default  KUBEGPU_HEALTH_RECOVERY=true",
        "  default  KUBEGPU_RECOVERY_QUIET_SECONDS=60",
        "  env      KUBEGPU_HEALTH_PROBE_SECONDS=2",
        '  default  KUBEGPU_XID_ACTIONS=""',
        "  default  KUBEGPU_DISCOVERY_RETRY_SECONDS=30",
        "  default  KUBEGPU_MPS_RETRY_SECONDS=30",
        "  default  KUBEGPU_MPS_CONTAINER_ROOT=/mps",
        "  default  KUBEGPU_PROC_ROOT=/proc",
        '  default  KUBEGPU_NODE_NAME=""',
        "  default  KUBEGPU_CDI_ROOT=/var/run/cdi",
        '  default  KUBEGPU_FAKE_NVML=""',
        '  default  KUBEGPU_FAKE_NVML_STATE=""',
        "  default  KUBEGPU_SYSFS_ROOT=/sys",
    ]  # MIG_STRATEGY fills flags.migStrategy: the config dump shows it


def test_a_second_env_var_is_named() -> None:
    given = read_given(for_command(LABELS), {}, {"CONFIG_FILE": "/c.yaml"})
    (entry,) = [e for e in effective(for_command(LABELS), given) if e.setting.name == "config-file"]
    assert render_block([entry]) == "  env      GFD_CONFIG_FILE=/c.yaml (CONFIG_FILE)"
    assert entry.to_json() == {
        "name": "config-file",
        "flag": "--config-file",
        "env": ["GFD_CONFIG_FILE", "CONFIG_FILE"],
        "value": "/c.yaml",
        "source": "env",
        "origin": "CONFIG_FILE",
        "owner": "nvidia",
    }
