"""What live operation keeps for one app in one worker (``Live``): the overrides table
and the adaptive rates (``_shared.adaptive``) the gate decides with, and the decisions
counted for the dashboard. The live thread (``_ops.live``) keeps the tables fresh
and writes the counts.

Each pass of that thread, one pipeline: reads the overrides and adaptive hashes and
the parked counts; adds the admitted/refused decisions counted in memory since the last
pass to the per-minute series (``<prefix>{~live}#series:<minute>``: field
``<funnel>|<second>|a`` or ``|r``,
expiring after an hour), and records how many tasks this worker holds per funnel
(``<prefix>{~live}#workers``: node -> JSON). When a funnel stops being paused (resumed,
unset, or its pause expired), its parked tasks are made due at once; when its rate or
capacity changed, its GCRA funnels are rebased first (``control.rebase``). Either way,
the tasks this worker holds for it decide again at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._config.waiting import WaitPolicy
from .._limiter.keys import live_key
from .adaptive import AdaptiveTable
from .charges import Charge
from .judge import Ruling
from .overrides import OverrideTable
from .state import State

__all__ = ["Live", "live_for", "series_key"]

logger = logging.getLogger("celery_funnel")

ATTRIBUTE = "_celery_funnel_live"
REFRESH_SECONDS = 0.5  # overrides apply within this (plus a decision) on every worker
# while a funnel is paused: its resume is taken up, and its parked tasks released, sooner
PAUSED_REFRESH_SECONDS = 0.15
SERIES_KEEP_SECONDS = 3600.0 + 120.0  # an hour of per-second counts, and a margin


def series_key(prefix: str, minute: int) -> str:
    """The hash of the counts of minute ``minute`` (epoch seconds // 60)."""
    return live_key(prefix, f"series:{minute}")


class Live:
    """What live operation keeps for one app in one worker: the ``overrides`` table the
    gate decides with, the ``adaptive`` rates below their max, and the decisions
    counted since the live thread's last pass."""

    def __init__(self) -> None:
        self.overrides = OverrideTable()
        self.adaptive = AdaptiveTable()
        self._counts: Counter[tuple[str, int, str]] = Counter()
        self._lock = threading.Lock()

    def count(self, labels: Iterable[str], admitted: bool) -> None:
        """One decision over the funnels ``labels``: admitted, or refused (deferred,
        paused or failed)."""
        second, kind = int(time.time()), "a" if admitted else "r"
        with self._lock:
            for label in labels:
                self._counts[(label, second, kind)] += 1

    def paused_ruling(
        self, charges: Sequence[Charge], state: State, *, parked: Callable[[], bool]
    ) -> Ruling | None:
        """The wait of a task of a paused funnel (None: none of ``charges`` is paused),
        as long as the wait policy says (``WaitPolicy.paused``; ``parked()``: whether
        parking is on, asked only here)."""
        if self.overrides.paused(charges) is None:
            return None
        delay = WaitPolicy.paused(parking=parked())
        return Ruling(run=False, delay=delay, state=state._replace(deferrals=state.deferrals + 1))

    def apply(self, charges: Sequence[Charge]) -> Sequence[Charge]:
        """``charges`` under the overrides, then the adaptive rates, in force."""
        return self.adaptive.apply(self.overrides.apply(charges))

    def take(self) -> Counter[tuple[str, int, str]]:
        """The counts so far, forgotten here (the live thread writes them)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def keep(self, counts: Counter[tuple[str, int, str]]) -> None:
        """Counts a failed pass could not write: written with the next one."""
        with self._lock:
            self._counts.update(counts)


def live_for(app: Any) -> Live:
    """The app's ``Live`` in this process, created on first call."""
    live: Live | None = app.__dict__.get(ATTRIBUTE)
    if live is None:
        live = Live()
        setattr(app, ATTRIBUTE, live)
    return live
