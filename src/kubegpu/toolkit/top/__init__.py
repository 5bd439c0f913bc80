"""`kubegpu top` and `kubectl gpu top`: the cluster's GPUs from the device plugins' /metrics.

sources  the metrics through the API server's pod proxy, or from Prometheus; the pending GPU pods
model    rows per GPU and holder, idle filter and the fragmentation summary (pure)
cli      the click command and its table and JSON
"""
