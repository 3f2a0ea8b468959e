"""The periodic summary: while tasks wait on a funnel, each worker logs one INFO line per
funnel every ``funnel_log_summary_every`` seconds (60 by default; 0: never), so that a
worker log shows why nothing runs even where no single wait is long:

    celery-funnel: funnel tasks.call_api: 12 held and 3 republished in this worker,
    40 parked; the next due at 04:01:02 UTC

Held and republished count this worker's tasks (``_celery.waiting``); parked counts
the funnel's parked tasks in the funnels' Redis (one read a period, parking on). A
``SummaryStep`` (a consumer bootstep, after the gate) runs it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from .._celery.loop import Loop, LoopStep
from .._celery.releaser import park_store
from .._celery.waiting import waiting
from .._config.runtime import runtime_for

__all__ = ["Summary", "SummaryStep", "summary_lines"]

logger = logging.getLogger("celery_funnel")


def summary_lines(rows: Iterable[Mapping[str, Any]], parked: Mapping[str, int]) -> list[str]:
    """One line per funnel with tasks waiting: ``rows`` as ``celery inspect
    funnel_waiting`` lists them (a row whose funnel is not known names its task),
    ``parked``: parked tasks by funnel label."""
    counts: dict[str, dict[str, int]] = {}
    first: dict[str, datetime] = {}
    for row in rows:
        label = row["funnel"] or row["name"]
        by_how = counts.setdefault(label, {})
        by_how[row["how"]] = by_how.get(row["how"], 0) + 1
        eta = _utc(row["eta"]) if row["eta"] else None
        if eta is not None and (label not in first or eta < first[label]):
            first[label] = eta
    for label, count in parked.items():
        counts.setdefault(label, {})["parked"] = count
    return [_line(label, counts[label], first.get(label)) for label in sorted(counts)]


def _line(label: str, by_how: Mapping[str, int], eta: datetime | None) -> str:
    here = [f"{by_how[how]} {how}" for how in ("held", "republished") if by_how.get(how)]
    parts = [" and ".join(here) + " in this worker"] if here else []
    if by_how.get("parked"):
        parts.append(f"{by_how['parked']} parked")
    due = f"; the next due at {eta:%H:%M:%S} UTC" if eta else ""
    return f"celery-funnel: funnel {label}: {', '.join(parts)}{due}"


def _utc(eta: str) -> datetime:
    at = datetime.fromisoformat(eta)
    return at.astimezone(timezone.utc) if at.tzinfo is not None else at


class Summary(Loop):
    """Logs ``summary_lines`` every ``every`` seconds (the first after ``every``), from
    ``rows()`` and ``parked()``."""

    name = "celery-funnel-summary"

    def __init__(
        self,
        every: float,
        rows: Callable[[], list[dict[str, Any]]],
        parked: Callable[[], Mapping[str, int]],
    ) -> None:
        super().__init__()
        self.every, self.rows, self.parked = every, rows, parked
        self._first = True

    def tick(self) -> float:
        if self._first:  # nothing to say yet: the first line comes a period in
            self._first = False
            return self.every
        for line in summary_lines(self.rows(), self.parked()):
            logger.info(line)
        return self.every

    def failed(self, error: Exception) -> None:
        logger.debug("celery-funnel: the waiting summary failed: %s", error)


class SummaryStep(LoopStep):
    """Consumer bootstep: runs a ``Summary`` while the consumer runs (unless
    ``funnel_log_summary_every`` is 0)."""

    label = "celery-funnel summary"

    def make(self, consumer: Any) -> Summary | None:
        every = runtime_for(consumer.app).settings.log_summary_every
        if not every:
            return None
        store = park_store(consumer.app)
        return Summary(
            every, lambda: waiting(consumer), store.counts if store is not None else dict
        )
