"""The fair-share dispatcher (``Dispatcher``), a service each worker's releaser runs
(``_celery.releaser``, composed by ``_celery.services``): it books the next free slots
of every fair funnel with waiting tasks (``HORIZON_SECONDS`` ahead at most) for them in
weighted round-robin order, and makes their parked entries due at their slots; the
gate's side of fair funnels is ``_shared.fair``."""

from __future__ import annotations

import logging

from .._limiter.errors import BackendError
from .._shared.fair import FUNNELS
from .._stores.fair import FairStore

__all__ = [
    "BATCH",
    "DELIST_AFTER_SECONDS",
    "DISPATCH_PAUSE_SECONDS",
    "HORIZON_SECONDS",
    "Dispatcher",
]

logger = logging.getLogger("celery_funnel")

HORIZON_SECONDS = 0.25  # slots booked ahead: a newly waiting tenant waits this much more
DISPATCH_PAUSE_SECONDS = 0.05  # the longest pause between passes while tasks wait
BATCH = 200  # tasks booked per funnel per pass
DELIST_AFTER_SECONDS = 10.0  # a funnel seen empty is forgotten when no task joined since


class Dispatcher:
    """Hands the free slots of every fair funnel with waiting tasks to them (one pass
    per ``tick``); any number of workers may run one at once: each script call is atomic."""

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
