"""Counting task starts: what the demo, the examples, the tests and the benchmarks check
a limit with."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["peak"]


def peak(starts: Iterable[float], window: float = 1.0) -> int:
    """The most starts (epoch seconds) in any ``window`` seconds."""
    ordered, best, first = sorted(starts), 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] >= window:
            first += 1
        best = max(best, last - first + 1)
    return best
