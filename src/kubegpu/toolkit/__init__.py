"""The SRE toolkit around the device plugin: `kubegpu lint`, `kubegpu explain`, `kubegpu doctor`.

Modules, one job each:
  quantity       Kubernetes resource quantities, parsed exactly as apimachinery does
  model          the API objects read (msgspec types; lite pods for the bulk of a snapshot)
  snapshot       a cluster snapshot from a file (`kubectl get ... -o json`); live.py from the API
  resources      pod requests as kube-scheduler computes them; GPU resource names
  scheduling     the scheduler's filters and its FailedScheduling wording
  explain        why a pod is Pending and what would fix it
  manifests      pod specs out of YAML/JSON files; lint.py the rules over them
  cluster_facts  what lint needs to know about a cluster
  doctor_cluster / doctor_node   the two doctors; findings.py their common finding type
  render, cli    rich tables and JSON; the click commands
"""
