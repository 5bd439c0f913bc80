"""Click parameter types the commands share.

click's FLOAT takes "nan", "inf" and "1e309" (infinity), and a FloatRange lets them through: NaN compares
false with every bound. A duration or count of seconds must be a finite number.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses NaN and the infinities, saying so in one line."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{value!r} is not a finite number; give a plain number of seconds, such as 30", param, ctx
            )
        return super().convert(number, param, ctx)
