"""`kubegpu config check`: what a node would advertise with a config, every warning and every error.

Runs the daemon's own code path (settings precedence and validation, discovery, `build_resources`) without
serving anything. May import `settings`, `node`, `allocation`, `cli`; never the plugin daemon.
"""
