"""The SRE toolkit around the device plugin: `kubegpu lint`, `kubegpu explain`, `kubegpu doctor`.

Modules, one job each:
  (Kubernetes resource quantities live in kubegpu.common.quantity, shared with the DRA allocator)
  model          the API objects read (msgspec types; lite pods for the bulk of a snapshot)
  snapshot       a cluster snapshot from a file (`kubectl get ... -o json`); live.py from the API
  pod_requests   pod requests as kube-scheduler computes them; GPU resource names
  scheduling     the scheduler's filters and its FailedScheduling wording
  explain        why a pod is Pending; explain_fixes what would fix it, explain_report what is reported
  manifests      pod specs out of YAML/JSON files
  lint           the lint run; lint_rules the rules and findings, lint_containers and lint_cluster the checks
  cluster_facts  what lint and the cluster doctor need to know about a cluster
  doctor_cluster the cluster doctor (GPU nodes, GPU pods); doctor_plugin its device-plugin DaemonSet checks
  doctor_node    the node doctor (driver, NVML, device nodes); doctor_runtime (container toolkit, runtimes,
                 CDI) and doctor_kubelet (device-plugin directory, sockets) its other checks; host_tree
                 the host's paths under --host-root
  findings       the doctors' common finding type
  render, cli    rich tables and JSON; the click commands
"""
