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
