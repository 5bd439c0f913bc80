"""MPS sharing: the control-daemon manager (`kubegpu mps-daemon`) and the plugin's liveness check.

NVIDIA ships this as a separate binary and DaemonSet (`mps-control-daemon`); kubegpu ships it as a
subcommand of the same image. The plugin side only needs `mps_daemon_alive`, so importing this package
stays cheap: the manager, discovery and click live in submodules imported on demand.
"""

from kubegpu.mps.control import mps_daemon_alive
from kubegpu.mps.paths import CONTAINER_ROOT, MpsRoot

__all__ = ["CONTAINER_ROOT", "MpsRoot", "mps_daemon_alive"]
