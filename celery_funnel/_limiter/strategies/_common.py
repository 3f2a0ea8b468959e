"""Validation and unit conversion shared by every strategy."""

from __future__ import annotations

import math

from ..errors import ConfigurationError
from ..rate import Rate

US = 1_000_000


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else ``ConfigurationError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_key(key: object) -> str:
    """A non-empty string key."""
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"key must be a non-empty string, got {key!r}")
    return key


def period_us(count: object, period: object) -> tuple[int, int]:
    """Validate ``count`` per ``period`` seconds; return (count, period in microseconds)."""
    rate = Rate(count, period)  # type: ignore[arg-type]
    return rate.count, round(rate.period * US)


def emission_us(count: object, period: object) -> int:
    """Microseconds per unit, rounded up so that the rate is never exceeded."""
    n, span = period_us(count, period)
    return -(-span // n)


def now_us(now: float | None) -> int | None:
    """Caller's clock (float seconds) in integer microseconds; None = server clock."""
    if now is None:
        return None
    if (
        isinstance(now, bool)
        or not isinstance(now, (int, float))
        or not math.isfinite(now)
        or now < 0
    ):
        raise ConfigurationError(f"now must be a non-negative number of seconds, got {now!r}")
    return round(now * US)


def seconds(us: int) -> float:
    """Microseconds to float seconds; -1 (none) stays -1.0."""
    return -1.0 if us == -1 else us / US
