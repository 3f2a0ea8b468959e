"""The gate's side of fair-share funnels (``_limiter.fair``): the gate's admission and the
queueing of a refused task; the dispatcher each worker's releaser runs is
``_celery.dispatch``'.

A task on a fair funnel is decided on that funnel first, alone (``fair_admit.lua``):
admitted when nothing waits and the funnel has room, or when the dispatcher booked it a
slot that is due; else it is parked with no release time (``SAFETY_SECONDS``, a net
should its queue entry be lost; a little while until it has joined: ``Parking.park``)
and joins its tenant's queue. The dispatcher books the
funnel's next free slots (``_celery.dispatch.HORIZON_SECONDS`` ahead at most) for the
waiting tasks in weighted round-robin order, and makes their parked entries due at their slots: the
releaser publishes them, and the gate admits each at its slot without charging again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._limiter.fair import Fair, weight_of
from .._limiter.limit import Limit, Verdict, select_part
from .._limiter.strategies.gcra import shape
from .._limiter.strategies.reservation import DEFAULT_EARLY_SECONDS
from .._stores.fair import FairStore
from .charges import Charge

__all__ = ["ENLIST_SECONDS", "FUNNELS", "Queues", "admit", "fair_charge", "fair_of", "shape_of"]


US = 1_000_000
SAFETY_SECONDS = 3600.0  # a queued task is released then if no dispatcher booked it
FUNNELS = 100  # fair funnels served per pass (and enlisted per worker, at most)
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
    """For an admission that ``queued`` the task: its fair charge, and whether it goes in
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
    """The gate's admission of a fair charge: run, wait for its booked slot, or queue. Its
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
    funnel from one worker, which ``_celery.dispatch.DELIST_AFTER_SECONDS`` allows for)."""

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
