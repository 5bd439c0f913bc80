"""`kubegpu config-manager`: per-node config selection, a drop-in for NVIDIA's config-manager (v0.20).

It watches its own Node's `nvidia.com/device-plugin.config` label, points the plugin's config file (a
symlink, `/config/config.yaml`) at the chosen file of the mounted ConfigMap, and signals the plugin so that
it reloads. Run as an init container with `ONESHOT=true` and as a sidecar that keeps watching.

Modules, from the inside out:

- `selection`: which file a label value selects (NVIDIA's rules, fallbacks and error texts); pure.
- `symlink`: points the destination at the selected file, atomically.
- `procsignal`: finds the process to signal by its argv[0] under /proc and signals it.
- `watch`: the Node's label as a stream of values, through the official `kubernetes` client.
- `manager`: settings and the loop tying the above together.
- `cli`: the click command.
- `errors`: the error type, and OS errors rendered the way NVIDIA's (Go) messages show them.
"""
