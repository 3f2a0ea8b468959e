"""``Rate``: how many units per how many seconds, parsed from strings like ``"30/m"``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import ConfigurationError

__all__ = ["Rate"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# "30/m", "10/s", "5/2.5s", "100/15m": an integer count over an optional
# multiplier and a unit letter.
_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*((?:\d+(?:\.\d*)?|\.\d+)?)\s*([smhd])\s*$")
# Periods are held as integer microseconds in Redis; beyond this a Lua double
# would no longer add a microsecond exactly.
MAX_PERIOD_SECONDS = 10.0 * 365 * 86400


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` units per ``period`` seconds.

    Raises:
        ConfigurationError: when ``count`` is not a positive integer, ``period`` is
            not a positive, finite number of seconds (at most ten years), or the rate
            is faster than one unit per microsecond.
    """

    count: int
    period: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigurationError(f"rate count must be a positive integer, got {self.count!r}")
        if (
            isinstance(self.period, bool)
            or not isinstance(self.period, (int, float))
            or not math.isfinite(self.period)
            or self.period <= 0
            or self.period > MAX_PERIOD_SECONDS
        ):
            raise ConfigurationError(
                f"rate period must be a positive number of seconds, got {self.period!r}"
            )
        if round(self.period * 1_000_000) < 1:
            raise ConfigurationError(
                f"rate period must be at least 1 microsecond, got {self.period!r}"
            )
        if self.count > round(self.period * 1_000_000):
            # one unit per microsecond is the maths' resolution: a faster rate would
            # silently run at that one instead
            raise ConfigurationError(
                f"rate {self.count} per {self.period:g} s is faster than one unit per"
                f" microsecond, the funnel's resolution"
            )
        object.__setattr__(self, "period", float(self.period))

    @classmethod
    def parse(cls, text: str | Rate) -> Rate:
        """Parse ``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/d"`` or ``"N/<float>s"`` (also
        ``"N/<float>m"`` and so on) into a ``Rate``; a ``Rate`` is returned as is.

        Raises:
            ConfigurationError: naming the value when it is not such a string, or when
                its count is zero.
        """
        if isinstance(text, Rate):
            return text
        if not isinstance(text, str):
            raise ConfigurationError(f"rate must be a string like '30/m', got {text!r}")
        match = _PATTERN.match(text)
        if match is None:
            raise ConfigurationError(
                f"invalid rate {text!r}: expected 'N/s', 'N/m', 'N/h', 'N/d' or 'N/<seconds>s'"
            )
        count_text, multiplier_text, unit = match.groups()
        multiplier = float(multiplier_text) if multiplier_text else 1.0
        try:
            return cls(int(count_text), multiplier * _UNITS[unit])
        except ConfigurationError as exc:
            raise ConfigurationError(f"invalid rate {text!r}: {exc}") from None

    @property
    def per_second(self) -> float:
        """Units per second, as a float (for display; the maths never uses it)."""
        return self.count / self.period

    def __str__(self) -> str:
        """The shortest form ``parse`` reads back: ``"30/m"``, ``"5/2.5s"``."""
        for unit, seconds in _UNITS.items():
            if self.period == seconds:
                return f"{self.count}/{unit}"
        # microseconds are the maths' resolution; never an exponent
        return f"{self.count}/{self.period:.6f}".rstrip("0").rstrip(".") + "s"
