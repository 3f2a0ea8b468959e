"""The worker's side of fair-share funnels (``_fair``): the gate's step, the queueing
of a refused task, and the dispatcher each worker's releaser runs.

A task on a fair funnel is decided on that funnel first, alone (``fair_admit.lua``):
admitted when nothing waits and the funnel has room, or when the dispatcher booked it a
slot that is due; else it is parked with no release time (``SAFETY_SECONDS``, a net
should its queue entry be lost) and joins its tenant's queue. The dispatcher books the
funnel's next free slots (``HORIZON_SECONDS`` ahead at most) for the waiting tasks in
weighted round-robin order, and makes their parked entries due at their slots: the
releaser publishes them, and the gate admits each at its slot without charging again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._limiter.errors import BackendError
from .._limiter.fair import Fair, weight_of
from .._limiter.limit import Limit, Verdict, select_part
from .._limiter.strategies.gcra import shape
from .._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from .._stores.fair import FairStore
from .charging import Charge

__all__ = ["Dispatcher", "Queues", "admit", "fair_charge", "fair_of", "shape_of"]

logger = logging.getLogger("celery_funnel")

US = 1_000_000
SAFETY_SECONDS = 3600.0  # a queued task is released then if no dispatcher booked it
HORIZON_SECONDS = 0.25  # slots booked ahead: a newly waiting tenant waits this much more
DISPATCH_PAUSE_SECONDS = 0.05  # the longest pause between passes while tasks wait
BATCH = 200  # tasks booked per funnel per pass
FUNNELS = 100  # fair funnels served per pass
DELIST_AFTER_SECONDS = 10.0  # a funnel seen empty is forgotten when no task joined since
ENLIST_SECONDS = 1.0  # a worker tells the dispatchers at most this often per funnel


def fair_of(limit: Limit, run: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Fair | None:
    """The tenant and weight of one run on ``limit`` (None: not a fair funnel).

    Raises:
        Exception: what a ``funnel_fair_by`` or ``funnel_weights`` callable raises, and
            ``ConfigurationError`` for a bad weight.
    """
    if limit.fair_by is None:
        return None
    tenant = select_part(limit.fair_by, run, args, kwargs)
    return Fair(tenant, weight_of(limit.weights, tenant))


def fair_charge(charges: Sequence[Charge], queued: int) -> tuple[Charge, bool] | None:
    """For a step that ``queued`` the task: its fair charge, and whether it goes in
    front of its tenant's queue (it missed its slot); else None."""
    if not queued:
        return None
    return next(c for c in charges if c.fair is not None), queued == 2


def shape_of(charge: Charge) -> tuple[int, int, int]:
    """(T, increment, tau) of a fair charge, integer µs (as ``reserve.lua`` has them)."""
    limit = charge.limit
    _, t, tau = shape(limit.capacity - 1, limit.rate.count, limit.rate.period)
    return t, t * max(charge.cost, 1), tau


def admit(store: FairStore, task_id: str, charge: Charge, stale: int) -> Verdict:
    """The gate's step on a fair charge: run, wait for its booked slot, or queue. Its
    ticket is honoured up to one slot's width late, doubled each time it came too late
    (``stale``), as the gate's own bookings are.

    Raises:
        BackendError: when Redis fails.
    """
    assert charge.fair is not None
    _, inc, tau = shape_of(charge)
    early = min(inc, round(DEFAULT_EARLY_SECONDS * US))
    grace = (early, inc * 2 ** min(stale, 10))
    status, delay = store.admit(charge.key, task_id, (inc, tau), grace, charge.fair.tenant)
    if status == 0:
        return Verdict(run=True)
    if status == 1:
        return Verdict(run=False, delay=delay / US, booked=True)
    if status == 3:
        return Verdict(run=False, delay=-1.0, never=True)
    return Verdict(run=False, queued=1 + delay, stale=delay == 1)


class Queues:
    """A worker's side of the waiting queues: puts parked tasks in them, and tells the
    dispatchers which funnels have waiting tasks (at most every ``ENLIST_SECONDS`` per
    funnel from one worker, which ``DELIST_AFTER_SECONDS`` allows for)."""

    def __init__(self, store: FairStore) -> None:
        self.store = store
        self._enlisted: dict[str, float] = {}

    def queue(self, charge: Charge, task_id: str, rank: int, front: bool) -> None:
        """Put a parked task into its tenant's queue; ``rank``: its priority rank (the
        broker's order, 0 first: ``_limiter.fair.rank``).

        Raises:
            BackendError: when Redis fails.
        """
        assert charge.fair is not None
        t, _, tau = shape_of(charge)
        order = (rank, front)
        self.store.enqueue(charge.key, task_id, charge.fair, order, max(charge.cost, 1), (t, tau))
        now = time.monotonic()
        if now - self._enlisted.get(charge.key, -ENLIST_SECONDS) >= ENLIST_SECONDS:
            self.store.enlist(charge.key)
            if len(self._enlisted) > FUNNELS:  # bounded: many funnels, one cache
                self._enlisted.clear()
            self._enlisted[charge.key] = now


class Dispatcher:
    """Hands the free slots of every fair funnel with waiting tasks to them (one pass
    per ``tick``); any number of workers may run one at once: each step is atomic."""

    def __init__(self, store: FairStore, late: float = 10.0) -> None:
        self.store, self.late = store, late
        self._offset = 0  # more than FUNNELS funnels are served in turns

    def tick(self) -> float | None:
        """One pass; how long to pause before the next (None: no funnel waits)."""
        funnels = self.store.enlisted(FUNNELS, self._offset)
        if not funnels and self._offset:
            self._offset = 0
            funnels = self.store.enlisted(FUNNELS)
        self._offset = self._offset + FUNNELS if len(funnels) == FUNNELS else 0
        for key in funnels:
            self._serve(key)
        return DISPATCH_PAUSE_SECONDS if funnels else None

    def _serve(self, key: str) -> None:
        try:
            popped = self.store.pop(key, HORIZON_SECONDS, BATCH, self.late)
        except BackendError as error:  # one funnel failing does not stop the others
            logger.info("celery-funnel: dispatching fair funnel %s failed: %s", key, error)
            return
        if popped.slots:
            gone = self.store.due(popped.slots)
            if gone:
                logger.info(
                    "celery-funnel: %d slot(s) of fair funnel %s unused: their tasks no"
                    " longer wait parked (purged or released)", len(gone), key,
                )  # fmt: skip
        if popped.tenants == 0:
            self.store.delist(key, DELIST_AFTER_SECONDS)
