"""The pure allocation core: from an `Inventory` and settings to what the kubelet sees and what a container
gets.

Owns the resources and their device IDs (`resources`: MIG strategies, replicas, names), request validation
and Allocate responses for every device-list strategy (`allocate`), GetPreferredAllocation (`preferred`),
CDI spec building (`cdi`), and the mapping from settings to the options above (`from_settings`).

May import `settings`, `common`, `node.inventory` and `node.driverfiles`. Never imports grpc, an NVML
binding or asyncio: everything here is a function of plain data (plus the driver files it looks up), so
most of it is tested without sockets or NVML.
"""
