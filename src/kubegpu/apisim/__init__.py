"""A simulated Kubernetes API server for tests, benchmarks and `kubegpu demo`: real HTTP on 127.0.0.1,
real JSON, the real server's semantics and error texts, so the official `kubernetes` client (and any
other) talks to it as to a cluster.

Modules, one job each:
  server         ApiServerSim: lifecycle, a Python API for tests, the request log
  calls          ApiCall (a recorded request) and Fault (what the server does to requests on purpose)
  http_handler   the HTTP handler: reads, records and routes each request; faults; Status errors
  verbs          GET, LIST, CREATE, UPDATE, PATCH, DELETE (and on a collection) on a resource
  watch          WATCH streams: history from a resourceVersion, BOOKMARKs, 410 Gone, selector enter/leave
  kinds          the served resources (Nodes, resource.k8s.io, NFD NodeFeatures) and their discovery data
  routes         REST paths to (kind, version, namespace, name, subresource)
  discovery      /api, /apis, /apis/<group>[/<version>], /version documents
  store          objects, resourceVersions, history, finalizers, owner-reference garbage collection
  convert        resource.k8s.io v1 <-> v1beta2 <-> v1beta1
  patch          merge and strategic-merge patches
  pod_proxy      GET on pods/proxy, forwarded to the pod's port
  selectors      label and field selectors
  validation     the API's validation for what DRA drivers and claim authors trip over
  partitionable  partitionable devices and consumable capacity: their validation, their gated fields
  names          the API's rules for names (DNS labels, subdomains, qualified IDs) and their texts
  errors         Status bodies and field errors with the real texts
Imports kubegpu.common and kubegpu.resourceapi (for CEL compilation, as the real server validates
selectors), nothing else of kubegpu.
"""

from .errors import ApiError, FieldError
from .kinds import (
    DEVICE_CLASSES,
    NODE_FEATURES,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    RESOURCE_VERSIONS,
    ResourceKind,
)
from .server import ApiCall, ApiServerSim, Fault

__all__ = [
    "DEVICE_CLASSES",
    "NODES",
    "NODE_FEATURES",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "RESOURCE_VERSIONS",
    "ApiCall",
    "ApiError",
    "ApiServerSim",
    "Fault",
    "FieldError",
    "ResourceKind",
]
