"""Settings: NVIDIA's v1 config file, every flag and env var, their precedence and validation.

Owns NVIDIA's names for choices and defaults (`choices`), Go-compatible value parsing (`goparse`,
`goduration`), the config file's schema and parsing (`nvidia_config`, `nvidia_sharing`), the plugin's flag
table and precedence (`flags`) and the merged, validated settings the daemon runs with (`plugin`).

The bottom of the import graph: imports nothing of kubegpu but `common`. Everything else reads settings
from here; nothing else parses a flag, an env var or the config file.
"""
