"""`python -m kubegpu.mps`: the same commands as `kubegpu mps-daemon`, without the top-level CLI."""

from kubegpu.mps.cli import mps_daemon

mps_daemon(prog_name="kubegpu mps-daemon")
