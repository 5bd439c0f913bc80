"""The DRA fixtures of test_dra.py (a temporary root, the simulated API server, the fake drivers), shared
with the other DRA tests of the simulator."""

from tests.kubeletsim.test_dra import api, drivers, root

__all__ = ["api", "drivers", "root"]
