"""Small helpers every layer may use (the bottom of the import graph, beside `settings`).

Owns: atomic file replacement (`files`), Kubernetes' extended-resource-name rule (`k8s_names`), capped
exponential back-off with jitter (`backoff`),
Kubernetes resource quantities parsed exactly as apimachinery parses them (`quantity`).
Imports nothing else of kubegpu.
"""
