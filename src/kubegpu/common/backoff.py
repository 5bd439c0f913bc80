"""Capped exponential back-off with jitter: the one helper behind every retry loop.

Each failure waits longer than the last (times `factor`, up to `maximum`); `reset()` after a success starts
over at `initial`. Jitter multiplies each wait by a factor drawn from `jitter` (then capped at `maximum`),
so a fleet of nodes that lost the same peer at once does not come back in step. With `reset_after`, a
failure after that long without one also starts over, for loops where a success does not prove much (a
list that works followed by a watch that fails at once would otherwise retry in a tight loop).

The clock and the random source are injectable, so tests can pin every delay.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float  # seconds before the first retry
    maximum: float  # no wait is longer, jitter included
    factor: float = 2.0
    jitter: tuple[float, float] = (1.0, 1.0)  # each wait is multiplied by uniform(low, high)
    reset_after: float | None = None  # a failure this long after the previous one starts over
    clock: Callable[[], float] = time.monotonic
    uniform: Callable[[float, float], float] = random.uniform
    _base: float = field(default=0.0, init=False)  # the next wait before jitter; 0: start over
    _last: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        low, high = self.jitter
        if not 0 < self.initial <= self.maximum or self.factor < 1 or not 0 < low <= high:
            raise ValueError(
                f"back-off needs 0 < initial <= maximum, factor >= 1 and 0 < jitter low <= high; got "
                f"initial={self.initial}, maximum={self.maximum}, factor={self.factor}, jitter={self.jitter}"
            )

    def next_delay(self) -> float:
        """The wait before the next attempt, after a failure; each call waits longer, up to `maximum`."""
        now = self.clock()
        if self.reset_after is not None and self._last is not None and now - self._last > self.reset_after:
            self._base = 0.0
        self._last = now
        base = self._base or self.initial
        self._base = min(base * self.factor, self.maximum)
        return min(base * self.uniform(*self.jitter), self.maximum)

    def reset(self) -> None:
        """A success: the next failure waits `initial` again."""
        self._base = 0.0
        self._last = None
