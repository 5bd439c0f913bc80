"""Log lines that any client can provoke, at a bounded rate.

Whoever reaches the plugin's socket decides how often a refused request happens; one log line per refusal
lets a tight loop of bad requests fill the node's disk and bury the lines that matter. `LogThrottle` lets
`burst` lines per key through in each `interval_s`, counts the rest, and says how many it held back on the
next line it lets through. The counts themselves belong in metrics, which see every request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Window:
    started: float
    logged: int = 0
    held_back: int = 0


class LogThrottle:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_s: float = 60.0,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0 or burst < 1:
            raise ValueError(f"a log throttle needs interval_s > 0 and burst >= 1, got {interval_s}, {burst}")
        self._logger = logger
        self._interval = interval_s
        self._burst = burst
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def log(self, level: int, key: str, msg: str, *args: object, stacklevel: int = 1) -> bool:
        """Log `msg % args` at `level` unless `key` used up its lines for this interval; True when logged.

        `key` names a kind of message chosen by the caller (never client text: each key holds a counter).
        `stacklevel` as for `logging.Logger.log`, counted from the caller of this method.
        """
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self._interval:
            held_back = window.held_back if window is not None else 0
            window = self._windows[key] = _Window(now, held_back=held_back)
        if window.logged >= self._burst:
            window.held_back += 1
            return False
        if window.held_back:
            msg += " (%d more like this not logged since the previous one)"
            args = (*args, window.held_back)
            window.held_back = 0
        window.logged += 1
        self._logger.log(level, msg, *args, stacklevel=stacklevel + 1)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args, stacklevel=2)
