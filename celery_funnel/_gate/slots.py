"""The concurrency slots a run needs (``Slots``): take them all before the run reaches the
pool, or make it wait: parked as a waiter (queued in arrival order, published again by
the run that frees a slot) where tasks may be parked, else held and tried again; or, when
the funnels' Redis fails, the outage policy."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .._config.runtime import Runtime
from .._limiter.errors import BackendError
from .._stores.leases import Lease
from .arrival import Arrival
from .judge import Ruling
from .judge import _outage as outage_step
from .parking import Parking
from .slot_funnels import WAIT_SECONDS, SlotFunnels
from .waits import Waits

__all__ = ["POLL_SECONDS", "Slots"]

logger = logging.getLogger("celery_funnel")

# how often a task waiting for a slot in the worker (nothing parked) tries again
POLL_SECONDS = 0.5

Admit = Callable[[Arrival, "Lease | None"], Any]  # run it (what the gate returns)
Fail = Callable[[Any, BaseException, bool], Any]  # fail the request (reported or not)


class Slots:
    """The slots of the worker gate's runs: ``admit`` runs a request, ``fail`` fails it."""

    def __init__(
        self, runtime: Runtime, slot_funnels: SlotFunnels, parking: Parking, waits: Waits,
        admit: Admit, fail: Fail,
    ) -> None:  # fmt: skip
        self.runtime, self.slot_funnels, self.parking, self.waits = (
            runtime,
            slot_funnels,
            parking,
            waits,
        )
        self.admit, self.fail = admit, fail

    def take(self, arrival: Arrival) -> tuple[Lease | None, Any]:
        """The lease of every slot ``arrival`` needs, or (None, what the gate returns)
        when it waits: parked, held, run or failed by the outage policy.

        Raises:
            Exception: what computing a key raised (the gate fails the task).
        """
        try:
            lease = self.slot_funnels.take(arrival.request, arrival.slot_funnels)
        except BackendError as error:
            return None, self._outage(arrival, error)
        if lease is None:
            self._wait(arrival)
        return lease, None

    def _label(self, arrival: Arrival) -> str:
        return "+".join(slot_funnel.label for slot_funnel in arrival.slot_funnels)

    def _outage(self, arrival: Arrival, error: BackendError) -> Any:
        """The funnels' Redis failed taking a slot: the outage policy decides (run
        now, unlimited; fail; or hold for a back-off and try again)."""
        label = self._label(arrival)
        step = outage_step(self.runtime, arrival.subject, arrival.state, error, label)
        if step.run:
            return self.admit(arrival, None)
        if step.error is not None:
            return self.fail(arrival.request, step.error, True)
        return self.waits.wait(arrival, step)

    def _wait(self, arrival: Arrival) -> None:
        """No slot: park the task with no release time and queue it; the run that frees
        a slot hands it over and publishes it (``leases``). Where nothing may be parked
        (``_stores.persistence``), the task waits in the worker (or the broker, past what
        it may hold) and tries again every ``POLL_SECONDS``."""
        state, request = arrival.state, arrival.request
        after = state._replace(deferrals=state.deferrals + 1)
        if not self.parking.on:
            self.waits.wait(arrival, Ruling(run=False, delay=POLL_SECONDS, state=after))
            return
        label = self._label(arrival)
        step = Ruling(run=False, delay=WAIT_SECONDS, state=after)
        self.waits.report(arrival, step._replace(delay=0.0), label, how="parked")
        if not self.waits.park(arrival, step, label):
            return  # held, to try again shortly
        try:
            self.slot_funnels.queue(request, arrival.slot_funnels, arrival.subject.rank or 0)
        except BackendError as error:  # parked but not queued: released within the hour
            logger.warning(
                "celery-funnel: task %s[%s] parked for a slot, but not queued (%r): it is"
                " checked again in %.0f s", request.name, request.id, error, WAIT_SECONDS,
            )  # fmt: skip
