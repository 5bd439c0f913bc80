"""Every flag and env var of every kubegpu command, NVIDIA's and kubegpu's, in one table (`SETTINGS`).

See `kubegpu.settings.setting` for what each field means. Names, env vars, aliases and defaults of NVIDIA's
settings are NVIDIA's (k8s-device-plugin v0.20: the plugin, GFD, config-manager, mps-control-daemon).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kubegpu.common.quoting import plain_id
from kubegpu.settings.choices import (
    AUTO_DISCOVERY,
    DEFAULT_ANNOTATION_PREFIX,
    DEFAULT_CDI_ROOT,
    DEFAULT_CONTAINER_DRIVER_ROOT,
    DEFAULT_GFD_NAMESPACE,
    DEFAULT_GFD_OUTPUT_FILE,
    DEFAULT_HOOK_PATH,
    DEFAULT_KUBE_API_BURST,
    DEFAULT_KUBE_API_QPS,
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_MACHINE_TYPE_FILE,
    DEFAULT_NODE_LABEL,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_PROCESS_TO_SIGNAL,
    DEFAULT_SLEEP_INTERVAL,
    DEFAULT_SYSFS_ROOT,
    DEVICE_DISCOVERY_STRATEGIES,
    DEVICE_ID_STRATEGIES,
    DEVICE_LIST_STRATEGIES,
    DISTRIBUTED,
    GFD_DEVICE_DISCOVERY_STRATEGIES,
    MIG_STRATEGIES,
    MPS_CONTAINER_ROOT,
    SHARED_ALLOCATION_POLICIES,
)
from kubegpu.settings.dra_selection import NO_GPUS
from kubegpu.settings.nvidia_config import ConfigError
from kubegpu.settings.setting import (
    CONFIG_CHECK,
    CONFIG_MANAGER,
    DOCTOR,
    DRA,
    FAKE_NVML_INJECT,
    LABELS,
    MPS_DAEMON,
    MPS_MOUNT_SHM,
    ONE_DAY_S,
    PLUGIN,
    Setting,
)

# Env var names other modules mention in their messages.
CDI_ROOT_ENV = "KUBEGPU_CDI_ROOT"
FAKE_NVML_ENV = "KUBEGPU_FAKE_NVML"
FAKE_NVML_STATE_ENV = "KUBEGPU_FAKE_NVML_STATE"
SYSFS_ROOT_ENV = "KUBEGPU_SYSFS_ROOT"
XID_ACTIONS_ENV = "KUBEGPU_XID_ACTIONS"
DISABLE_HEALTHCHECKS_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_HEALTHCHECKS_ENV = "DP_ENABLE_HEALTHCHECKS"

# `config check` runs the plugin's code path, so it takes and validates everything the plugin takes.
_PLUGIN = (PLUGIN, CONFIG_CHECK)
# The MPS daemon takes NVIDIA's two config flags, plus kubegpu's opt-ins that change resource names and
# devices: a plugin that honours `rename`/`devices` must find its daemons under the same names.
_PLUGIN_AND_MPS = (*_PLUGIN, MPS_DAEMON)
# Every command that talks to NVML.
_NVML = (*_PLUGIN, MPS_DAEMON, LABELS, DOCTOR, DRA)
# The health thread's settings: the plugin's, which the DRA driver shares (same XID catalog and recovery).
_HEALTH = (*_PLUGIN, DRA)


def _channel_ids(values: Sequence[str]) -> list[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ConfigError(
            f"invalid --imex-channel-ids option: {plain_id(','.join(values))}: channel IDs are integers "
            "(use 0)"
        ) from None


def _seconds(
    name: str,
    envvar: str,
    default: float,
    help: str,
    commands: tuple[str, ...],
    *,
    positive: bool,
    flag: bool,
) -> Setting:
    """kubegpu's intervals: finite, at most a day (longer overflows timers), > 0 where 0 would spin."""
    return Setting(
        name, (envvar,), default, "seconds", help, "kubegpu", commands,
        flag=flag, minimum=0.0, maximum=ONE_DAY_S, positive=positive,
    )  # fmt: skip


SETTINGS: tuple[Setting, ...] = (
    # --- the plugin: NVIDIA's flags ------------------------------------------------------------------------
    Setting("mig-strategy", ("MIG_STRATEGY",), "none", "str",
            "How MIG devices are exposed: none, single or mixed.",
            "nvidia", _PLUGIN_AND_MPS, path=("flags", "migStrategy"), choices=MIG_STRATEGIES),
    Setting("fail-on-init-error", ("FAIL_ON_INIT_ERROR",), True, "bool",
            "Exit when NVML cannot start (true) or stay up advertising nothing and keep retrying (false).",
            "nvidia", _PLUGIN, path=("flags", "failOnInitError")),
    Setting("driver-root", ("NVIDIA_DRIVER_ROOT",), "/", "str",
            "Root of the NVIDIA driver installation on the host.",
            "nvidia", _PLUGIN, aliases=("--nvidia-driver-root",), path=("flags", "nvidiaDriverRoot")),
    Setting("dev-root", ("NVIDIA_DEV_ROOT",), "", "str",
            "Root under which the host's /dev/nvidia* nodes live; empty means the driver root.",
            "nvidia", _PLUGIN, aliases=("--nvidia-dev-root",), path=("flags", "nvidiaDevRoot")),
    Setting("pass-device-specs", ("PASS_DEVICE_SPECS",), False, "bool",
            "Also return the /dev/nvidia* device nodes in Allocate (needed with some CPU managers).",
            "nvidia", _PLUGIN, path=("flags", "plugin", "passDeviceSpecs")),
    Setting("device-list-strategy", ("DEVICE_LIST_STRATEGY",), ("envvar",), "list",
            "How the device list reaches the container runtime: envvar, volume-mounts, cdi-annotations, "
            "cdi-cri (comma list allowed).",
            "nvidia", _PLUGIN, path=("flags", "plugin", "deviceListStrategy"),
            choices=DEVICE_LIST_STRATEGIES),
    Setting("device-id-strategy", ("DEVICE_ID_STRATEGY",), "uuid", "str",
            "Name devices to the runtime by uuid or by index.",
            "nvidia", _PLUGIN, path=("flags", "plugin", "deviceIDStrategy"), choices=DEVICE_ID_STRATEGIES),
    Setting("cdi-annotation-prefix", ("CDI_ANNOTATION_PREFIX",), DEFAULT_ANNOTATION_PREFIX, "str",
            "Prefix of the annotation key that carries CDI device names (cdi-annotations strategy).",
            "nvidia", _PLUGIN, path=("flags", "plugin", "cdiAnnotationPrefix")),
    Setting("nvidia-cdi-hook-path", ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"), DEFAULT_HOOK_PATH, "str",
            "Path on the host of nvidia-cdi-hook (or nvidia-ctk) for the hooks in the generated CDI specs.",
            "nvidia", _PLUGIN, aliases=("--nvidia-ctk-path",), path=("flags", "plugin", "nvidiaCTKPath")),
    Setting("driver-root-ctr-path", ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
            DEFAULT_CONTAINER_DRIVER_ROOT, "str",
            "Where the driver root is mounted in the plugin's container (searched for the CDI specs' "
            "libraries).",
            "nvidia", _PLUGIN, aliases=("--container-driver-root",),
            path=("flags", "plugin", "containerDriverRoot")),
    Setting("gdrcopy-enabled", ("GDRCOPY_ENABLED",), False, "bool",
            "Give containers GDRCopy (NVIDIA_GDRCOPY=enabled; /dev/gdrdrv with CDI).",
            "nvidia", _PLUGIN, path=("flags", "gdrcopyEnabled")),
    Setting("gds-enabled", ("GDS_ENABLED",), False, "bool",
            "Give containers GPUDirect Storage (NVIDIA_GDS=enabled; /dev/nvidia-fs* with CDI).",
            "nvidia", _PLUGIN, path=("flags", "gdsEnabled")),
    Setting("mofed-enabled", ("MOFED_ENABLED",), False, "bool",
            "Give containers MOFED (NVIDIA_MOFED=enabled; /dev/infiniband nodes with CDI).",
            "nvidia", _PLUGIN, path=("flags", "mofedEnabled")),
    Setting("imex-channel-ids", ("IMEX_CHANNEL_IDS",), (), "list",
            "IMEX channels every container gets: none, or 0.",
            "nvidia", _PLUGIN, path=("imex", "channelIDs"), explicit_only=True, convert=_channel_ids),
    Setting("imex-required", ("IMEX_REQUIRED",), False, "bool",
            "Fail the start when a requested IMEX channel does not exist (else it is skipped with a "
            "warning).",
            "nvidia", _PLUGIN, path=("imex", "required"), explicit_only=True),
    Setting("shared-devices-allocation-policy", ("SHARED_DEVICES_ALLOCATION_POLICY",), DISTRIBUTED, "str",
            "How replicas are picked: distributed (spread over GPUs) or packed (fill a GPU first).",
            "nvidia", _PLUGIN, path=("flags", "plugin", "sharedDevicesAllocationPolicy"),
            choices=SHARED_ALLOCATION_POLICIES),
    Setting("kubelet-socket", ("KUBELET_SOCKET",), DEFAULT_KUBELET_SOCKET, "str",
            'The kubelet\'s registration socket; "" serves the devices without registering.',
            "nvidia", _PLUGIN),
    Setting("config-file", ("CONFIG_FILE",), "", "str",
            "Path to an NVIDIA v1 config file (YAML or JSON).",
            "nvidia", _PLUGIN_AND_MPS),
    Setting("mps-root", ("MPS_ROOT",), "", "str",
            "Host directory of the MPS control daemons' pipes and shm (required when MPS sharing is on).",
            "nvidia", _PLUGIN, path=("flags", "mpsRoot")),
    Setting("device-discovery-strategy", ("DEVICE_DISCOVERY_STRATEGY",), AUTO_DISCOVERY, "str",
            "How GPUs are found: auto, nvml or tegra (NVIDIA's choices); kubegpu uses NVML for all and says "
            "so once for tegra.",
            "nvidia", _PLUGIN, path=("flags", "deviceDiscoveryStrategy"),
            choices=DEVICE_DISCOVERY_STRATEGIES),
    Setting("cdi-disable-hooks", ("CDI_DISABLE_HOOKS",), (), "list",
            "Hooks to leave out of the generated CDI specs (comma list): create-symlinks, update-ldcache, or "
            "all; NVIDIA's other hook names are accepted (kubegpu writes only these two).",
            "nvidia", _PLUGIN),
    Setting("cdi-feature-flags", ("CDI_FEATURE_FLAGS",), (), "list",
            "Feature flags of NVIDIA's CDI library (comma list). Accepted; kubegpu writes its own specs, "
            "which these do not change, and says so once.",
            "nvidia", _PLUGIN),
    # --- the plugin: NVIDIA's env vars (read directly, not flags) ----------------------------------------
    Setting("disable-healthchecks", (DISABLE_HEALTHCHECKS_ENV,), "", "xids",
            "XIDs not to act on (comma list), added to the default 13, 31, 43, 45, 68, 109; all (or xids) "
            "turns every XID off.",
            "nvidia", _HEALTH, flag=False),
    Setting("enable-healthchecks", (ENABLE_HEALTHCHECKS_ENV,), "", "xids",
            "XIDs to act on even when ignored by default or by DP_DISABLE_HEALTHCHECKS (comma list), or all.",
            "nvidia", _HEALTH, flag=False),
    # --- the plugin: kubegpu's flags (opt-ins beyond NVIDIA's behaviour) ----------------------------------
    Setting("allow-resource-customization", ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",), False, "bool",
            "Honour `resources` and the `rename`/`devices` of shared resources (NVIDIA ignores them).",
            "kubegpu", _PLUGIN_AND_MPS),
    Setting("http-port", ("KUBEGPU_HTTP_PORT",), 0, "int",
            "Serve /healthz, /readyz and /metrics on this TCP port; 0 (the default) serves nothing.",
            "kubegpu", _PLUGIN, minimum=0, maximum=65535),
    Setting("http-address", ("KUBEGPU_HTTP_ADDRESS",), "", "str",
            "Address the HTTP endpoint listens on; empty means every interface.",
            "kubegpu", _PLUGIN),
    Setting("pod-resources-socket", ("KUBEGPU_POD_RESOURCES_SOCKET",), DEFAULT_POD_RESOURCES_SOCKET, "str",
            'The kubelet\'s PodResources API, for the which-pod-holds-which-GPU metric; "" turns it off.',
            "kubegpu", _PLUGIN, empty_env="value"),
    _seconds("metrics-interval", "KUBEGPU_METRICS_INTERVAL_SECONDS", 10.0,
             "Seconds between GPU telemetry samples for /metrics (dcgm-exporter's DCGM_FI_DEV_* series, "
             "per-container use, idle time); 0 turns GPU telemetry off.",
             _PLUGIN, positive=False, flag=True),
    Setting("idle-threshold", ("KUBEGPU_IDLE_THRESHOLD",), 5, "int",
            "Utilisation in % at or below which a held GPU counts as idle (kubegpu_device_idle_seconds).",
            "kubegpu", _PLUGIN, minimum=0, maximum=100),
    Setting("dra-gpus", ("KUBEGPU_DRA_GPUS",), NO_GPUS, "gpus",
            "GPUs served through DRA by `kubegpu dra`, which this plugin leaves out (with their MIG devices "
            "and replicas): all, none, or a comma list of indices and GPU UUIDs.",
            "kubegpu", _PLUGIN),
    _seconds("health-grace-period", "KUBEGPU_HEALTH_GRACE_SECONDS", 60.0,
             "Seconds a resource may stay unregistered (start, kubelet restart) before /healthz fails.",
             _PLUGIN, positive=False, flag=True),
    Setting("mps-client-limits", ("KUBEGPU_MPS_CLIENT_LIMITS",), True, "bool",
            "Give MPS containers CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.",
            "kubegpu", _PLUGIN),
    Setting("strict-config", ("KUBEGPU_STRICT_CONFIG",), False, "bool",
            "Treat config warnings (unknown or misplaced keys, ignored fields) as errors.",
            "kubegpu", _PLUGIN_AND_MPS),
    # --- the plugin: kubegpu's env vars -------------------------------------------------------------------
    Setting("health-recovery", ("KUBEGPU_HEALTH_RECOVERY",), True, "bool",
            "Bring a GPU with a reset-class XID back to Healthy once recovery probes pass; false keeps "
            "NVIDIA's sticky Unhealthy.",
            "kubegpu", _HEALTH, flag=False),
    _seconds("recovery-quiet-seconds", "KUBEGPU_RECOVERY_QUIET_SECONDS", 60.0,
             "Seconds without a critical XID before recovery probes may bring a GPU back.",
             _HEALTH, positive=False, flag=False),
    _seconds("health-probe-seconds", "KUBEGPU_HEALTH_PROBE_SECONDS", 5.0,
             "Seconds between health probes (a GPU lost without an event, recovery probes).",
             _HEALTH, positive=True, flag=False),
    Setting("xid-actions", (XID_ACTIONS_ENV,), None, "path",
            "A YAML file extending or overriding the XID catalog (src/kubegpu/node/xid_catalog.yaml).",
            "kubegpu", _HEALTH, flag=False),
    _seconds("discovery-retry-seconds", "KUBEGPU_DISCOVERY_RETRY_SECONDS", 30.0,
             "Seconds between rediscoveries while NVML or the GPUs are missing (failOnInitError=false).",
             _PLUGIN, positive=True, flag=False),
    _seconds("mps-retry-seconds", "KUBEGPU_MPS_RETRY_SECONDS", 30.0,
             "Seconds before the plugin tries again to serve an MPS resource whose control daemon did not "
             "answer.",
             _PLUGIN, positive=True, flag=False),
    Setting("mps-container-root", ("KUBEGPU_MPS_CONTAINER_ROOT",), Path(MPS_CONTAINER_ROOT), "path",
            "Where the host's MPS root (--mps-root) is mounted in the plugin's container, to see that each "
            "MPS control daemon answers.",
            "kubegpu", _PLUGIN, flag=False),
    Setting("proc-root", ("KUBEGPU_PROC_ROOT",), Path("/proc"), "path",
            "Where the host's /proc is seen (hostPID, or the host's /proc mounted here), to tell which "
            "container a GPU process belongs to.",
            "kubegpu", _PLUGIN, flag=False),
    Setting("node-name", ("KUBEGPU_NODE_NAME",), "", "str",
            "This node's name (the downward API's spec.nodeName): the Hostname label of the GPU telemetry; "
            "empty: the host name.",
            "kubegpu", _PLUGIN, flag=False),
    Setting("cdi-root", (CDI_ROOT_ENV,), Path(DEFAULT_CDI_ROOT), "path",
            "Where the CDI spec files are written (cdi-annotations and cdi-cri strategies).",
            "kubegpu", _PLUGIN, flag=False),
    # --- every command that talks to NVML -----------------------------------------------------------------
    Setting("fake-nvml", (FAKE_NVML_ENV,), "", "str",
            "Use the fake NVML with this node profile (a name from `kubegpu fake-nvml profiles`, or a .yaml "
            "path) instead of the driver's.",
            "kubegpu", _NVML, flag=False),
    Setting("fake-nvml-state", (FAKE_NVML_STATE_ENV,), None, "path",
            "The fake NVML's state directory, shared with `kubegpu fake-nvml inject`.",
            "kubegpu", _NVML, flag=False),
    Setting("sysfs-root", (SYSFS_ROOT_ENV,), Path(DEFAULT_SYSFS_ROOT), "path",
            "Where sysfs is read (NUMA nodes, PCI links) with the real NVML.",
            "kubegpu", _NVML, flag=False),
    # --- mps-daemon run -----------------------------------------------------------------------------------
    Setting("root", ("KUBEGPU_MPS_DAEMON_ROOT",), Path(MPS_CONTAINER_ROOT), "path",
            "Where the host's MPS root (the plugin's --mps-root) is mounted; pipes, logs and .ready go here.",
            "kubegpu", (MPS_DAEMON, MPS_MOUNT_SHM)),
    _seconds("retry-interval", "KUBEGPU_MPS_RETRY_SECONDS", 30.0,
             "Seconds before retrying after a daemon failed to start.",
             (MPS_DAEMON,), positive=True, flag=True),
    Setting("selinux-fs", ("KUBEGPU_SELINUX_FS",), Path("/sys/fs/selinux"), "path",
            "Where selinuxfs is mounted (tests point it elsewhere).",
            "kubegpu", (MPS_DAEMON,), hidden=True),
    # --- labels: GFD's flags ------------------------------------------------------------------------------
    Setting("mig-strategy", ("GFD_MIG_STRATEGY", "MIG_STRATEGY"), "none", "str",
            "How MIG devices are labelled: none, single or mixed.",
            "nvidia", (LABELS,), choices=MIG_STRATEGIES, empty_env="urfave"),
    Setting("fail-on-init-error", ("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"), True, "bool",
            "Exit when NVML cannot start (true), or label without GPU labels (false).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("oneshot", ("GFD_ONESHOT",), False, "bool",
            "Label once and exit (the file is kept).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("no-timestamp", ("GFD_NO_TIMESTAMP",), False, "bool",
            "Leave out nvidia.com/gfd.timestamp.",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("sleep-interval", ("GFD_SLEEP_INTERVAL",), DEFAULT_SLEEP_INTERVAL, "duration",
            "Time between labelling passes: a Go duration (60s, 1m30s) or infinite (label once, keep "
            "running).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("output-file", ("GFD_OUTPUT_FILE",), DEFAULT_GFD_OUTPUT_FILE, "str",
            'The NFD features.d file to write; "" or - prints the labels on stdout.',
            "nvidia", (LABELS,), aliases=("--output", "-o"), empty_env="urfave"),
    Setting("machine-type-file", ("GFD_MACHINE_TYPE_FILE",), DEFAULT_MACHINE_TYPE_FILE, "str",
            "File holding the node's DMI product name (for nvidia.com/gpu.machine).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("use-node-feature-api", ("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"), True, "bool",
            "Publish the labels as this node's NodeFeature object (nfd.k8s-sigs.io/v1alpha1) through the API "
            "server, as GFD does since v0.19; false writes --output-file instead.",
            "nvidia", (LABELS,), path=("flags", "useNodeFeatureAPI"), empty_env="urfave"),
    Setting("device-discovery-strategy", ("DEVICE_DISCOVERY_STRATEGY",), AUTO_DISCOVERY, "str",
            "How GPUs are found: auto, nvml, tegra or vfio (NVIDIA's choices); kubegpu uses NVML for all "
            "and says so once for tegra and vfio.",
            "nvidia", (LABELS,), path=("flags", "deviceDiscoveryStrategy"),
            choices=GFD_DEVICE_DISCOVERY_STRATEGIES, empty_env="urfave"),
    Setting("driver-root-ctr-path", ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
            DEFAULT_CONTAINER_DRIVER_ROOT, "str",
            "Where the driver root is mounted in the container. Accepted as GFD accepts it; neither GFD's "
            "labels nor kubegpu's depend on it (NVML is loaded from the library path).",
            "nvidia", (LABELS,), aliases=("--container-driver-root",),
            path=("flags", "plugin", "containerDriverRoot"), empty_env="urfave"),
    # kubegpu's own: the plugin's opt-in under the same name and env var, so that the labels describe the
    # resources the plugin serves.
    Setting("allow-resource-customization", ("KUBEGPU_ALLOW_RESOURCE_CUSTOMIZATION",), False, "bool",
            "Honour an explicit `rename` of a shared resource, as the plugin does with this opt-in.",
            "kubegpu", (LABELS,)),
    Setting("config-file", ("GFD_CONFIG_FILE", "CONFIG_FILE"), "", "str",
            "An NVIDIA v1 config file (YAML or JSON); its flags.gfd and flags sections fill unset flags.",
            "nvidia", (LABELS,), empty_env="urfave"),
    # --- labels: GFD's Kubernetes client and node flags (the NodeFeature API output) -----------------------
    Setting("kubeconfig", ("KUBECONFIG",), "", "str",
            "Path to a kubeconfig file; empty: the in-cluster config (the pod's service account).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("kube-api-qps", ("KUBE_API_QPS",), DEFAULT_KUBE_API_QPS, "float",
            "Requests per second to the API server, as client-go's QPS (0: 5, negative: no limit).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("kube-api-burst", ("KUBE_API_BURST",), DEFAULT_KUBE_API_BURST, "int",
            "Requests allowed at once above --kube-api-qps, as client-go's burst (0: 10).",
            "nvidia", (LABELS,), minimum=0, empty_env="urfave"),
    Setting("namespace", ("NAMESPACE",), DEFAULT_GFD_NAMESPACE, "str",
            "Namespace of the NodeFeature object (the chart passes the pod's own).",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("node-name", ("NODE_NAME",), "", "str",
            "This node's name (the downward API's spec.nodeName); required with --use-node-feature-api.",
            "nvidia", (LABELS,), empty_env="urfave"),
    Setting("pod-name", ("POD_NAME",), "", "str",
            "This pod's name (the downward API's metadata.name): the NodeFeature object is then owned by the "
            "pod's DaemonSet, and deleted with it.",
            "nvidia", (LABELS,), empty_env="urfave"),
    # --- config-manager: NVIDIA's flags -------------------------------------------------------------------
    Setting("oneshot", ("ONESHOT",), False, "bool",
            "check and update the config only once and then exit",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("kubeconfig", ("KUBECONFIG",), "", "str",
            "absolute path to the kubeconfig file (empty: the in-cluster config)",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("node-name", ("NODE_NAME",), "", "str",
            "the name of the node to watch for label changes on (required)",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("node-label", ("NODE_LABEL",), DEFAULT_NODE_LABEL, "str",
            "the name of the node label to use for selecting a config",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("config-file-srcdir", ("CONFIG_FILE_SRCDIR",), "", "str",
            "the path to the directory containing available device configuration files (required)",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("config-file-dst", ("CONFIG_FILE_DST",), "", "str",
            "the path to destination device configuration file (required)",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("default-config", ("DEFAULT_CONFIG",), "", "str",
            "the default config to use if no label is set",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("fallback-strategies", ("FALLBACK_STRATEGIES",), (), "list",
            "ordered list of fallback strategies to use to set a default config when none is provided: "
            "named (a file called `default`), single (the only file), empty (/dev/null: all defaults); "
            "comma-separated or repeated",
            "nvidia", (CONFIG_MANAGER,), repeatable=True),
    Setting("send-signal", ("SEND_SIGNAL",), True, "bool",
            "send a signal to <process-to-signal> once a config change is made",
            "nvidia", (CONFIG_MANAGER,)),
    Setting("signal", ("SIGNAL",), 1, "int",
            "the signal to send to <process-to-signal> if <send-signal> is set (1 = SIGHUP)",
            "nvidia", (CONFIG_MANAGER,), minimum=1, maximum=64),
    Setting("process-to-signal", ("PROCESS_TO_SIGNAL",), DEFAULT_PROCESS_TO_SIGNAL, "str",
            "the name of the process to signal if <send-signal> is set, matched against argv[0] (or its "
            "base name) of the processes in /proc; NVIDIA's `nvidia-device-plugin` works too when the "
            "plugin runs under that name",
            "nvidia", (CONFIG_MANAGER,)),
    # --- dra: NVIDIA's DRA driver flags (gpu-kubelet-plugin), same names, env vars and defaults ------------
    Setting("node-name", ("NODE_NAME",), "", "str",
            "The name of the node to be worked on (required; the downward API's spec.nodeName).",
            "nvidia", (DRA,)),
    Setting("cdi-root", ("CDI_ROOT",), Path("/etc/cdi"), "path",
            "Absolute path to the directory where CDI files will be generated.",
            "nvidia", (DRA,)),
    Setting("kubelet-registrar-directory-path", ("KUBELET_REGISTRAR_DIRECTORY_PATH",),
            Path("/var/lib/kubelet/plugins_registry"), "path",
            "Absolute path to the directory where kubelet stores plugin registrations.",
            "nvidia", (DRA,)),
    Setting("kubelet-plugins-directory-path", ("KUBELET_PLUGINS_DIRECTORY_PATH",),
            Path("/var/lib/kubelet/plugins"), "path",
            "Absolute path to the directory where kubelet stores plugin data.",
            "nvidia", (DRA,)),
    Setting("kubeconfig", ("KUBECONFIG",), "", "str",
            "Absolute path to a kubeconfig file; empty: the in-cluster config (the pod's service account).",
            "nvidia", (DRA,)),
    Setting("http-endpoint", ("HTTP_ENDPOINT",), "", "str",
            "The TCP address ([host]:port, e.g. :8080) to serve Prometheus metrics on; empty (the default) "
            "serves none.",
            "nvidia", (DRA,)),
    Setting("metrics-path", ("METRICS_PATH",), "/metrics", "str",
            "The HTTP path the metrics are served at.",
            "nvidia", (DRA,)),
    Setting("feature-gates", ("FEATURE_GATES",), "", "str",
            "NVIDIA's feature gates, a comma list of Name=bool (see the gates table); a gate kubegpu does "
            "not implement yet is refused at start.",
            "nvidia", (DRA,)),
    Setting("consumable-shares", ("CONSUMABLE_SHARES",), "disabled", "str",
            "disabled, memory, unlimited or a positive integer: how claims share a device (NVIDIA's "
            "request policy on `memory`, N `shares`); anything but disabled needs the ConsumableShares gate.",
            "nvidia", (DRA,)),
    Setting("nvidia-driver-root", ("NVIDIA_DRIVER_ROOT", "HOST_DRIVER_ROOT"), "/", "str",
            "Root of the driver installation on the host: the host paths of the CDI specs' files.",
            "nvidia", (DRA,), aliases=("--host_driver-root",)),
    Setting("container-driver-root", ("DRIVER_ROOT_CTR_PATH",), DEFAULT_CONTAINER_DRIVER_ROOT, "str",
            "Where the driver root is mounted in the driver's container: its libraries and nvidia-smi (time "
            "slices) are looked up there.",
            "nvidia", (DRA,)),
    Setting("nvidia-cdi-hook-path", ("NVIDIA_CDI_HOOK_PATH",), "", "str",
            f"Path on the host of nvidia-cdi-hook for the CDI specs' hooks; empty: {DEFAULT_HOOK_PATH}.",
            "nvidia", (DRA,)),
    Setting("additional-xids-to-ignore", ("ADDITIONAL_XIDS_TO_IGNORE",), "", "xids",
            "XIDs that taint nothing (comma list; malformed entries skipped), added to "
            "DP_DISABLE_HEALTHCHECKS's.",
            "nvidia", (DRA,)),
    Setting("namespace", ("NAMESPACE",), "default", "str",
            "Namespace of the MPS control-daemon Deployments (MPSSupport).",
            "nvidia", (DRA,)),
    # NVIDIA's flags that change nothing here: accepted, with a warning when given (`settings.dra_driver`).
    Setting("host-root", ("HOST_ROOT",), "/host-root", "str",
            "Host / in the container (PassthroughSupport); changes nothing here.",
            "nvidia", (DRA,)),
    Setting("image-name", ("IMAGE_NAME",), "", "str",
            "Image of the MPS control-daemon Deployments (this driver's image); required with MPSSupport.",
            "nvidia", (DRA,)),
    Setting("image-pull-secrets", ("IMAGE_PULL_SECRETS",), (), "list",
            "Pull secrets of the MPS control-daemon Deployments (comma list of secret names).",
            "nvidia", (DRA,)),
    Setting("image-pull-policy", ("IMAGE_PULL_POLICY",), "", "str",
            "Pull policy of the MPS control-daemon Deployments; empty: Kubernetes' default.",
            "nvidia", (DRA,)),
    Setting("service-account-name", ("SERVICE_ACCOUNT_NAME",), "", "str",
            "Service account of the MPS control-daemon Deployments; empty: the namespace's default.",
            "nvidia", (DRA,)),
    Setting("healthcheck-port", ("HEALTHCHECK_PORT",), -1, "int",
            "Port of NVIDIA's grpc.health.v1 server (<0: none); changes nothing here: probe the DRA socket "
            "or --http-endpoint.",
            "nvidia", (DRA,), maximum=65535),
    Setting("kube-api-qps", ("KUBE_API_QPS",), DEFAULT_KUBE_API_QPS, "float",
            "client-go's requests per second; changes nothing here (the Python client does not limit).",
            "nvidia", (DRA,)),
    Setting("kube-api-burst", ("KUBE_API_BURST",), DEFAULT_KUBE_API_BURST, "int",
            "client-go's burst; changes nothing here (the Python client does not limit).",
            "nvidia", (DRA,)),
    Setting("v", ("V",), 0, "int",
            "klog verbosity (NVIDIA's -v N: write --v N, kubegpu's -v is --verbose); changes nothing here.",
            "nvidia", (DRA,)),
    Setting("vmodule", ("VMODULE",), "", "str",
            "klog per-file verbosity; changes nothing here.",
            "nvidia", (DRA,)),
    Setting("logging-format", ("LOGGING_FORMAT",), "text", "str",
            "component-base log format (text or json); changes nothing here (kubegpu logs text).",
            "nvidia", (DRA,)),
    Setting("log-flush-frequency", ("LOG_FLUSH_FREQUENCY",), "5s", "str",
            "component-base log flush interval; changes nothing here (lines are written at once).",
            "nvidia", (DRA,)),
    Setting("log-text-split-stream", ("LOG_TEXT_SPLIT_STREAM",), False, "bool",
            "component-base (alpha): info to stdout, errors to stderr; changes nothing here.",
            "nvidia", (DRA,)),
    Setting("log-text-info-buffer-size", ("LOG_TEXT_INFO_BUFFER_SIZE",), "0", "str",
            "component-base (alpha); changes nothing here.",
            "nvidia", (DRA,)),
    Setting("log-json-split-stream", ("LOG_JSON_SPLIT_STREAM",), False, "bool",
            "component-base (alpha); changes nothing here.",
            "nvidia", (DRA,)),
    Setting("log-json-info-buffer-size", ("LOG_JSON_INFO_BUFFER_SIZE",), "0", "str",
            "component-base (alpha); changes nothing here.",
            "nvidia", (DRA,)),
    # --- dra: kubegpu's own -------------------------------------------------------------------------------
    Setting("driver-name", ("KUBEGPU_DRA_DRIVER_NAME",), "gpu.nvidia.com", "str",
            "The DRA driver name: ResourceSlices' spec.driver, the sockets' names, CEL's attribute domain "
            "and the taint keys.",
            "kubegpu", (DRA,)),
    Setting("gpus", ("KUBEGPU_DRA_GPUS",), "all", "str",
            "Which GPUs go to DRA: all, none, or GPU indices and UUIDs (comma list); leave the same GPUs "
            "out of the device plugin with its --dra-gpus.",
            "kubegpu", (DRA,)),
    _seconds("lock-timeout", "KUBEGPU_DRA_LOCK_TIMEOUT_SECONDS", 10.0,
             "Seconds Prepare/Unprepare wait for the node-wide lock another driver process holds (a "
             "rolling update) before failing the call; the kubelet retries.",
             (DRA,), positive=True, flag=False),
    _seconds("api-timeout", "KUBEGPU_DRA_API_TIMEOUT_SECONDS", 10.0,
             "Seconds one Prepare call waits for the API server to return its claims; a claim not read by "
             "then fails with that reason and the kubelet retries.",
             (DRA,), positive=True, flag=False),
    Setting("boot-id-file", ("KUBEGPU_DRA_BOOT_ID_FILE",), Path("/proc/sys/kernel/random/boot_id"), "path",
            "Where the node's boot ID is read (the checkpoint forgets claims prepared before a reboot).",
            "kubegpu", (DRA,), flag=False, hidden=True),
    # --- fake-nvml inject ---------------------------------------------------------------------------------
    Setting("state-dir", (FAKE_NVML_STATE_ENV,), None, "path",
            "The fake's state directory; must be the one the daemon uses.",
            "kubegpu", (FAKE_NVML_INJECT,)),
)  # fmt: skip


def for_command(command: str) -> tuple[Setting, ...]:
    """The settings `kubegpu <command>` takes, in declaration order (which is --help's order)."""
    return tuple(s for s in SETTINGS if command in s.commands)


def lookup(command: str, name: str) -> Setting:
    for setting in SETTINGS:
        if command in setting.commands and setting.name == name:
            return setting
    raise KeyError(f"{command} has no setting {name!r}")
