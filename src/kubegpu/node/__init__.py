"""The node: what GPUs it has and what state they are in.

Owns the snapshot types (`inventory`), the NVML binding and its fake (`nvml/`), discovery from NVML into an
`Inventory` (`discovery`), the driver's files and device nodes (`driverfiles`), the XID rules and catalog
(`xids`), the GPU health thread with its recovery probes (`health`), the faults it records, which outlive
it (`faults`), and the MPS control daemons' layout and liveness check (`mps_paths`, `mps_control`).

May import `settings` and `common`. Never imports the allocation core, the plugin daemon or grpc.
"""
