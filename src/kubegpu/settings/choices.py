"""NVIDIA's names for the plugin's choices and defaults (k8s-device-plugin v0.20), in one place.

Every layer validates against or defaults to these; they live at the bottom so that the settings can
check a value without importing the code that acts on it.
"""

from __future__ import annotations

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MIG_STRATEGIES = ("none", "single", "mixed")

CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", *CDI_STRATEGIES)
DEVICE_ID_STRATEGIES = ("uuid", "index")

DISTRIBUTED = "distributed"
PACKED = "packed"
SHARED_ALLOCATION_POLICIES = (DISTRIBUTED, PACKED)

DEFAULT_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_HOOK_PATH = "/usr/bin/nvidia-ctk"
DEFAULT_CONTAINER_DRIVER_ROOT = "/driver-root"

# GFD (gpu-feature-discovery)
DEFAULT_GFD_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_SLEEP_INTERVAL = 60 * 1_000_000_000  # nanoseconds

# config-manager: NVIDIA's label. The process to signal is ours; NVIDIA's `nvidia-device-plugin` works as well
# when the plugin runs under that name (a symlink to kubegpu, or an image that keeps NVIDIA's command).
DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_PROCESS_TO_SIGNAL = "kubegpu"

# Where the host's MPS root (--mps-root) is mounted in the plugin's and the MPS daemon's containers.
MPS_CONTAINER_ROOT = "/mps"

# kubegpu's paths
DEFAULT_CDI_ROOT = "/var/run/cdi"
DEFAULT_SYSFS_ROOT = "/sys"

# --device-discovery-strategy. The plugin accepts the first three, GFD also `vfio`. kubegpu discovers GPUs
# through NVML only: `auto` and `nvml` mean NVML; the others are accepted (a DaemonSet moved over from NVIDIA
# keeps starting) and `discovery_strategy_note` says once what kubegpu does instead.
AUTO_DISCOVERY = "auto"
DEVICE_DISCOVERY_STRATEGIES = (AUTO_DISCOVERY, "nvml", "tegra")
GFD_DEVICE_DISCOVERY_STRATEGIES = (*DEVICE_DISCOVERY_STRATEGIES, "vfio")
_NOT_NVML = {
    "tegra": "Tegra (Jetson, integrated GPUs) discovery through CUDA",
    "vfio": "discovery of GPUs bound to vfio-pci for passthrough (from sysfs)",
}


def discovery_strategy_note(strategy: str, consequence: str = "get no labels") -> str | None:
    """What kubegpu does for a --device-discovery-strategy NVIDIA accepts but kubegpu does not implement;
    None for `auto` and `nvml` (NVML, as NVIDIA's `auto` on a node with NVML). `consequence`: what happens to
    the GPUs NVML does not see, for this command."""
    what = _NOT_NVML.get(strategy)
    if what is None:
        return None
    return (
        f"--device-discovery-strategy={strategy} asks for {what}, which kubegpu does not implement: it "
        f"discovers GPUs through NVML as with nvml, so GPUs NVML does not see {consequence}; use auto or "
        "nvml to silence this"
    )


# --cdi-disable-hooks / --cdi-feature-flags: the names NVIDIA's CDI library (nvcdi, nvidia-container-toolkit)
# knows. kubegpu writes two of these hooks itself; it does not use nvcdi, so its feature flags change nothing.
ALL_HOOKS = "all"
KUBEGPU_CDI_HOOKS = ("create-symlinks", "update-ldcache")
NVIDIA_CDI_HOOKS = (ALL_HOOKS, *KUBEGPU_CDI_HOOKS, "enable-cuda-compat", "disable-device-node-modification")
NVIDIA_CDI_FEATURE_FLAGS = (
    "enable-explicit-driver-libraries",
    "disable-nvsandbox-utils",
    "enable-coherent-annotations",
)


def cdi_flag_notes(disabled_hooks: tuple[str, ...], feature_flags: tuple[str, ...]) -> list[str]:
    """What kubegpu says once about --cdi-disable-hooks and --cdi-feature-flags values it cannot act on."""
    notes = []
    unknown = [h for h in disabled_hooks if h not in NVIDIA_CDI_HOOKS]
    if unknown:
        notes.append(
            f"--cdi-disable-hooks: {', '.join(unknown)} is not a hook name NVIDIA's CDI library knows "
            f"({', '.join(NVIDIA_CDI_HOOKS)}); ignored, as NVIDIA ignores it"
        )
    if feature_flags:
        notes.append(
            f"--cdi-feature-flags={','.join(feature_flags)}: these switch features of NVIDIA's CDI library "
            "(nvcdi), which kubegpu does not use: its own CDI specs are unchanged; drop the flag to silence "
            "this"
        )
    return notes


# GFD's Kubernetes client flags (NodeFeature API output). A QPS of 0 and a burst of 0 mean client-go's
# defaults (these), a negative QPS no rate limit, as in client-go.
DEFAULT_GFD_NAMESPACE = "default"
DEFAULT_KUBE_API_QPS = 5.0
DEFAULT_KUBE_API_BURST = 10
