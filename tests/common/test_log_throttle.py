"""The log throttle on an injected clock: bursts, held-back counts, independent keys."""

from __future__ import annotations

import logging

import pytest

from kubegpu.common.log_throttle import LogThrottle
from tests.common.test_backoff import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_one_line_per_interval_then_the_count_of_the_rest(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    throttle = LogThrottle(logging.getLogger("t"), interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="t"):
        assert throttle.warning("bad", "bad body %d", 1)
        for i in range(2, 1001):
            clock.now += 0.01
            assert not throttle.warning("bad", "bad body %d", i)
        clock.now = 60.0
        assert throttle.warning("bad", "bad body %d", 1001)
        clock.now = 120.0
        assert throttle.warning("bad", "bad body %d", 1002)
    assert messages(caplog) == [
        "bad body 1",
        "bad body 1001 (999 more like this not logged since the previous one)",
        "bad body 1002",
    ]


def test_burst_and_separate_keys(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    throttle = LogThrottle(logging.getLogger("t"), interval_s=10, burst=2, clock=clock)
    with caplog.at_level(logging.INFO, logger="t"):
        logged = [throttle.log(logging.INFO, "a", "a%d", i) for i in range(4)]
        logged += [throttle.log(logging.INFO, "b", "b%d", i) for i in range(3)]
        clock.now = 10.0
        logged.append(throttle.log(logging.INFO, "a", "a%d", 4))
    assert logged == [True, True, False, False, True, True, False, True]
    held_back = "a4 (2 more like this not logged since the previous one)"
    assert messages(caplog) == ["a0", "a1", "b0", "b1", held_back]
    assert all(r.levelno == logging.INFO for r in caplog.records)


@pytest.mark.parametrize(("interval", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_nonsense_limits_are_refused(interval: float, burst: int) -> None:
    with pytest.raises(ValueError, match="interval_s > 0 and burst >= 1"):
        LogThrottle(logging.getLogger("t"), interval_s=interval, burst=burst)
