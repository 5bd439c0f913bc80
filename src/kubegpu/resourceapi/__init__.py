"""resource.k8s.io (DRA) objects as the scheduler reads them, CEL device selectors, and a structured
allocator: what tests, the demo and `kubegpu explain` use to see which device a claim gets and why not.

Modules, one job each:
  cel        DRA's CEL environment on cel-python: compile selectors, evaluate them on one device
Imports only kubegpu.common and third-party libraries.
"""
