"""The device plugin daemon (`kubegpu plugin`): one asyncio loop serving the allocation core to the kubelet.

Owns the lifecycle and reloads (`daemon`), the candidate a change is prepared as (`prepare`), what is served
and the plan applied to it (`serving`), the health thread as a task (`health_watch`), the HTTP side wired only
with a port (`endpoints`), which calls run at once (`admission`), the pure plan a reload applies
(`reconcile`), restarts of background tasks
(`supervise`), one DevicePlugin gRPC service per resource (`server`, with its method table `rpc_table` and its
bounds `serving_limits`), registration with the current kubelet (`registrar`), Prometheus metrics (`metrics`),
the optional /healthz, /readyz and /metrics endpoint (`http_endpoint`), the PodResources client
(`podresources_client`), config-file watching (`filewatch`), the CDI spec files (`cdi_files`) and the command
(`cli`).

May import every layer below it (`allocation`, `node`, `settings`, `common`, `api`, `cli`). No tool imports
this package: the tools reach the daemon only as a process.
"""
