"""Settings shared by the whole test suite."""

from __future__ import annotations

from hypothesis import settings

# `make mutate` (scripts/mutate.py) runs the tests with --hypothesis-profile=mutation: every mutant must
# meet the same examples (a verdict that changed from run to run would say nothing), and the per-example
# deadline would fail a slow clean run on a loaded machine rather than a mutant.
settings.register_profile("mutation", derandomize=True, deadline=None, database=None)
