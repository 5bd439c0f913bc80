"""`kubegpu doctor`: the node doctor and the cluster doctor.

node       the node doctor (driver, NVML, device nodes); runtime (container toolkit, runtimes, CDI) and
           kubelet (device-plugin directory, sockets) its other checks; host_tree the host's paths under
           --host-root
cluster    the cluster doctor (GPU nodes, GPU pods); plugin its device-plugin DaemonSet checks
preflight  whether a workload would schedule on the cluster, before it is applied
findings   the doctors' common finding type
"""
