"""`python -m kubegpu.labels`: the same command as `kubegpu labels`."""

from kubegpu.labels.cli import labels

labels(prog_name="kubegpu labels")
