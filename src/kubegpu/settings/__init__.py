"""Settings: NVIDIA's v1 config file, every flag and env var, their precedence and validation.

Owns NVIDIA's names for choices and defaults (`choices`); the one table of every flag and env var of
every command (`setting`: the `Setting` type, `table`: the declarations), read and validated once at start
(`given`, `values`) into typed values (`env`: the daemon's env settings and NVML selection); Go-compatible
value parsing (`goparse`, `goduration`); the config file's schema and parsing (`nvidia_config`,
`nvidia_sharing`); NVIDIA's precedence (`flags`) and the merged, validated plugin settings (`plugin`); the
start-up report and the README tables generated from the table (`report`, `docs`); a kubeconfig's checks
(`kubeconfig`) and the API access it or a pod's service account gives (`kubeaccess`).

The bottom of the import graph: imports nothing of kubegpu but `common`. Everything else reads settings
from here; nothing else parses a flag, an env var or the config file.
"""
