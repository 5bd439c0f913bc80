"""Benchmarks (design.md section 4): each runs alone as `python -m bench.<name>`; `run_all` runs them all."""

import os

# grpc core logs every GOAWAY of a restarted peer at INFO; the benchmarks restart peers on purpose. This runs
# before any benchmark imports grpc, and children inherit it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
