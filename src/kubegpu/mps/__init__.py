"""MPS sharing: the control-daemon manager (`kubegpu mps-daemon`).

NVIDIA ships this as a separate binary and DaemonSet (`mps-control-daemon`); kubegpu ships it as a
subcommand of the same image. What the plugin shares with it (the MPS root's layout and the liveness
check) lives in `kubegpu.node.mps_paths` and `kubegpu.node.mps_control`, so the plugin never imports this
package.
"""
