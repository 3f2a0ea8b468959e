"""``Rate``: how many units per how many seconds, read as Celery reads ``rate_limit``:
``"30/m"``, ``"0.5/s"``, ``"5"`` and ``5`` (per second)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from .errors import ConfigurationError

__all__ = ["Rate"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits: int() would take others
# "30/m", "0.5/s", "5/2.5s", "100/15m", or a bare count ("5": per second, as Celery):
# a count over an optional multiplier and a unit letter.
_PATTERN = re.compile(rf"^\s*({_NUMBER})\s*(?:/\s*({_NUMBER})?\s*([smhd]))?\s*$")
_FORMS = "'N' (per second), 'N/s', 'N/m', 'N/h', 'N/d' or 'N/<seconds>s', N like 5 or 0.5"
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
    def parse(cls, text: str | int | float | Rate) -> Rate:
        """Read a rate as Celery reads ``rate_limit``: ``"N/s"``, ``"N/m"``, ``"N/h"``,
        ``"N/d"``, ``"N/<float>s"`` (also ``"N/<float>m"`` and so on), or ``"N"`` and a
        number ``N`` (per second); ``N`` may be a fraction (``"0.5/s"``, ``"1.5/m"``).
        A fractional count is kept exact as a whole count over a longer period:
        ``"0.5/s"`` is 1 per 2 s, ``"1.5/m"`` 3 per 120 s. A ``Rate`` is returned as is.

        Raises:
            ConfigurationError: naming the value when it is not such a rate, or when
                its count is zero.
        """
        if isinstance(text, Rate):
            return text
        count, period = _fractions(text)
        try:
            if count <= 0:
                raise ConfigurationError(f"rate count must be positive, got {count}")
            # a count of p/q per period is p per q periods: both whole, nothing rounded
            period *= count.denominator
            if period > MAX_PERIOD_SECONDS:  # before float(), which would overflow
                raise ConfigurationError("rate period must be at most ten years")
            return cls(count.numerator, float(period))
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


def _fractions(value: object) -> tuple[Fraction, Fraction]:
    """A rate's count and period (seconds), exact, from a string or a number."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigurationError(f"rate must be a string like '30/m' or a number, got {value!r}")
    if not isinstance(value, str):
        if not math.isfinite(value):
            raise ConfigurationError(f"invalid rate {value!r}: expected a finite number")
        # str() of a float is its shortest decimal: 0.1 reads as 1/10, not as the
        # binary fraction nearest it
        return Fraction(str(value)), Fraction(1)
    match = _PATTERN.match(value)
    if match is None:
        raise ConfigurationError(f"invalid rate {value!r}: expected {_FORMS}")
    count_text, multiplier_text, unit = match.groups()
    multiplier = Fraction(multiplier_text) if multiplier_text else Fraction(1)
    return Fraction(count_text), multiplier * _UNITS[unit or "s"]
