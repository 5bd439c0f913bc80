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
