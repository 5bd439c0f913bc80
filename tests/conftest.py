"""Settings shared by the whole test suite."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st

# `make mutate` (scripts/mutate.py) runs the tests with --hypothesis-profile=mutation: every mutant must
# meet the same examples (a verdict that changed from run to run would say nothing), and the per-example
# deadline would fail a slow clean run on a loaded machine rather than a mutant.
settings.register_profile("mutation", derandomize=True, deadline=None, database=None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build Hypothesis' one-time tables before any test runs, so that no property test is charged for them.

    Hypothesis builds them lazily inside the first draw that needs each, and counts that as the drawing
    test's generation time: the characters text() may use (every code point that encodes as UTF-8, and the
    Unicode categories; 1.5 s on an idle machine without a .hypothesis cache, 5-7 s on a loaded one), and
    the literals of every local module, which it draws now and then since Hypothesis 6.131 (1 s warm, 3 s
    cold). Whichever property test drew first could fail the too_slow health check for work that was not
    its strategy's (test_gpuconfig's sharing-block property did, under load). After collection every test
    module and what it imports is loaded: built here, each test's draws measure its own strategy again."""
    if not any(getattr(getattr(item, "obj", None), "is_hypothesis_test", False) for item in session.items):
        return
    st.text().validate()  # the character tables (cached on disk in .hypothesis/unicode_data)
    try:
        from hypothesis.internal.conjecture.providers import _get_local_constants
    except ImportError:  # a Hypothesis without the scan (or with it moved): nothing to read ahead
        return
    _get_local_constants()
