"""The DRA driver daemon (`kubegpu dra`): the node's GPUs through Dynamic Resource Allocation, as a drop-in
for NVIDIA's DRA driver (gpu.nvidia.com).

Owns the devices as NVIDIA names and describes them (`devices`), and the daemon around them. May import
`settings`, `common`, `node`, `allocation`, `api`, `resourceapi` and `cli`; never the device plugin, the
tools, `apisim` or `kubeletsim`: the tools and tests reach it only as a process.
"""
