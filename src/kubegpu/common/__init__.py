"""Small helpers every layer may use (the bottom of the import graph, beside `settings`).

Owns: atomic file replacement (`files`). Imports nothing else of kubegpu.
"""
