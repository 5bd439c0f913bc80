"""Small helpers every layer may use (the bottom of the import graph, beside `settings`).

Owns: atomic file replacement (`files`), directories with explicit modes (`dirs`), Kubernetes'
extended-resource-name rule (`k8s_names`), Kubernetes resource quantities parsed exactly as apimachinery
parses them (`quantity`), capped exponential back-off with jitter (`backoff`), client text made safe for
logs and error messages (`quoting`), log lines at a bounded rate (`log_throttle`).
Imports nothing else of kubegpu.
"""
