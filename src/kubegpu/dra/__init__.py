"""The DRA driver daemon (`kubegpu dra`): the node's GPUs through Dynamic Resource Allocation, as a drop-in
for NVIDIA's DRA driver (gpu.nvidia.com).

Owns the devices as NVIDIA names and describes them (`devices`), the daemon around them, and its own light
client for the few API calls it makes (`kubeapi`): the official `kubernetes` client never loads here. May
import `settings`, `common`, `node`, `allocation`, `api`, `resourceapi` and `cli`; never the device plugin,
the tools, `apisim` or `kubeletsim`: the tools and tests reach it only as a process.
"""
