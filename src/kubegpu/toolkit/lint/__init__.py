"""`kubegpu lint`: GPU mistakes in pod specs, found before they reach the cluster.

run           the lint run
rules         the rules and their findings; containers the per-container checks, workload the workload's
              pod counts, cluster the snapshot rules, dra the rules for DRA claims, templates, classes and
              the pods that use them, with dra_capacity (capacity requests against request policies) and
              dra_profiles (pinned MIG profiles against those a node can create)
apierrors     the API server's own words for what it refuses
plugin_config the one fact lint needs from the device plugin's config file
"""
