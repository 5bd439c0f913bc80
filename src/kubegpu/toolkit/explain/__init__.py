"""`kubegpu explain`: why a GPU pod is Pending, and what would let it schedule.

run     the scheduler's filters on every node and the counterfactual questions per node
dra     the scheduler's DynamicResources filter for pods with DRA claims (on `resourceapi`)
fixes   what would fix it; report what is reported
"""
