"""The back-off helper, deterministically: the clock and the random source are injected."""

from __future__ import annotations

import random

import pytest

from kubegpu.common.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def no_jitter(low: float, high: float) -> float:
    return 1.0


def test_doubles_up_to_the_cap() -> None:
    backoff = Backoff(initial=1.0, maximum=10.0, uniform=no_jitter)
    assert [backoff.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_factor() -> None:
    backoff = Backoff(initial=0.5, maximum=100.0, factor=3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.5, 4.5, 13.5, 40.5]


def test_no_jitter_by_default() -> None:
    backoff = Backoff(initial=0.1, maximum=5.0)
    assert [backoff.next_delay() for _ in range(8)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])


def test_jitter_draws_from_its_range_and_never_passes_the_cap() -> None:
    drawn: list[tuple[float, float]] = []

    def highest(low: float, high: float) -> float:
        drawn.append((low, high))
        return high

    backoff = Backoff(initial=1.0, maximum=5.0, jitter=(0.5, 1.5), uniform=highest)
    assert [backoff.next_delay() for _ in range(5)] == [1.5, 3.0, 5.0, 5.0, 5.0]
    assert drawn == [(0.5, 1.5)] * 5


def test_jitter_low_end() -> None:
    backoff = Backoff(initial=1.0, maximum=5.0, jitter=(0.5, 1.5), uniform=lambda low, high: low)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 2.5, 2.5]


def test_jitter_from_a_seeded_random_source_is_within_bounds() -> None:
    rng = random.Random(7)
    backoff = Backoff(initial=1.0, maximum=8.0, jitter=(0.8, 1.2), uniform=rng.uniform)
    bases = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for base in bases:
        delay = backoff.next_delay()
        assert base * 0.8 <= delay <= min(base * 1.2, 8.0)


def test_reset_starts_over() -> None:
    backoff = Backoff(initial=1.0, maximum=10.0)
    for _ in range(4):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0
    assert backoff.next_delay() == 2.0


def test_reset_after_a_quiet_spell() -> None:
    clock = Clock()
    backoff = Backoff(initial=1.0, maximum=10.0, reset_after=60.0, clock=clock)
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    clock.now = 60.0  # exactly the quiet spell: not over it yet
    assert backoff.next_delay() == 8.0
    clock.now = 120.5
    assert backoff.next_delay() == 1.0
    clock.now = 121.0
    assert backoff.next_delay() == 2.0


def test_without_reset_after_time_does_not_reset() -> None:
    clock = Clock()
    backoff = Backoff(initial=1.0, maximum=10.0, clock=clock)
    backoff.next_delay()
    clock.now = 1e9
    assert backoff.next_delay() == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0.0, "maximum": 1.0},
        {"initial": 2.0, "maximum": 1.0},
        {"initial": 1.0, "maximum": 2.0, "factor": 0.5},
        {"initial": 1.0, "maximum": 2.0, "jitter": (1.2, 0.8)},
        {"initial": 1.0, "maximum": 2.0, "jitter": (0.0, 1.0)},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="back-off needs"):
        Backoff(**kwargs)  # type: ignore[arg-type]
