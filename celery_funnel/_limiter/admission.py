"""What one call does at a full funnel (``on_limit``): the one atomic call of
``Funnel.limit`` (``guard``), the same on every store.

``"wait"`` on a GCRA funnel books the call's slot (``reserve``: the funnel's TAT moves
for it at once, so waiters start in the order they booked) and sleeps until it; a window
strategy cannot book, so it sleeps until ``retry_after`` and decides again. ``"raise"``
raises ``Limited``; ``"skip"`` skips the call.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn

from . import strategies
from .errors import CostTooHighError, Limited
from .limit import Limit

__all__ = ["GO", "ON_LIMIT", "SKIP", "Admission", "Rule"]

ON_LIMIT = ("wait", "raise", "skip")


class Admission(NamedTuple):
    """One decision's outcome: run (after sleeping ``wait`` seconds), or not at all
    (skip); ``again``: after the sleep, decide again instead of running."""

    go: bool
    wait: float = 0.0
    again: bool = False


GO = Admission(True)
SKIP = Admission(False)


class Rule:
    """A limit and what its calls do at a full funnel (checked by ``guard``)."""

    def __init__(self, limit: Limit, on_limit: str, max_wait: float | None) -> None:
        self.limit, self.on_limit, self.max_wait = limit, on_limit, max_wait
        self.strategy = strategies.get(limit.strategy)

    def decide(self, key: str, cost: int, waited: float, store: Any) -> Admission:
        """One atomic decision on ``store`` for a call of ``cost`` units on ``key``
        after ``waited`` seconds of waiting already."""
        limit = self.limit
        if cost == 0:
            return GO
        if self.on_limit == "wait" and self.strategy.reserve is not None:  # GCRA: book
            r = store.reserve(
                key, limit.capacity - 1, limit.rate.count, limit.rate.period, cost,
                max_wait=self.max_wait,
            )  # fmt: skip
            if r.admitted or r.booked:
                return Admission(True, r.delay)
            return self.refused(key, cost, r.delay)
        d = self.strategy.decide(store, key, limit, cost)
        if d.allowed:
            return GO
        if self.on_limit == "skip" and d.retry_after >= 0:
            return SKIP
        if self.on_limit == "raise" or d.retry_after < 0:
            return self.refused(key, cost, d.retry_after)
        # a window strategy cannot book: sleep until the request would fit, and ask again
        if self.max_wait is not None and waited + d.retry_after > self.max_wait:
            return self.refused(key, cost, d.retry_after)
        return Admission(False, d.retry_after, again=True)

    def refused(self, key: str, cost: int, retry_after: float) -> NoReturn:
        """Refuse the call.

        Raises:
            Limited: carrying ``retry_after`` (seconds) and the funnel's key.
            CostTooHighError: when ``retry_after`` is -1: the cost can never fit.
        """
        if retry_after < 0:
            raise CostTooHighError(
                f"a call costing {cost} can never fit funnel {key!r}"
                f" ({self.limit.rate}, capacity {self.limit.capacity})"
            )
        raise Limited(retry_after, key)
