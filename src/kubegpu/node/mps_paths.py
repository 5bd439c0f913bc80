"""Where the MPS files live under an MPS root (NVIDIA's layout, byte for byte).

The host's `mpsRoot` (default /run/nvidia/mps) is mounted at /mps in both the MPS daemon's and the
plugin's containers, so both compute the same paths from the same resource name:

    <root>/<resource>/pipe      CUDA_MPS_PIPE_DIRECTORY (the plugin mounts it into every MPS container)
    <root>/<resource>/log       CUDA_MPS_LOG_DIRECTORY (control.log, server.log)
    <root>/<resource>/.started  this resource's daemon is up and its limits are set
    <root>/.ready               every daemon is up
    <root>/shm                  the tmpfs `mount-shm` mounts, the containers' /dev/shm
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kubegpu.settings.choices import MPS_CONTAINER_ROOT

CONTAINER_ROOT = Path(MPS_CONTAINER_ROOT)


@dataclass(frozen=True, slots=True)
class MpsRoot:
    path: Path = CONTAINER_ROOT

    def resource_dir(self, resource: str) -> Path:
        # The full name, domain included: /mps/nvidia.com/gpu/pipe, as NVIDIA's Allocate mounts it.
        return self.path / resource

    def pipe_dir(self, resource: str) -> Path:
        return self.resource_dir(resource) / "pipe"

    def log_dir(self, resource: str) -> Path:
        return self.resource_dir(resource) / "log"

    def started_file(self, resource: str) -> Path:
        return self.resource_dir(resource) / ".started"

    @property
    def ready_file(self) -> Path:
        return self.path / ".ready"

    @property
    def shm_dir(self) -> Path:
        return self.path / "shm"

    def control_env(self, resource: str) -> dict[str, str]:
        """What every nvidia-cuda-mps-control call for this resource needs to find its daemon."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(resource)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(resource)),
        }
