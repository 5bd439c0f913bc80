"""The SRE toolkit around the device plugin: `kubegpu lint`, `kubegpu explain`, `kubegpu doctor`.

One subpackage per command, with what they share beside them (the `top` command gets its own, too):
  doctor/        the node and cluster doctors (see its __init__)
  lint/          the lint run and its rules
  explain/       why a pod is Pending and what would fix it
Shared:
  (Kubernetes resource quantities live in kubegpu.common.quantity, shared with the DRA allocator)
  model          the API objects read (msgspec types; lite pods for the bulk of a snapshot)
  snapshot       a cluster snapshot from a file (`kubectl get ... -o json`); live.py from the API
  pod_requests   pod requests as kube-scheduler computes them; GPU resource names
  scheduling     the scheduler's filters and its FailedScheduling wording
  manifests      pod specs out of YAML/JSON files
  cluster_facts  what lint and the cluster doctor need to know about a cluster
  dra_facts      what NVIDIA's DRA driver publishes
  render, cli    rich tables and JSON; the click commands (kubectl_plugin: `kubectl gpu`)
"""
