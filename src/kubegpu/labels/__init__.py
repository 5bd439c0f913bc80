"""GPU node labels: a reimplementation of NVIDIA GPU Feature Discovery (GFD, k8s-device-plugin v0.20).

Modules, each with one job:
- `settings`: GFD's flags, env vars and config keys, merged CLI > env > file > default;
- `sharing`: the sharing config as GFD's labels see it (adapter over the untyped `sharing` section);
- `facts` / `vgpu`: what the labels need beyond the Inventory (MIG attributes, PCI class, fabric, vGPU);
- `naming`, `resources`, `compute`: the label rules themselves, pure functions of inventory and facts;
- `node`: one labelling pass (NVML session, discovery, facts, labels);
- `nodefeature` (with `kubeapi`): the node's NodeFeature object through the API server, GFD's default;
- `output`: the features.d file (atomic) or stdout;
- `loop`: oneshot / interval / infinite, signals; `cli`: the `kubegpu labels` command.
"""
